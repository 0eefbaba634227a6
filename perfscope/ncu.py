"""Nsight Compute's command line: find it, build its argv, run it, say why it failed.

``build_argv`` is pure: one frozen ``NcuOptions`` in, the exact argv out, so a unit test
can assert every flag. ``run`` streams ncu's output, feeds its pass counter to a
progress callback, and turns a failure into a PerfscopeError that quotes ncu's own
``==ERROR==`` lines. The report is written under a temporary name and renamed only once
ncu has finished, so an interrupted run never leaves a half-written report under the
final name: on Ctrl-C, ncu is asked to stop, and what it had written is handed to the
caller as ``NcuInterrupted.run.report`` (``<name>.interrupted.ncu-rep``) to keep or split.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfscope.collection import EXTRA_METRICS, SECTIONS
from perfscope.errors import PerfscopeError

log = logging.getLogger(__name__)

MIN_VERSION = (2023, 1)          # NVTX include filters, source counters, the raw page
REPLAY_MODES = ("kernel", "application", "range", "app-range")
CACHE_CONTROLS = ("all", "none")
CLOCK_CONTROLS = ("none", "base")
# Passthrough arguments that would take the report's name or fate out of perfscope's hands.
RESERVED_ARGS = ("-o", "--export", "-f", "--force-overwrite", "--import", "-i")
# After Ctrl-C: seconds ncu gets to stop by itself (a terminal's Ctrl-C reaches it too, and
# a second SIGINT could cut its report short), then to wind down on our SIGINT, before kill.
STOP_SELF_S = 3.0
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class NcuOptions:
    """Everything that decides ncu's command line (the program to profile aside)."""

    output: Path | None = None                     # report path, with or without .ncu-rep
    sections: tuple[str, ...] = SECTIONS
    metrics: tuple[str, ...] = EXTRA_METRICS
    full_set: bool = False                         # --set full instead of the sections
    nvtx_include: tuple[str, ...] = ()             # NVTX filter expressions
    kernel_regex: str | None = None
    launch_skip: int = 0
    launch_count: int | None = None
    replay_mode: str = "kernel"
    cache_control: str = "all"
    clock_control: str = "none"                    # the card as found; never lock by default
    import_source: bool = True
    extra: tuple[str, ...] = field(default=())     # passed through verbatim, last

    def __post_init__(self) -> None:
        for name, value, allowed in (("replay mode", self.replay_mode, REPLAY_MODES),
                                     ("cache control", self.cache_control, CACHE_CONTROLS),
                                     ("clock control", self.clock_control, CLOCK_CONTROLS)):
            if value not in allowed:
                raise PerfscopeError(f"{name} {value!r} is not one of {', '.join(allowed)}.")
        if self.launch_skip < 0 or (self.launch_count is not None and self.launch_count < 1):
            raise PerfscopeError("launch skip must be >= 0 and launch count >= 1.")
        reserved = [a for a in self.extra if a.split("=", 1)[0] in RESERVED_ARGS]
        if reserved:
            raise PerfscopeError(f"--ncu-arg {reserved[0]} is perfscope's to set: the report's path "
                                 "is --out, and an earlier capture is never overwritten.")


def build_argv(ncu: str, opts: NcuOptions, command: Sequence[str]) -> list[str]:
    """The exact ncu argv for opts, profiling command."""
    if not command:
        raise PerfscopeError("no program to profile was given.")
    if opts.output is None:
        raise PerfscopeError("ncu needs a report path to write (NcuOptions.output).")
    argv = [ncu, "--target-processes", "all", "--replay-mode", opts.replay_mode,
            "--cache-control", opts.cache_control, "--clock-control", opts.clock_control]
    if opts.full_set:
        argv += ["--set", "full"]
    else:
        for section in opts.sections:
            argv += ["--section", section]
    if opts.metrics:
        argv += ["--metrics", ",".join(opts.metrics)]
    if opts.import_source:
        argv += ["--import-source", "yes"]
    if opts.nvtx_include:
        argv.append("--nvtx")
        for expr in opts.nvtx_include:
            argv += ["--nvtx-include", expr]
    if opts.kernel_regex:
        argv += ["--kernel-name", f"regex:{opts.kernel_regex}"]
    if opts.launch_skip:
        argv += ["--launch-skip", str(opts.launch_skip)]
    if opts.launch_count is not None:
        argv += ["--launch-count", str(opts.launch_count)]
    argv += ["--force-overwrite", "--export", str(opts.output), *opts.extra, *command]
    return argv


