"""Compile CUDA C++ to a cubin through NVRTC, with the compiler's resource usage.

One function, :func:`compile_cubin`, serves CI (no GPU) and the GPU machine alike: NVRTC
from the pinned ``nvidia-cuda-nvrtc`` wheel through ``cuda.bindings``, the CUDA headers
from the pinned ``nvidia-cuda-runtime`` wheel, always ``-lineinfo`` (ncu's source view
needs it) and always ptxas's verbose report, from which registers, shared memory, stack
and spills are read. Cubins are cached on disk by a key over the source (and the local
headers it includes), the architecture, the flags, the name expressions and the NVRTC
version, so a second ``bench`` or ``profile`` does not pay the compile again.

The cache lives under ``perfscope.cache.cache_root()`` (``$PERFSCOPE_CACHE``, else
``~/.cache/perfscope``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from perfscope.cache import CACHE_ENV, cache_root
from perfscope.digest import source_hash
from perfscope.errors import PerfscopeError
from perfscope.locations import install_hint
from perfscope.stage import ResourceUsage

log = logging.getLogger(__name__)

# Bumped when the cached metadata's layout changes, so old entries are not misread.
CACHE_FORMAT = 2
ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")
BASE_FLAGS: tuple[str, ...] = ("-lineinfo", "--ptxas-options=-v", "-std=c++17")


@dataclass(frozen=True)
class CompileRequest:
    """One translation unit, the kernels to instantiate from it, and how."""

    source: str
    source_name: str
    name_expressions: tuple[str, ...]
    arch: str = "sm_90a"
    flags: tuple[str, ...] = ()
    # Directory searched for the source's own `#include "..."` headers.
    include_dir: Path | None = None


@dataclass(frozen=True)
class CompiledModule:
    """A cubin on disk plus what the compiler said about it."""

    cubin_path: Path
    arch: str
    options: tuple[str, ...]
    source_hash: str
    # name expression -> lowered (mangled) name
    lowered: Mapping[str, str]
    # mangled name -> resource usage
    resources: Mapping[str, ResourceUsage]
    log: str
    nvrtc_version: str
    from_cache: bool = field(default=False, compare=False)

    def mangled(self, name_expression: str) -> str:
        """The lowered (mangled) name of a kernel instantiation."""
        return self.lowered[name_expression]

    def usage(self, name_expression: str) -> ResourceUsage:
        """What ptxas reported for a kernel instantiation."""
        return self.resources[self.lowered[name_expression]]

    @property
    def cubin(self) -> bytes:
        """The cubin's bytes, read from disk."""
        return self.cubin_path.read_bytes()


class CompileError(PerfscopeError):
    """NVRTC rejected the source; ``log`` holds the compiler's whole output."""

    def __init__(self, message: str, log_text: str):
        super().__init__(message)
        self.log = log_text


def check_arch(arch: str) -> int:
    """The compute capability (e.g. 90) of an ``sm_XX[a|f]`` target, or a refusal."""
    m = ARCH_RE.match(arch)
    if not m:
        raise PerfscopeError(
            f"architecture {arch!r} is not a real GPU target; use one like sm_80 or sm_90a")
    return int(m.group(1))


