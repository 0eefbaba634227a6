"""Static SASS of a cubin: find cuobjdump or nvdisasm, run it, count opcodes per kernel.

Works on any machine, GPU or not. The disassembler is looked for, in order, on PATH, in
``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``), and in the pinned ``nvidia-cuda-cuobjdump`` /
``nvidia-cuda-nvdisasm`` wheels of perfscope's ``build`` extra, located through the
installed distribution's file list. Nothing is ever installed at run time.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.families import base_opcode
from perfscope.locations import install_hint

log = logging.getLogger(__name__)

# (tool, the wheel that ships it), in order of preference: cuobjdump reads cubins and
# fatbins alike; nvdisasm reads cubins only.
TOOLS: tuple[tuple[str, str], ...] = (("cuobjdump", "nvidia-cuda-cuobjdump"),
                                      ("nvdisasm", "nvidia-cuda-nvdisasm"))
INSTALL_HINT = (f"install perfscope's build extra ({install_hint('build')}, which pins the "
                "nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels) or put a CUDA toolkit's "
                "bin directory on PATH")
TIMEOUT_S = 120

# "        /*0190*/                   @!P0 UTCHMMA gdesc[UR4], ... ;   /* 0x... */"
_INSTR_RE = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(.*?)\s*;")
# cuobjdump: "		Function : _Z3fooPf"; nvdisasm: ".text._Z3fooPf:"
_FUNC_RE = re.compile(r"^\s*(?:Function\s*:\s*(\S+)|\.text\.(\S+):)\s*$")
# ".target sm_90a" (a whole cubin), or cuobjdump's "code for sm_90a" (its only mark with -fun)
_TARGET_RE = re.compile(r"^\s*(?:\.target|code for)\s+(sm_\w+)")
# cuobjdump -res-usage: "Function _Z3fooPf:" then "REG:28 STACK:0 SHARED:80 LOCAL:0 ..."
_RES_FUNC_RE = re.compile(r"^\s*Function\s+([^\s:]+)\s*:")
_RES_RE = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")


@dataclass(frozen=True)
class Tool:
    """The disassembler that read a cubin, and where it was found."""

    name: str          # cuobjdump / nvdisasm
    path: Path
    origin: str        # PATH / CUDA_HOME / the wheel's name


@dataclass(frozen=True)
class KernelSass:
    """One kernel's static SASS: every instruction, in address order."""

    name: str                                   # mangled
    instructions: tuple[str, ...]               # "@P0 LDG.E.128 R4, desc[UR4][R2.64]"
    arch: str | None = None
    # From cuobjdump -res-usage (a cubin carries them; spill bytes it does not).
    registers: int | None = None
    shared_bytes: int | None = None
    stack_bytes: int | None = None
    local_bytes: int | None = None

    @property
    def opcodes(self) -> Counter[str]:
        """Static count per opcode with its modifiers (``LDTM.x16``); NOP padding left out."""
        out: Counter[str] = Counter()
        for ins in self.instructions:
            op = opcode_with_modifiers(ins)
            if op and op != "NOP":
                out[op] += 1
        return out

    @property
    def base_opcodes(self) -> Counter[str]:
        """Static count per base opcode, modifiers dropped (LDG.E.128 counts as LDG)."""
        out: Counter[str] = Counter()
        for op, n in self.opcodes.items():
            out[base_opcode(op)] += n
        return out


@dataclass(frozen=True)
class Disassembly:
    """Every kernel of one cubin's SASS, and the tool that disassembled it."""

    tool: Tool
    kernels: tuple[KernelSass, ...] = field(default_factory=tuple)

    def kernel(self, mangled: str | None = None) -> KernelSass:
        """The kernel of this mangled name, or the first one; PerfscopeError when there is none."""
        if not self.kernels:
            raise PerfscopeError("the disassembly holds no kernel")
        if mangled is None:
            return self.kernels[0]
        for k in self.kernels:
            if k.name == mangled:
                return k
        raise PerfscopeError(f"no kernel {mangled} in the disassembly; it holds "
                             f"{', '.join(k.name for k in self.kernels)}")


def opcode_with_modifiers(instruction: str) -> str:
    """The opcode with its modifiers (``LDG.E.128``), the predicate guard dropped."""
    text = instruction.strip()
    if text.startswith("@"):
        parts = text.split(None, 1)
        text = parts[1] if len(parts) > 1 else ""
    return text.split(None, 1)[0] if text else ""


def _wheel_binary(tool: str, dist: str) -> Path | None:
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        if f.name in (tool, f"{tool}.exe") and "bin" in f.parts:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    return None


