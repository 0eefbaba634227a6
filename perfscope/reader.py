"""Opening `.ncu-rep` files: Nsight Compute's report reader, decompression, and framing.

``open_report(path)`` gives a handle on the reader's report context for a ``.ncu-rep``
or ``.ncu-rep.xz``: the reader module is the ``ncu-report`` wheel, or the copy inside a
local Nsight Compute install; ``.xz`` files are decompressed once into a cache keyed by
their content and capped in size; a file the reader loads as empty is checked against
the report's framing, so a truncated or foreign file gets one sentence that says which.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import logging
import lzma
import os
import re
import shutil
import struct
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfscope.cache import cache_root
from perfscope.errors import PerfscopeError
from perfscope.version import installed_version

log = logging.getLogger(__name__)

REPORT_SUFFIXES = (".ncu-rep", ".ncu-rep.xz")
# Every .ncu-rep starts with these bytes; anything else is not a report at all.
REPORT_MAGIC = b"NVR\x00"
# Seen with ncu-report 2025.3.1 on Python 3.11/3.12: once one of these C++ extensions is
# loaded, the reader's first string call (a metric's unit) kills the process; loaded after
# the reader they are harmless (CuPy aside on a GPU machine, where the two cannot share a
# process at all). cuda-bindings' driver extension does the same on a GPU machine (seen on
# the H200 when `profile --time` imported it before the reader). Readers from 2026.3 on do
# not have the fault.
READER_CONFLICTS = ("cupy._core.core", "matplotlib", "kiwisolver", "cuda.bindings.cydriver")
# Not refused, though seen: the Nsight Compute install's copy of the reader (the GPU
# machines', where no wheel is installed) crashes a bare interpreter at its first metric
# unit when numpy's extension was imported before it, yet reads on in pytest's process on
# the same machine with numpy loaded first (the GPU tests of 2026-12-05: what else decides
# is not isolated). Scripts that read reports load the reader before numpy
# (benchmarks/reference_run.py).
FAULTY_READERS = ("2025.",)
# Decompressed reports kept in the cache, at most (PERFSCOPE_CACHE_MB overrides); the
# oldest-used are evicted first.
CACHE_CAP_ENV = "PERFSCOPE_CACHE_MB"
DEFAULT_CACHE_MB = 512
# A partial decompression untouched this long is a dead process's leftover; a younger one
# may be another perfscope decompressing right now (it writes every few milliseconds).
STALE_PART_S = 600


def reader_version() -> str | None:
    """The installed ``ncu-report`` wheel's version, None for a local install's copy."""
    # Not IContext.get_version(): it crashes the process when CuPy was imported first.
    return installed_version("ncu-report")


# Where an Nsight Compute install keeps the reader: .../nsight-compute/<version>/extras/python.
_INSTALL_VERSION = re.compile(r"nsight-compute[-_/]?(\d{4}\.\d+(?:\.\d+)*)[/\\]extras")


def reader_label() -> str | None:
    """The reader that reads reports, for what a page or a profile says it was read with: the
    wheel's version, else the install's version as its path gives it ("2025.3.1 (Nsight
    Compute install)"), None when no reader was found."""
    version = reader_version()
    if version is not None:
        return version
    module = sys.modules.get("ncu_report")
    found = _INSTALL_VERSION.search(str(getattr(module, "__file__", "") or ""))
    if found is not None:
        return f"{found.group(1)} (Nsight Compute install)"
    return "Nsight Compute install" if module is not None else None


def reader_has_import_fault(version: str | None = None) -> bool:
    """Whether this reader crashes when CuPy or matplotlib was loaded before it."""
    version = reader_version() if version is None else version
    # A local install's module is of the ncu on the machine: assume the old behaviour.
    return version is None or version.startswith(FAULTY_READERS)


def load_reader_first() -> None:
    """Import the reader now, before anything that conflicts with it (a no-op when absent
    or when a conflicting module is already loaded: the refusal comes on first use).

    Found the way reader_module finds it: on the GPU machine the reader is the Nsight
    Compute install's extras/python copy, not a wheel, and a plain import misses it.
    """
    if not _conflicting_modules():
        with contextlib.suppress(PerfscopeError):
            reader_module()


def _conflicting_modules() -> list[str]:
    return [m for m in READER_CONFLICTS if m in sys.modules]