# ------------------------------------------------------------------------ locating ncu


def find_ncu(env: dict[str, str] | None = None) -> str:
    """PERFSCOPE_NCU, then PATH, then CUDA_HOME/bin, then /opt/nvidia/nsight-compute/*."""
    env = dict(os.environ) if env is None else env
    explicit = env.get("PERFSCOPE_NCU")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise PerfscopeError(f"PERFSCOPE_NCU={explicit} is not an executable file.")
        return explicit
    found = shutil.which("ncu", path=env.get("PATH"))
    if found:
        return found
    candidates = []
    if env.get("CUDA_HOME"):
        candidates.append(os.path.join(env["CUDA_HOME"], "bin", "ncu"))
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = _pathfinder_ncu()
    if found:
        return found
    raise PerfscopeError("Nsight Compute (ncu) was not found on PATH, in CUDA_HOME/bin or in "
                         "/opt/nvidia/nsight-compute; set PERFSCOPE_NCU to the ncu executable.")


def _pathfinder_ncu() -> str | None:
    """ncu where cuda.pathfinder (installed with cuda-bindings) knows to look: a Conda prefix,
    CUDA_PATH, or the toolkit root beside the loaded CUDA runtime."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return None
    try:
        return find_nvidia_binary_utility("ncu")
    except Exception as exc:  # an unsupported platform layout is a miss, not a failure
        log.info("cuda.pathfinder could not look for ncu (%s)", exc)
        return None


_VERSION_RE = re.compile(r"Version (\d{4})\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(year, minor, patch) of an Nsight Compute version string, None when the text has none."""
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def ncu_version(ncu: str) -> tuple[int, int, int]:
    """ncu's version, refusing one too old for the collection set."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PerfscopeError(f"{ncu} --version failed to run ({exc}).") from None
    version = parse_version(out.stdout + out.stderr)
    if version is None:
        raise PerfscopeError(f"{ncu} --version did not print a version; is it Nsight Compute?")
    if version[:2] < MIN_VERSION:
        raise PerfscopeError(f"Nsight Compute {'.'.join(map(str, version))} is too old; "
                             f"perfscope needs {MIN_VERSION[0]}.{MIN_VERSION[1]} or newer.")
    return version


# ------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class Progress:
    """One step of ncu's own pass counter for one kernel."""

    kernel: str
    percent: int          # 0..100 within this kernel
    passes: int | None    # total passes, once ncu says it
    done: bool


_PROF_KERNEL = re.compile(r'==PROF== Profiling "([^"]*)"(?: - \d+)?:?')
_PASSES = re.compile(r"- (\d+) pass")


