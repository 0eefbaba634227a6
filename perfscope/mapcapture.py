"""Capture the tensor maps a program passes its kernels: `perfscope profile --tensor-maps`.

The capture library (``native/mapcapture.c``) is built once per source and compiler into
the cache with the system's C compiler, and preloaded into the program by a ``/bin/sh``
wrapper that ncu runs in the program's place: the wrapper puts the library last in
``LD_PRELOAD`` (an interposer the program preloads keeps its ``dlsym(RTLD_NEXT, ...)``
lookups, which the library's ``dlsym`` resolves after itself) and names the file the library
appends to, then ``exec``s the program, so ncu profiles the same process (ncu itself injects
through ``CUDA_INJECTION64_PATH``, not ``LD_PRELOAD``).
The lines are read back by :func:`perfscope.tensormaps.parse_capture` into the manifest.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from perfscope.cache import cache_root
from perfscope.errors import PerfscopeError
from perfscope.tensormaps import MapCapture, parse_capture

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "native" / "mapcapture.c"
OUTPUT_ENV = "PERFSCOPE_TENSOR_MAPS"
# The wrapper ncu runs: $0 is the library, $1 the capture file, the rest the program.
_WRAPPER = ('export LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$0" ' + OUTPUT_ENV + '="$1"; '
            'shift; exec "$@"')
COMPILERS = ("cc", "gcc", "clang")


def compiler(env: dict[str, str] | None = None) -> str:
    """$CC, else the first of cc, gcc, clang on PATH; PerfscopeError where there is none."""
    env = dict(os.environ) if env is None else env
    if env.get("CC"):
        return env["CC"]
    for name in COMPILERS:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise PerfscopeError("--tensor-maps builds a small C library and found no C compiler (cc, gcc or "
                         "clang on PATH, or $CC); install one or leave --tensor-maps out.")


def build_library(cc: str | None = None, folder: Path | None = None) -> Path:
    """The capture library for this source and compiler, built into the cache if not there yet."""
    cc = cc or compiler()
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + cc.encode()).hexdigest()[:16]
    folder = folder or cache_root() / "native"
    target = folder / f"libmapcapture-{digest}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{target.name}.{os.getpid()}.part"
    argv = [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl", "-lpthread"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PerfscopeError(f"could not run the C compiler {cc} for --tensor-maps ({exc}).") from None
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line),
                     done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no message")
        tmp.unlink(missing_ok=True)
        raise PerfscopeError(f"the tensor-map capture library did not build with {cc}: {first.strip()}")
    os.replace(tmp, target)
    log.info("built %s", target)
    return target


def wrap_command(command: Sequence[str], library: Path, output: Path) -> list[str]:
    """The command ncu runs in place of the program: the program, with the library preloaded
    and told where to write."""
    return ["/bin/sh", "-c", _WRAPPER, str(library), str(output), *command]


def read_capture(path: Path) -> MapCapture | None:
    """What the library wrote; None where it wrote nothing (no kernel was passed a map)."""
    if not path.exists():
        return None
    with path.open(errors="replace") as f:
        return parse_capture(f)


def note(capture: MapCapture | None) -> str:
    """What the capture found, in one sentence for the manifest and the console."""
    if capture is None or not capture.kernels:
        return ("no launch was passed a tensor map by value (a kernel that reads its maps "
                "through a pointer, or encodes them on the device, is not seen)")
    launches = sum(k.launches for k in capture.kernels)
    names = len({k.kernel for k in capture.kernels})
    text = (f"{launches} launch(es) of {names} kernel(s) were passed tensor maps "
            f"({len(capture.kernels)} distinct launch shape(s) and map sets)")
    if capture.truncated:
        text += "; a process wrote the most launches the library records and stopped recording"
    if capture.skipped_lines:
        text += f"; {capture.skipped_lines} line(s) were cut short and skipped"
    if capture.unknown_maps:
        text += (f"; {capture.unknown_maps} launch line(s) named a map never described and were "
                 "skipped")
    return text
