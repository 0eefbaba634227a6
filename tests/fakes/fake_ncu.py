"""A stand-in for ncu, for the CPU tests of perfscope.ncu and perfscope.profiling.

Behaviour is chosen by FAKE_NCU_SCENARIO: ok, perm, crash, nomatch, hang, garbage,
wrong (stage mode: the first stage is WRONG). Profiling writes a copy of a real fixture
report (FAKE_NCU_REPORT) holding as many launches as there are jobs; --import answers
the raw CSV page with an NVTX column, and launch filters with a copy of the report.
Every argv it receives is appended to FAKE_NCU_LOG.
"""

import json
import os
import shutil
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
        if verdict == "ok":
            print(f'==PROF== Profiling "kernel_{i}": 0%....50%....100% - 38 passes')
            profiled.append(stem)
        print(f"perfscope-runner: {stem} {verdict}")
    if scenario == "garbage":
        out.write_bytes(b"not a report at all")
        return 0
    if profiled:
        shutil.copyfile(os.environ["FAKE_NCU_REPORT"], out)
        # Keyed by the name the report gets once perfscope renames the .part file.
        final = Path(str(out).replace(".part.ncu-rep", ".ncu-rep"))
        final.with_suffix(".stems").write_text(json.dumps(profiled))
    return 1 if scenario == "crash" else 0


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
            print(f'"{i}","1","1  ""<default domain>:{stem}:none:none:none:none:none:none"" ",'
                  f'"kernel_{i}","100"')
        return 0
    out = Path(argv[argv.index("--export") + 1])
    shutil.copyfile(src, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