@lru_cache(maxsize=1)
def nvrtc_archs() -> tuple[int, ...]:
    """The compute capabilities the installed NVRTC compiles for (75, 80, ... 121)."""
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(nvrtc, err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def check_known_arch(arch: str) -> int:
    """check_arch, and the target must be one NVRTC compiles: a refusal names the known ones."""
    cc = check_arch(arch)
    suffix = arch[len(f"sm_{cc}"):]
    known = nvrtc_archs()
    # Arch-specific ("a") targets exist from sm_90, family ("f") targets from sm_100.
    if cc not in known or (suffix == "a" and cc < 90) or (suffix == "f" and cc < 100):
        names = ", ".join(f"sm_{c}" for c in known)
        raise PerfscopeError(
            f"architecture {arch!r} is unknown to NVRTC {nvrtc_version()}; it compiles {names} "
            "(with an 'a' suffix from sm_90 on, e.g. sm_90a, sm_100a, sm_103a)")
    return cc


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise PerfscopeError(
            "cuda-bindings is not installed; install perfscope with the 'build' extra "
            f"({install_hint('build')})") from exc
    return nvrtc


@lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """The CUDA headers shipped in the installed nvidia-cuda-runtime wheel."""
    import importlib.metadata as md

    try:
        files = md.files("nvidia-cuda-runtime") or []
    except md.PackageNotFoundError as exc:
        raise PerfscopeError(
            "nvidia-cuda-runtime is not installed, so NVRTC has no CUDA headers; install "
            f"perfscope with the 'build' extra ({install_hint('build')})") from exc
    for f in files:
        if f.name == "cuda_fp16.h":
            return Path(str(f.locate())).parent
    found = _pathfinder_include_dir()
    if found is not None:
        return found
    raise PerfscopeError("the installed nvidia-cuda-runtime wheel holds no cuda_fp16.h")


def _pathfinder_include_dir() -> Path | None:
    """CUDA's headers where cuda.pathfinder finds them (a wheel under another name, Conda,
    CUDA_PATH/CUDA_HOME): the fallback when the pinned runtime wheel lacks them."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return None
    try:
        found = find_nvidia_header_directory("cudart")
    except Exception as exc:  # an unsupported layout is a miss, not a failure
        log.info("cuda.pathfinder found no CUDA headers (%s)", exc)
        return None
    return Path(found) if found and (Path(found) / "cuda_fp16.h").is_file() else None


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """The NVRTC version as MAJOR.MINOR, asked once per process."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return f"{major}.{minor}"


def _check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise PerfscopeError(f"NVRTC call {what} failed: {msg.decode(errors='replace')}")


def compile_options(req: CompileRequest) -> tuple[str, ...]:
    """The NVRTC options for a request: its arch, the base flags, the CUDA headers and its own flags."""
    opts = [f"-arch={req.arch}", *BASE_FLAGS, f"-I{cuda_include_dir()}"]
    if req.include_dir is not None:
        opts.append(f"-I{req.include_dir}")
    opts.extend(req.flags)
    return tuple(opts)


def _cache_key(req: CompileRequest, src_hash: str) -> str:
    # The include paths hold machine-specific prefixes; they are left out of the key so
    # the same source and flags hit the same entry in any virtual environment.
    material = json.dumps({"format": CACHE_FORMAT, "src": src_hash, "arch": req.arch,
                           "base": BASE_FLAGS, "flags": req.flags,
                           "names": req.name_expressions, "nvrtc": nvrtc_version()},
                          sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:24]


# ptxas -v, per entry: "Compiling entry function 'X' for 'sm_90a'", then
# "N bytes stack frame, N bytes spill stores, N bytes spill loads" and
# "Used N registers, used N barriers, ..., N bytes smem, N bytes cmem[0]".
_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_BARRIERS_RE = re.compile(r"used (\d+) barriers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_CMEM0_RE = re.compile(r"(\d+) bytes cmem\[0\]")
# "ptxas info : (C7515) Potential Performance Loss: wgmma.mma_async instructions are
# serialized due to <reason> in the function '<mangled>'" (C7510-C7520 name other reasons).
_WGMMA_SERIAL_RE = re.compile(
    r"wgmma\.mma_async instructions are serialized due to (.+?) in the function '([^']+)'")


def parse_ptxas_log(text: str) -> dict[str, ResourceUsage]:
    """Resource usage per mangled entry name from ptxas's ``-v`` report."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int, int, int]] = {}
    serialized: dict[str, str] = {}
    entry: str | None = None
    props: str | None = None
    for line in text.splitlines():
        if m := _WGMMA_SERIAL_RE.search(line):
            serialized[m.group(2)] = m.group(1).strip()
            continue
        if m := _ENTRY_RE.search(line):
            entry = m.group(1)
            continue
        if m := _PROPS_RE.search(line):
            props = m.group(1)
            continue
        if (m := _FRAME_RE.search(line)) and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        if (m := _USED_RE.search(line)) and entry is not None:
            def num(rx: re.Pattern[str], s: str = line) -> int:
                hit = rx.search(s)
                return int(hit.group(1)) if hit else 0

            used[entry] = (int(m.group(1)), num(_SMEM_RE), num(_BARRIERS_RE), num(_CMEM0_RE))
            entry = None
    out = {}
    for name, (regs, smem, bars, cmem) in used.items():
        stack, st, ld = frames.get(name, (0, 0, 0))
        out[name] = ResourceUsage(registers=regs, static_smem=smem, stack_frame=stack,
                                  spill_stores=st, spill_loads=ld, barriers=bars, cmem0=cmem,
                                  wgmma_serialized=serialized.get(name, ""))
    return out


def _program_log(nvrtc, prog) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(nvrtc, err, "nvrtcGetProgramLogSize")
    # NVRTC writes into the buffer: it must be mutable. `b" " * size` is not, and for an
    # empty log (size 1) it is the interpreter's shared b" ", which NVRTC then overwrote
    # with a NUL for the whole process: later logs came back empty on the H200 and every
    # space that print() wrote was a NUL.
    buf = bytearray(size)
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    _check(nvrtc, err, "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0 ").decode(errors="replace")


def _error_excerpt(text: str, limit: int = 12) -> str:
    lines = [ln for ln in text.splitlines() if "error" in ln.lower()] or text.splitlines()
    return "\n".join(lines[:limit])


def _run_nvrtc(req: CompileRequest, options: tuple[str, ...]) -> tuple[bytes, dict[str, str], str]:
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(req.source.encode(), req.source_name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        for expr in req.name_expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _check(nvrtc, err, "nvrtcAddNameExpression")
        encoded = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        text = _program_log(nvrtc, prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(
                f"compiling {req.source_name} for {req.arch} failed:\n{_error_excerpt(text)}",
                text)
        lowered = {}
        for expr in req.name_expressions:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(nvrtc, err, f"nvrtcGetLoweredName({expr})")
            lowered[expr] = name.decode()
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(nvrtc, err, "nvrtcGetCUBIN")
        return bytes(cubin), lowered, text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _atomic_write(path: Path, data: bytes) -> None:
    # Several processes (pytest-xdist, a bench beside a profile) may fill one entry.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _load_cached(meta_path: Path, cubin_path: Path, src_hash: str) -> CompiledModule | None:
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CACHE_FORMAT or not cubin_path.is_file():
            return None
        return CompiledModule(
            cubin_path=cubin_path, arch=meta["arch"], options=tuple(meta["options"]),
            source_hash=src_hash, lowered=dict(meta["lowered"]),
            resources={k: ResourceUsage(**v) for k, v in meta["resources"].items()},
            log=meta["log"], nvrtc_version=meta["nvrtc"], from_cache=True)
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("ignoring a broken cache entry %s", meta_path)
        return None


def compile_cubin(req: CompileRequest, *, use_cache: bool = True) -> CompiledModule:
    """Compile req to a cubin (or take it from the cache) and read its resource usage."""
    check_arch(req.arch)
    if not req.name_expressions:
        raise PerfscopeError(f"no kernel named to instantiate from {req.source_name}")
    src_hash = source_hash(req.source, req.include_dir)
    key = _cache_key(req, src_hash)
    root = cache_root() / "cubin"
    cubin_path, meta_path = root / f"{key}.cubin", root / f"{key}.json"
    if use_cache and meta_path.is_file():
        hit = _load_cached(meta_path, cubin_path, src_hash)
        if hit is not None:
            log.info("cache hit for %s (%s): %s", req.source_name, req.arch, cubin_path)
            return hit
    options = compile_options(req)
    log.info("compiling %s for %s: %s", req.source_name, req.arch, " ".join(options))
    cubin, lowered, text = _run_nvrtc(req, options)
    resources = parse_ptxas_log(text)
    for name, usage in resources.items():
        if usage.wgmma_serialized:
            log.warning("ptxas serialized the wgmma pipeline of %s (%s) due to %s: each wgmma "
                        "waits for the one before it", name, req.source_name,
                        usage.wgmma_serialized)
    missing = [m for m in lowered.values() if m not in resources]
    if missing:
        said = " | ".join(ln.strip() for ln in text.strip().splitlines()[-6:]) or "nothing"
        raise PerfscopeError(
            f"ptxas reported no resource usage for {', '.join(missing)} in {req.source_name} "
            f"(the end of its log: {said})")
    try:
        root.mkdir(parents=True, exist_ok=True)
        _atomic_write(cubin_path, cubin)
        meta = {"format": CACHE_FORMAT, "arch": req.arch, "options": list(options),
                "source": req.source_name, "lowered": lowered, "log": text,
                "nvrtc": nvrtc_version(),
                "resources": {k: v.to_dict() for k, v in resources.items()}}
        _atomic_write(meta_path, json.dumps(meta, indent=1).encode())
    except OSError as exc:
        raise PerfscopeError(
            f"cannot write the cubin cache at {root} ({exc.strerror}); set {CACHE_ENV} "
            "to a writable directory") from exc
    return CompiledModule(cubin_path=cubin_path, arch=req.arch, options=options,
                          source_hash=src_hash, lowered=lowered, resources=resources,
                          log=text, nvrtc_version=nvrtc_version())