def reader_module() -> Any:
    """The ncu_report module: the PyPI wheel, else a local Nsight Compute install's copy."""
    if "ncu_report" not in sys.modules and reader_has_import_fault() and (early := _conflicting_modules()):
        raise PerfscopeError(f"{', '.join(early)} was imported before Nsight Compute's report "
                             "reader, and in that order ncu-report 2025.3 crashes the process: "
                             "import perfscope.profile first (or install ncu-report 2026.3).")
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    candidates = [os.environ.get("PERFSCOPE_NCU_PYTHON", "")]
    ncu = shutil.which("ncu")
    if ncu:
        candidates.append(str(Path(ncu).resolve().parent / "extras" / "python"))
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        candidates += glob.glob(f"{root}/nsight-compute*/extras/python")
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"), reverse=True)
    for path in filter(None, candidates):
        if (Path(path) / "ncu_report.py").exists() or (Path(path) / "ncu_report").exists():
            sys.path.insert(0, path)
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                sys.path.remove(path)
    raise PerfscopeError("Nsight Compute's report reader is missing: install it with "
                         "'pip install ncu-report' (or set PERFSCOPE_NCU_PYTHON to the "
                         "extras/python folder of an Nsight Compute install).")


# ------------------------------------------------------------------ decompression cache


def cache_cap_bytes() -> int:
    """How many bytes of decompressed reports the cache keeps: $PERFSCOPE_CACHE_MB, else 512 MB."""
    text = os.environ.get(CACHE_CAP_ENV)
    try:
        mb = float(text) if text else DEFAULT_CACHE_MB
    except ValueError:
        log.warning("%s=%r is not a number of MB; using %d", CACHE_CAP_ENV, text, DEFAULT_CACHE_MB)
        mb = DEFAULT_CACHE_MB
    return int(mb * 2**20)


def _content_key(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:32]


