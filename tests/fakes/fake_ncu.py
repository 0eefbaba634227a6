"""A stand-in for ncu, for the CPU tests of perfscope.ncu and perfscope.profiling.

Behaviour is chosen by FAKE_NCU_SCENARIO: ok, perm, crash, nomatch, hang, garbage,
wrong (stage mode: the first stage is WRONG), fault (a program's second kernel faults
while it is replayed: the report holds both launches, ncu says which one died) and
interrupt (the first kernel is profiled and written, then ncu waits to be stopped, as
when the user presses Ctrl-C). Profiling writes a copy of a real fixture report
(FAKE_NCU_REPORT; FAKE_NCU_STAGE_REPORT instead for perfscope's runner, when set);
with FAKE_NCU_RUN set, a program's command is run first, as ncu would run it, and with
FAKE_NCU_MAPS a file of capture lines stands for the tensor-map library's in stage mode;
--import answers the raw CSV page with an NVTX column, and launch filters with a copy of
the report. Every argv it receives is appended to FAKE_NCU_LOG.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv):
    with open(os.environ["FAKE_NCU_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    scenario = os.environ.get("FAKE_NCU_SCENARIO", "ok")
    if argv == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 1)")
        return 0
    if "--import" in argv:
        return imported(argv)
    out = Path(argv[argv.index("--export") + 1])
    command = argv[argv.index("--export") + 2:]
    jobs = read_jobs(command)
    print("==PROF== Connected to process 1 (python)")
    if scenario == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
              "GPU Performance Counters on the target device 0.")
        return 1
    if scenario == "hang":
        time.sleep(60)
        return 0
    if scenario == "nomatch":
        print("==WARNING== No kernels were profiled.")
        return 0
    stems = [j["stem"] for j in jobs] if jobs else ["program"]
    staging = Path(command[-1]) if jobs else None
    source = os.environ.get("FAKE_NCU_STAGE_REPORT") if jobs else None
    source = source or os.environ["FAKE_NCU_REPORT"]
    if scenario == "fault" and not jobs:
        print('==PROF== Profiling "good_kernel": 0%....50%....100% - 38 passes')
        print('==PROF== Profiling "bad_kernel": 0%....50%.')
        print("==ERROR== An error was reported by the driver: CUDA_ERROR_ILLEGAL_ADDRESS")
        print("==ERROR== The application returned an error code (1).")
        shutil.copyfile(source, out)
        return 1
    if scenario == "interrupt":
        return interrupted(out, stems, staging, source)
    if not jobs and os.environ.get("FAKE_NCU_RUN"):
        # Run the program as ncu would (the wrapper perfscope hands it included).
        subprocess.run(command, check=False)
    if jobs and os.environ.get("FAKE_NCU_MAPS") and command[:2] == ["/bin/sh", "-c"]:
        # The runner cannot run here: write what the capture library would have written.
        shutil.copyfile(os.environ["FAKE_NCU_MAPS"], command[4])
    profiled = []
    for i, stem in enumerate(stems):
        verdict = "WRONG" if scenario == "wrong" and i == 0 else "ok"
        if scenario == "crash" and i == 1:
            # The runner dies inside this stage: no manifest, no verdict line.
            print("==ERROR== The application returned an error code (1).")
            print("==ERROR== An error was reported by the driver: CUDA_ERROR_ILLEGAL_ADDRESS")
            break
        if staging is not None:
            (staging / f"{stem}.json").write_text(json.dumps({"verification": {"verdict": verdict}}))
        if verdict == "ok" and (not jobs or selected(argv, stem)):
            print(f'==PROF== Profiling "kernel_{i}": 0%....50%....100% - 38 passes')
            profiled.append(stem)
        print(f"perfscope-runner: {stem} {verdict}")
    if scenario == "garbage":
        out.write_bytes(b"not a report at all")
        return 0
    if profiled:
        shutil.copyfile(source, out)
        write_stems(out, profiled)
    return 1 if scenario == "crash" else 0


def range_of(stem):
    """The NVTX range perfscope's runner pushes for a stem (perfscope.runner.nvtx_range)."""
    return stem.replace("@", "+")


def selected(argv, stem):
    """Whether ncu's --nvtx-include filters let the stem's launch through, read as ncu reads
    them: "domain@range/" names a domain, so an expression with '@' matches no launch of
    the default domain."""
    exprs = [argv[i + 1] for i, a in enumerate(argv) if a == "--nvtx-include"]
    if not exprs:
        return True
    return any("@" not in e and e.rstrip("/") == range_of(stem) for e in exprs)


def write_stems(out, profiled):
    # Keyed by the names the report gets once perfscope renames the .part file.
    for tag in (".ncu-rep", ".interrupted.ncu-rep"):
        Path(str(out).replace(".part.ncu-rep", tag)).with_suffix(".stems").write_text(json.dumps(profiled))


def interrupted(out, stems, staging, source):
    """Profile the first kernel, write it, then wait for the SIGINT a Ctrl-C sends."""
    # ncu handles SIGINT itself. Python does not when it starts with SIGINT ignored, as
    # every command a non-interactive shell puts in the background does (`pytest &`), and
    # that disposition is inherited: without this the fake would sleep through perfscope's
    # SIGINT until it is killed 20 s later.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if staging is not None:
        (staging / f"{stems[0]}.json").write_text(json.dumps({"verification": {"verdict": "ok"}}))
    shutil.copyfile(source, out)
    write_stems(out, stems[:1])
    print('==PROF== Profiling "kernel_0": 0%....50%....100% - 38 passes', flush=True)
    print(f"perfscope-runner: {stems[0]} ok", flush=True)
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("==PROF== Received signal, ending the profiling session.", flush=True)
        return 130
    return 0


def read_jobs(command):
    if "perfscope.runner" in command:
        return json.loads(Path(command[command.index("perfscope.runner") + 1]).read_text())
    return []


def imported(argv):
    src = Path(argv[argv.index("--import") + 1])
    if "--page" in argv:
        stems = json.loads(src.with_suffix(".stems").read_text())
        print('"ID","Process ID","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:'
              'Msg_Type:Msg","Kernel Name","gpu__time_duration.sum"')
        print('"","","","","ns"')
        for i, stem in enumerate(stems):
            print(f'"{i}","1","1  ""<default domain>:{range_of(stem)}:none:none:none:none:none:none"" ",'
                  f'"kernel_{i}","100"')
        return 0
    out = Path(argv[argv.index("--export") + 1])
    shutil.copyfile(src, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