class ProgressParser:
    """Turns ncu's stdout, fed in arbitrary chunks, into Progress events.

    ncu prints ``==PROF== Profiling "k": 0%....50%....100% - 38 passes`` a character at
    a time as replay passes finish: each dot is 10%. The profiled program's own output
    can land in the middle of that line, and so can ncu's own warnings: a kernel ends at
    ``- N passes`` wherever it appears, or at an error or the next kernel when the count
    never comes.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._kernel: str | None = None
        self._pct = 0

    def feed(self, chunk: str) -> list[Progress]:
        """The Progress events the output so far completes; a marker split across chunks waits."""
        events: list[Progress] = []
        self._buf += chunk
        while True:
            if self._kernel is None:
                m = _PROF_KERNEL.search(self._buf)
                if m is None:
                    # Keep a tail that may hold the start of a marker split across chunks.
                    self._buf = self._buf[-300:]
                    return events
                self._kernel, self._pct = m.group(1), 0
                self._buf = self._buf[m.end():]
                events.append(Progress(self._kernel, 0, None, False))
                continue
            passes = _PASSES.search(self._buf)
            # A warning (ncu saving device memory before a replay, say) can interrupt the
            # dots; only an error or the next kernel ends this one without a count.
            ends = [i for i in (self._buf.find("\n==ERROR=="), self._buf.find("\n==PROF== Profiling"))
                    if i >= 0]
            next_msg = min(ends) if ends else -1
            if passes is not None and (next_msg < 0 or passes.start() < next_msg):
                events.append(Progress(self._kernel, 100, int(passes.group(1)), True))
                self._buf, self._kernel = self._buf[passes.end():], None
                continue
            if next_msg >= 0:
                events.append(Progress(self._kernel, 100, None, True))
                self._buf, self._kernel = self._buf[next_msg + 1:], None
                continue
            pct = 100 if "100%" in self._buf else max(min(10 * self._buf.count("."), 90),
                                                       50 if "50%" in self._buf else 0)
            if pct > self._pct:
                self._pct = pct
                events.append(Progress(self._kernel, pct, None, False))
            return events


def profiled_kernels(output: str) -> list[tuple[str, int | None]]:
    """(kernel, passes) of every launch ncu's output says it profiled, in order; passes
    is None for a launch whose replay ended without a count (an error, a fault, Ctrl-C)."""
    parser = ProgressParser()
    events = parser.feed(output)
    out = [(e.kernel, e.passes) for e in events if e.done]
    if events and not events[-1].done:
        out.append((events[-1].kernel, None))
    return out


# ------------------------------------------------------------------------- failures


_PERM_HELP = ("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): an "
              "administrator must allow it (load the nvidia driver with "
              "NVreg_RestrictProfilingToAdminUsers=0, or run ncu as root / with CAP_SYS_ADMIN "
              "in the container); bench and sass still work without counters.")


def error_lines(output: str) -> list[str]:
    """ncu's ==ERROR== lines in its output."""
    return [ln.strip() for ln in output.splitlines() if ln.startswith("==ERROR==")]


def classify_failure(returncode: int, output: str, report_written: bool) -> PerfscopeError | None:
    """The one-sentence error for a finished ncu run, or None if it succeeded."""
    errors = error_lines(output)
    quoted = " | ".join(errors[:3])
    if "ERR_NVGPUCTRPERM" in output:
        return PerfscopeError(_PERM_HELP)
    if "No kernels were profiled" in output:
        return PerfscopeError("ncu profiled no kernel: nothing matched the kernel or NVTX filter"
                              + (f" ({quoted})" if quoted else "."))
    crash = re.search(r"(illegal (memory )?(address|access)|CUDA_ERROR_\w+|unspecified launch failure|"
                      r"Segmentation fault|core dumped)", output, re.IGNORECASE)
    if crash:
        return PerfscopeError(f"the profiled program crashed ({crash.group(0)}): "
                              + (quoted or "see ncu's output above"))
    app = re.search(r"application returned an error code \((\d+)\)", output)
    if app:
        return PerfscopeError(f"the profiled program failed with exit code {app.group(1)}"
                              + (f": {quoted}" if quoted else "."))
    if returncode != 0 or errors:
        return PerfscopeError(f"ncu failed (exit code {returncode})"
                              + (f": {quoted}" if quoted else "."))
    if not report_written:
        return PerfscopeError("ncu finished but wrote no report.")
    return None


# ---------------------------------------------------------------------------- running


def report_path(output: Path) -> Path:
    """The file ncu writes for an output name: it adds .ncu-rep unless the name ends with it."""
    return output if output.name.endswith(".ncu-rep") else output.with_name(output.name + ".ncu-rep")


@dataclass(frozen=True)
class NcuRun:
    """What one ncu invocation left: its report (if any), its output, and why it failed."""

    report: Path | None
    output: str
    failure: PerfscopeError | None


class NcuInterrupted(KeyboardInterrupt):
    """Ctrl-C while ncu ran: ncu has been stopped; ``run.report`` is what it had written
    (None if nothing), under ``<name>.interrupted.ncu-rep``, for the caller to keep."""

    def __init__(self, run: NcuRun) -> None:
        super().__init__("ncu was interrupted")
        self.run = run


def _stop(proc: subprocess.Popen) -> None:
    """Ask ncu to wind down (it writes what it has), then kill it if it does not."""
    if proc.poll() is not None:
        return
    try:
        try:
            proc.wait(timeout=STOP_SELF_S)
            return
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except KeyboardInterrupt:
        # A second Ctrl-C: stop waiting.
        proc.kill()
        proc.wait()