def evict(folder: Path, cap: int, keep: Path | None = None) -> None:
    """Delete the least recently used reports in folder until it holds at most cap bytes
    (keep, the one just made, is never deleted; stale partial files always are)."""
    entries = []
    now = time.time()
    for p in folder.glob("*"):
        with contextlib.suppress(OSError):
            st = p.stat()
            if p.name.endswith(".part"):
                if now - st.st_mtime > STALE_PART_S:
                    p.unlink()
                continue
            entries.append((max(st.st_atime, st.st_mtime), st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries):
        if total <= cap:
            break
        if keep is not None and p == keep:
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size


def _touch(p: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(p)


def decompressed(path: Path) -> tuple[Path, bool]:
    """A plain .ncu-rep for path: itself, or an xz-decompressed copy cached by content.

    Returns the path and whether it is a private temporary file the caller must delete
    (when the cache cannot be written). An interrupted decompression leaves nothing.
    """
    if not path.name.endswith(".xz"):
        return path, False
    folder = cache_root() / "reports"
    cached = folder / f"{_content_key(path)}.ncu-rep"
    if cached.exists():
        _touch(cached)
        return cached, False
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
        private = False
    except OSError:
        fd, tmp = tempfile.mkstemp(suffix=".ncu-rep")
        private = True
    try:
        with os.fdopen(fd, "wb") as out, lzma.open(path) as src:
            shutil.copyfileobj(src, out, 1 << 22)
    except (lzma.LZMAError, EOFError) as exc:
        os.unlink(tmp)
        raise PerfscopeError(f"{path} is not a valid xz file or is truncated ({exc}).") from None
    except BaseException:
        # Ctrl-C or a full disk: no half-written file stays behind.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if private:
        return Path(tmp), True
    os.replace(tmp, cached)
    evict(folder, cache_cap_bytes(), keep=cached)
    return cached, False


# --------------------------------------------------------------------------- framing


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _announced_size(record: bytes) -> int | None:
    """The size a block header announces for the record after it (its field 5), if the
    record is such a header.

    ncu writes a protobuf record before each block (fields 1 and 2 are 0 or 1, field 5
    the next record's size with its length prefix; most are 45-47 bytes, the one before
    the first result also carries the metric names). In every capture committed here
    (52 files, 756 headers) each one announces exactly the record after it; records
    whose field 5 is 0 announce nothing.
    """
    fields: dict[int, int | bytes] = {}
    i = 0
    try:
        while i < len(record):
            key, i = _varint(record, i)
            if key & 7 == 0:
                value: int | bytes
                value, i = _varint(record, i)
            elif key & 7 == 2:
                size, i = _varint(record, i)
                value, i = record[i:i + size], i + size
                if i > len(record):
                    return None
            else:
                return None
            if key >> 3 == 1 and value not in (0, 1):
                return None          # a result or a module, not a header: stop reading it
            fields.setdefault(key >> 3, value)
    except IndexError:
        return None
    size = fields.get(5)
    if fields.get(1) in (0, 1) and fields.get(2) in (0, 1) and isinstance(size, int) and size > 0:
        return size
    return None


def framing_problem(data: bytes) -> str | None:
    """Why a report's bytes are broken, or None.

    A .ncu-rep is a 4-byte signature, a 4-byte version, a 2-byte field and then records
    each led by a 4-byte little-endian length, the last one ending at end of file. Each
    result is announced by a small header record giving its size: a file that ends after
    such a header was cut at a record boundary.
    """
    if not data.startswith(REPORT_MAGIC):
        return "not an Nsight Compute report (it does not start with the report signature)"
    off = 10
    last = b""
    while off + 4 <= len(data):
        size = struct.unpack_from("<I", data, off)[0]
        last = data[off + 4: off + 4 + size]
        off += 4 + size
    if off != len(data):
        return f"truncated: its last record runs past the end of the file ({len(data)} bytes)"
    if _announced_size(last):
        return (f"truncated: it ends after the header of a result whose data is missing "
                f"({len(data)} bytes)")
    return None


# ---------------------------------------------------------------------------- opening


class ReportHandle:
    """Keeps the report context and its decompressed file alive while metrics are read."""

    def __init__(self, ctx: Any, tmp: Path | None) -> None:
        self.ctx = ctx
        # The reader's range proxies own their actions: drop a range and its actions
        # dangle, so every range stays referenced for as long as the handle lives.
        self.ranges = [ctx.range_by_idx(i) for i in range(ctx.num_ranges())]
        if tmp is not None:
            weakref.finalize(self, _unlink, tmp)

    def actions(self) -> Iterable[tuple[int, int, Any]]:
        """(range index, action index, action) of every profiled launch, in report order."""
        for ri, rng in enumerate(self.ranges):
            for ai in range(rng.num_actions()):
                yield ri, ai, rng.action_by_idx(ai)


def _unlink(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink()


def open_report(path: Path) -> tuple[ReportHandle, str | None]:
    """The report's handle and, when it loaded but is cut short, a warning sentence."""
    mod = reader_module()
    # Twice at most: another process's cache eviction may delete the shared decompressed
    # copy between decompressed() handing it over and its reading here (an open file
    # survives an unlink; a path does not).
    for attempt in (1, 2):
        plain, private = decompressed(path)
        try:
            data = plain.read_bytes()
            ctx = mod.load_report(str(plain))
        except Exception as exc:
            if attempt == 1 and not private and not plain.exists():
                continue
            if private:
                _unlink(plain)
            raise PerfscopeError(f"{path} could not be read as an Nsight Compute report: {exc}") from None
        break
    handle = ReportHandle(ctx, plain if private else None)
    why = framing_problem(data)
    if ctx.num_ranges() == 0 or all(r.num_actions() == 0 for r in handle.ranges):
        if why is not None:
            raise PerfscopeError(f"{path} is {why}.")
        raise PerfscopeError(f"{path} holds no profiled kernel launch.")
    warning = None
    if why is not None:
        warning = f"{path} is incomplete: {why}; only the launches before the cut are read."
        # Every launch carries the sentence (Identity.incomplete) and diagnose, diff and
        # report print it once per file; a log warning would say it twice.
        log.info("%s", warning)
    return handle, warning


def report_stem(path: Path) -> str:
    """The file name without .ncu-rep or .ncu-rep.xz."""
    for suffix in sorted(REPORT_SUFFIXES, key=len, reverse=True):
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def find_reports(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand files and directories into report files, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PerfscopeError(f"{p} does not exist.")
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.name.endswith(REPORT_SUFFIXES))
            if not found:
                raise PerfscopeError(f"{p} holds no .ncu-rep or .ncu-rep.xz report.")
            out += found
        else:
            out.append(p)
    return out