def _pathfinder_binary(tool: str) -> Path | None:
    """tool where cuda.pathfinder finds it (other NVIDIA wheels, Conda, the toolkit beside
    the loaded CUDA runtime); None when it is not installed or finds nothing."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return None
    try:
        found = find_nvidia_binary_utility(tool)
    except Exception:  # an unsupported layout is a miss, not a failure
        return None
    return Path(found) if found else None


def find_tool(names: tuple[str, ...] = ("cuobjdump", "nvdisasm")) -> Tool:
    """The first disassembler found: PATH, then CUDA_HOME/CUDA_PATH, then the wheels, then
    wherever cuda.pathfinder looks."""
    wanted = [(t, d) for t, d in TOOLS if t in names]
    for tool, _ in wanted:
        hit = shutil.which(tool)
        if hit:
            return Tool(tool, Path(hit), "PATH")
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if not root:
            continue
        for tool, _ in wanted:
            for exe in (tool, f"{tool}.exe"):
                path = Path(root) / "bin" / exe
                if path.is_file() and os.access(path, os.X_OK):
                    return Tool(tool, path, env)
    for tool, dist in wanted:
        path = _wheel_binary(tool, dist)
        if path is not None:
            return Tool(tool, path, dist)
    for tool, _ in wanted:
        path = _pathfinder_binary(tool)
        if path is not None:
            return Tool(tool, path, "cuda.pathfinder")
    raise PerfscopeError(f"no SASS disassembler ({' or '.join(names)}) was found on PATH, in "
                         f"CUDA_HOME or in an installed wheel; {INSTALL_HINT}")


def _run(tool: Tool, args: list[str]) -> str:
    try:
        proc = subprocess.run([str(tool.path), *args], capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except OSError as exc:
        raise PerfscopeError(f"cannot run {tool.path} ({exc.strerror or exc}); {INSTALL_HINT}"
                             ) from None
    except subprocess.TimeoutExpired:
        raise PerfscopeError(f"{tool.name} took more than {TIMEOUT_S} s and was stopped") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise PerfscopeError(f"{tool.name} could not read the file: "
                             f"{msg[-1] if msg else f'exit status {proc.returncode}'}")
    return proc.stdout


def parse_sass(text: str) -> list[tuple[str, str | None, list[str]]]:
    """(kernel name, target, instructions) for each function in cuobjdump/nvdisasm output."""
    out: list[tuple[str, str | None, list[str]]] = []
    target: str | None = None
    current: list[str] | None = None
    for line in text.splitlines():
        if m := _TARGET_RE.match(line):
            target = m.group(1)
            continue
        if m := _FUNC_RE.match(line):
            current = []
            out.append((m.group(1) or m.group(2), target, current))
            continue
        if current is not None and (m := _INSTR_RE.match(line)):
            current.append(m.group(2))
    return out


def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """cuobjdump -res-usage: {mangled name: {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n}}."""
    out: dict[str, dict[str, int]] = {}
    name: str | None = None
    for line in text.splitlines():
        if m := _RES_FUNC_RE.match(line):
            name = m.group(1)
            continue
        if name is not None and (vals := _RES_RE.findall(line)):
            out[name] = {k: int(v) for k, v in vals}
            name = None
    return out


def disassemble(cubin: Path, tool: Tool | None = None, functions: tuple[str, ...] = ()) -> Disassembly:
    """The static SASS of every kernel in a cubin (or a fatbin/executable, with cuobjdump).

    functions: only these (mangled names), where the tool can select by name (cuobjdump's
    -fun: a library's module holds hundreds of kernels, and libcublas's sm_90 one takes
    cuobjdump 18 s whole against under 1 s for one function); nvdisasm reads them all.
    """
    if not cubin.is_file():
        raise PerfscopeError(f"{cubin} does not exist")
    tool = tool or find_tool()
    log.info("disassembling %s with %s (%s)", cubin, tool.path, tool.origin)
    if tool.name == "cuobjdump":
        only = ["-fun", ",".join(functions)] if functions else []
        text = _run(tool, ["-sass", *only, str(cubin)])
        try:
            res = parse_res_usage(_run(tool, ["-res-usage", *only, str(cubin)]))
        except PerfscopeError as exc:
            log.warning("no resource usage from cuobjdump: %s", exc)
            res = {}
    else:
        text = _run(tool, ["-c", str(cubin)])
        res = {}
    kernels = []
    for name, target, instructions in parse_sass(text):
        r = res.get(name, {})
        kernels.append(KernelSass(name, tuple(instructions), target, r.get("REG"), r.get("SHARED"),
                                  r.get("STACK"), r.get("LOCAL")))
    if not kernels:
        raise PerfscopeError(f"{tool.name} found no kernel code in {cubin} (is it a cubin with SASS, "
                             "not PTX only?)")
    return Disassembly(tool, tuple(kernels))