def _drain(stream) -> str:
    try:
        rest = stream.read()
    except (OSError, ValueError):
        return ""
    return rest.decode(errors="replace") if rest else ""


def execute(ncu: str, opts: NcuOptions, command: Sequence[str], *, timeout: float | None = None,
            on_progress: Callable[[Progress], None] | None = None) -> NcuRun:
    """Run ncu over command; the report is kept even when the program failed part way.

    It is exported to ``<name>.part.ncu-rep`` and renamed when ncu has finished, so an
    interrupted run leaves no half-written report under the final name.
    """
    final = report_path(opts.output)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name[: -len(".ncu-rep")] + ".part.ncu-rep")
    tmp.unlink(missing_ok=True)
    argv = build_argv(ncu, _with_output(opts, tmp), command)
    log.info("running %s", " ".join(argv))
    parser = ProgressParser()
    chunks: list[str] = []
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise PerfscopeError(f"could not start {ncu} ({exc}); set PERFSCOPE_NCU to a working "
                             "ncu executable.") from None
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        while True:
            data = proc.stdout.read(4096)
            if data:
                text = data.decode(errors="replace")
                chunks.append(text)
                for event in parser.feed(text):
                    if on_progress:
                        on_progress(event)
            elif proc.poll() is not None:
                chunks.append(_drain(proc.stdout))
                break
            else:
                time.sleep(0.05)
            if timeout is not None and time.monotonic() - start > timeout:
                proc.kill()
                proc.wait()
                tmp.unlink(missing_ok=True)
                raise PerfscopeError(f"ncu did not finish within {timeout:.0f} s and was stopped; "
                                     "profile fewer stages or raise --timeout.")
    except KeyboardInterrupt:
        _stop(proc)
        chunks.append(_drain(proc.stdout))
        kept = None
        if tmp.exists() and tmp.stat().st_size > 0:
            kept = final.with_name(final.name[: -len(".ncu-rep")] + ".interrupted.ncu-rep")
            os.replace(tmp, kept)
        tmp.unlink(missing_ok=True)
        raise NcuInterrupted(NcuRun(kept, "".join(chunks), None)) from None
    output = "".join(chunks)
    failure = classify_failure(proc.returncode, output, tmp.exists())
    if not tmp.exists():
        return NcuRun(None, output, failure)
    os.replace(tmp, final)
    return NcuRun(final, output, failure)


def run(ncu: str, opts: NcuOptions, command: Sequence[str], *, timeout: float | None = None,
        on_progress: Callable[[Progress], None] | None = None) -> Path:
    """Run ncu over command and return the report; any failure raises (and drops the report)."""
    result = execute(ncu, opts, command, timeout=timeout, on_progress=on_progress)
    if result.failure is not None:
        if result.report is not None:
            result.report.unlink(missing_ok=True)
        raise result.failure
    assert result.report is not None
    return result.report


def export_launches(ncu: str, report: Path, skip: int, count: int, output: Path) -> Path:
    """Copy launches [skip, skip+count) of a report into a report of their own."""
    final = report_path(output)
    tmp = final.with_name(final.name[: -len(".ncu-rep")] + ".part.ncu-rep")
    argv = [ncu, "--import", str(report), "--launch-skip", str(skip), "--launch-count",
            str(count), "--force-overwrite", "--export", str(tmp)]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        quoted = " | ".join(error_lines(out.stdout + out.stderr)[:3])
        raise PerfscopeError(f"ncu could not split {report.name} into {final.name}"
                             + (f": {quoted}" if quoted else "."))
    os.replace(tmp, final)
    return final


def raw_csv(ncu: str, report: Path, metrics: Sequence[str] = ("gpu__time_duration.sum",)) -> str:
    """``ncu --import REPORT --page raw --csv``: one row per launch, NVTX ranges included."""
    out = subprocess.run([ncu, "--import", str(report), "--page", "raw", "--csv",
                          "--metrics", ",".join(metrics)], capture_output=True, text=True)
    if out.returncode != 0:
        quoted = " | ".join(error_lines(out.stdout + out.stderr)[:3])
        raise PerfscopeError(f"ncu could not read back {report.name}" + (f": {quoted}" if quoted else "."))
    return out.stdout


def _with_output(opts: NcuOptions, path: Path) -> NcuOptions:
    return replace(opts, output=path)
