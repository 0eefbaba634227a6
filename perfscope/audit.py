"""``perfscope sass``: what a kernel compiles to, audited without a GPU or counters.

This workflow sits above the rules: it compiles and disassembles (perfscope.sass keeps the
disassembler), then judges with the rule table. A stage is compiled the project's way
(NVRTC, :func:`perfscope.kernels.launch.compile_stage`),
a user's ``.cu`` with ``nvcc -cubin``, and a ``.cubin`` is taken as it is. The cubin is
disassembled (:mod:`perfscope.sass.disasm`), its static opcode counts are grouped into
families, the stage's declared fingerprint is checked family by family, and the rules
that need no counters run on a static, profile-shaped input: opcodes and the compute
capability from the SASS, registers and spills from the compiler (``ptxas -v``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from perfscope.build import CompileError, check_known_arch, parse_ptxas_log
from perfscope.diagnosis import LaunchSelector, launch_selector
from perfscope.documents import AuditDocument, FingerprintCheck, SassAudit
from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY, family_of, group_families
from perfscope.hotloop import NOT_COLLECTED, code_check, hot_listing
from perfscope.kernels import get_spec, normalize_dtype, stage_info
from perfscope.kernels.launch import compile_stage
from perfscope.kernels.spec import KernelSpec, param_tag
from perfscope.manifest import RunManifest, manifest_beside
from perfscope.profile import (
    HOT_LOOP_SHARE,
    Identity,
    KernelProfile,
    Launch,
    Memory,
    Opcodes,
    RawMetrics,
    SpeedOfLight,
    Stalls,
    Traffic,
    compile_kernel_regex,
    load,
)
from perfscope.reader import decompressed, report_stem
from perfscope.rules import STATIC_REGISTRY, Context, Evaluation, evaluate
from perfscope.sass.disasm import Disassembly, KernelSass, Tool, disassemble, find_tool
from perfscope.sass.embedded import EmbeddedCubin, cubins_for, embedded_cubins
from perfscope.stage import ResourceUsage

log = logging.getLogger(__name__)

NVCC_TIMEOUT_S = 600
# A target that names an Nsight Compute report: its kernels are audited from the cubins it
# carries.
REPORT_RE = re.compile(r"\.ncu-rep(\.xz)?$", re.IGNORECASE)


# ---------------------------------------------------------------- static profile


def _cc_text(arch: str) -> str:
    cc = int(arch[3:].rstrip("af"))
    return f"{cc // 10}.{cc % 10}"


def static_profile(sass: KernelSass, arch: str, resources: ResourceUsage | None):
    """A KernelProfile that holds only what static SASS and the compiler know: the opcode
    histogram (static counts in place of executed ones), the compute capability, and the
    registers. Every counter is None, so a rule that needs one is "not evaluated"."""

    base = {k: float(v) for k, v in sass.base_opcodes.items()}
    none_traffic = Traffic(None, None, None, ())
    regs = resources.registers if resources is not None else sass.registers
    return KernelProfile(
        identity=Identity(name=sass.name, mangled=sass.name, demangled=sass.name, grid=None,
                          block=None, cluster=None, device=None, compute_capability=_cc_text(arch),
                          sm_count=None, sm_clock_hz=None, cycles=None, mem_clock_hz=None,
                          reader_version=None, source="static SASS", range_index=0,
                          action_index=0),
        sol=SpeedOfLight(None, None, None, None, None, None),
        stalls=Stalls((), None, None, None, None),
        memory=Memory(none_traffic, none_traffic, None, None, None, None, None, None, None,
                      None, None),
        launch=Launch(regs, resources.static_smem if resources is not None else sass.shared_bytes,
                      None, None, None, None, None, None, None, None, {}, None),
        opcodes=Opcodes(executed=base, with_modifiers={k: float(v) for k, v in sass.opcodes.items()},
                        families=group_families(base)),
        hotspots=(), ncu_rules=(), metrics=RawMetrics(None, None),
    )


def check_fingerprint(sass: KernelSass, declared: tuple[str, ...],
                      absent: tuple[str, ...] = ()) -> tuple[FingerprintCheck, ...]:
    """One check per declared family (must be there) and per absent one (must not be)."""
    ops = sass.opcodes
    out = []
    for key, forbidden in [(k, False) for k in declared] + [(k, True) for k in absent]:
        mine = {op: n for op, n in ops.items() if family_of(op) == key}
        out.append(FingerprintCheck(key, FAMILY_BY_KEY[key].label, sum(mine.values()),
                                    tuple(sorted(mine, key=lambda o: -mine[o])), forbidden))
    return tuple(out)


def _evaluate(sass: KernelSass, arch: str, resources: ResourceUsage | None,
              context: Context) -> Evaluation:
    return evaluate(static_profile(sass, arch, resources), None,
                    replace(context, sass=sass.instructions), rules=STATIC_REGISTRY)


# ---------------------------------------------------------------------- inputs


def audit_stage(name: str, arch: str | None = None, dtype: str | None = None,
                tool: Tool | None = None, params: Mapping[str, int] | None = None) -> SassAudit:
    """Compile a registry stage through NVRTC for arch (default: its first), at its
    defaults or with some template parameters changed (params), and audit it."""
    spec = get_spec(name)
    if spec.is_reference:
        raise PerfscopeError(f"{name} is a cuBLAS library call with no source to compile; audit "
                             "its SASS from a report with `perfscope diagnose` instead")
    if params:
        spec = spec.with_params(**params)
    arch = arch or spec.archs[0]
    check_known_arch(arch)
    dtype = normalize_dtype(dtype) if dtype else spec.dtypes[0]
    spec.check_dtype(dtype)
    tool = tool or find_tool()   # before compiling: a missing tool is the cheaper refusal
    module = compile_stage(spec, dtype, arch)
    mangled = module.mangled(spec.name_expression(dtype))
    sass = disassemble(module.cubin_path, tool).kernel(mangled)
    resources = module.resources[mangled]
    return SassAudit(
        target=name + param_tag(params), kind="stage", arch=arch, kernel=mangled, dtype=dtype,
        label=spec.label,
        tool=tool, compiler=f"NVRTC {module.nvrtc_version} " + " ".join(
            o for o in module.options if not o.startswith("-I")),
        resources=resources, sass=sass, fingerprint=check_fingerprint(sass, spec.fingerprint,
                                                                         spec.absent),
        evaluation=_evaluate(sass, arch, resources, Context(stage=stage_info(spec), dtype=dtype,
                                                            resources=resources)),
        dynamic_smem=spec.dynamic_smem_bytes(), change=spec.change)


def find_nvcc() -> Path:
    """nvcc from PATH, CUDA_HOME or CUDA_PATH; PerfscopeError, saying what to do, when there is none."""
    hit = shutil.which("nvcc")
    if hit:
        return Path(hit)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return Path(root) / "bin" / "nvcc"
    raise PerfscopeError("a .cu file outside the registry is compiled with nvcc, which is not on "
                         "PATH or in CUDA_HOME; install a CUDA toolkit, or compile it yourself "
                         "(nvcc -cubin -arch=ARCH) and pass the .cubin")


def compile_cu(path: Path, arch: str, out_dir: Path) -> tuple[Path, dict[str, ResourceUsage], str]:
    """nvcc -cubin with -lineinfo and ptxas -v: (cubin, resource usage per kernel, flags)."""
    nvcc = find_nvcc()
    cubin = out_dir / (path.stem + ".cubin")
    argv = [str(nvcc), "-cubin", f"-arch={arch}", "-lineinfo", "-std=c++17", "-Xptxas", "-v",
            "-o", str(cubin), str(path)]
    log.info("compiling %s: %s", path, " ".join(argv))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise PerfscopeError(f"nvcc took more than {NVCC_TIMEOUT_S} s on {path} and was stopped"
                             ) from None
    text = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        errors = [ln for ln in text.splitlines() if "error" in ln.lower()] or text.splitlines()
        raise CompileError(f"compiling {path.name} for {arch} failed:\n" + "\n".join(errors[:12]),
                           text)
    return cubin, parse_ptxas_log(text), " ".join(argv[1:-3])


def audit_file(path: Path, arch: str | None = None, dtype: str | None = None,
               tool: Tool | None = None) -> list[SassAudit]:
    """Audit every kernel of a user's .cu (compiled with nvcc) or of a .cubin."""
    if path.is_dir():
        raise PerfscopeError(f"{path} is a folder; name one .cu source or .cubin in it")
    if not path.is_file():
        raise PerfscopeError(f"{path} does not exist")
    dtype = normalize_dtype(dtype) if dtype else None
    suffix = path.suffix.lower()
    if suffix not in (".cu", ".cubin"):
        raise PerfscopeError(f"{path.name} is neither a .cu source nor a .cubin; name a stage, a .cu "
                             "or a .cubin")
    tool = tool or find_tool()
    notes: list[str] = []
    if suffix == ".cu":
        arch = arch or "sm_90a"
        check_known_arch(arch)
        with tempfile.TemporaryDirectory(prefix="perfscope-sass-") as tmp:
            cubin, resources, flags = compile_cu(path, arch, Path(tmp))
            dis = disassemble(cubin, tool)
        compiler = f"nvcc {flags}"
    else:
        dis = disassemble(path, tool)
        resources = {}
        compiler = "none (a .cubin as given; ptxas's spill report is not in it)"
        built = {k.arch for k in dis.kernels if k.arch}
        if arch is not None and built and arch not in built:
            raise PerfscopeError(f"{path.name} holds SASS for {', '.join(sorted(built))}, not {arch}; "
                                 "leave out --arch for a .cubin")
        arch = arch or next(iter(sorted(built)), None)
        if arch is None:
            raise PerfscopeError(f"{path.name} names no target architecture; pass --arch")
        notes.append("registers and shared memory from cuobjdump -res-usage (shared includes the "
                     "system-reserved part); spills unknown without ptxas -v")
    origin = _Origin(path, "cu" if suffix == ".cu" else "cubin", arch, dtype, compiler,
                     tuple(notes))
    return [_audit_kernel(origin, k, dis.tool, resources.get(k.name)) for k in dis.kernels]


@dataclass(frozen=True)
class _Origin:
    """Where an audited kernel's SASS came from: what the audit says beside the SASS."""

    target: Path
    kind: str                        # cu / cubin / report
    arch: str
    dtype: str | None
    compiler: str
    notes: tuple[str, ...] = ()


def _audit_kernel(origin: _Origin, sass: KernelSass, tool: Tool, resources: ResourceUsage | None,
                  fingerprint: tuple[FingerprintCheck, ...] = ()) -> SassAudit:
    arch = sass.arch or origin.arch
    return SassAudit(
        target=str(origin.target), kind=origin.kind, arch=arch, kernel=sass.name,
        dtype=origin.dtype, label="", tool=tool, compiler=origin.compiler, resources=resources,
        sass=sass, fingerprint=fingerprint,
        evaluation=_evaluate(sass, arch, resources,
                             Context(dtype=origin.dtype, resources=resources)),
        notes=origin.notes)


def _stage_of(manifest: RunManifest | None) -> KernelSpec | None:
    """The registry stage a run manifest names, when it names one with code of its own."""
    if manifest is None:
        return None
    try:
        spec = get_spec(manifest.stage)
    except PerfscopeError:
        return None
    return None if spec.is_reference else spec


def _picked(launches: list[KernelProfile], pick: LaunchSelector) -> list[KernelProfile]:
    """The launches a REPORT#ID or REPORT:REGEX[@N] selector picks, refused in one sentence
    when there are none."""
    path = pick.path
    if pick.launch_id is not None:
        hit = [p for p in launches if p.identity.launch_index == pick.launch_id]
        if not hit:
            raise PerfscopeError(f"{path} has no kernel launch #{pick.launch_id}; "
                                 f"perfscope diagnose {path} lists its launches.")
        return hit
    pattern = compile_kernel_regex(pick.regex)
    hit = [p for p in launches if pattern is None or pattern.search(p.name)
           or pattern.search(p.identity.demangled or "")]
    if not hit:
        raise PerfscopeError(f"no kernel matches {pick.regex!r} in {path}.")
    if pick.nth is None:
        return hit
    if pick.nth >= len(hit):
        raise PerfscopeError(f"{pick.regex!r} matches {len(hit)} launch(es) in {path}; "
                             f"@{pick.nth} is out of range (0 to {len(hit) - 1}).")
    return [hit[pick.nth]]


@dataclass(frozen=True)
class ReportAuditOptions:
    """What ``perfscope sass REPORT`` adds to the audit: where to write the cubins, whether
    to list the hot loop, and which launches (all unless picked)."""

    save_to: Path | None = None      # a folder for each audited kernel's cubin
    listing: bool = False            # the hot loop, instruction by instruction, with counts
    # The listing's rows: instructions executed at least this share as often as the most
    # executed one (0: every instruction that ran; None: the hot loop's HOT_LOOP_SHARE).
    listing_share: float | None = None
    pick: LaunchSelector | None = None   # REPORT#ID or REPORT:REGEX[@N]

    def __post_init__(self) -> None:
        if self.listing_share is None:
            return
        if not self.listing:
            raise PerfscopeError("--listing-share goes with --listing.")
        if not 0.0 <= self.listing_share <= 1.0:
            raise PerfscopeError(f"--listing-share {self.listing_share:g} is not a share "
                                 "between 0 and 1.")

    @property
    def share(self) -> float:
        """The listing's share, the hot loop's unless one was given."""
        return HOT_LOOP_SHARE if self.listing_share is None else self.listing_share


def audit_report(path: Path, arch: str | None = None, dtype: str | None = None,
                 tool: Tool | None = None,
                 options: ReportAuditOptions = ReportAuditOptions()) -> list[SassAudit]:
    """Audit every kernel a report profiled from the cubin the report carries: the code
    that ran (a library's kernels included), with its ``.reuse`` flags; a perfscope stage's
    kernel is also held to the stage's fingerprint when the run manifest beside the report
    names the stage. options: the cubins written to a folder
    (``<report stem>.<content hash>.cubin``, for other tools) and the hot-loop listing."""
    launches = [p for p in load(path) if p.identity.mangled]
    if options.pick is not None:
        launches = _picked(launches, options.pick)
    names = list(dict.fromkeys(p.identity.mangled for p in launches))
    plain, private = decompressed(path)
    try:
        cubins = embedded_cubins(plain.read_bytes())
    finally:
        if private:
            plain.unlink(missing_ok=True)
    if not cubins:
        raise PerfscopeError(f"{path.name} carries no cubin of its kernels (made by another "
                             "tool, or its bytes were altered); audit the kernel's .cubin or .cu "
                             "instead")
    manifest = manifest_beside(path)
    spec = _stage_of(manifest)
    dtype = normalize_dtype(dtype) if dtype else (manifest.dtype if manifest else None)
    tool = tool or find_tool()
    origin = _Origin(path, "report", arch or "", dtype,
                     "none (the cubin the report carries: the code that ran; ptxas's spill "
                     "report is not in it)",
                     ("registers and shared memory from cuobjdump -res-usage of that cubin "
                      "(shared includes the system-reserved part); spills unknown without "
                      "ptxas -v",))
    out: list[SassAudit] = []
    seen: set[tuple[str, str]] = set()
    disassemble_once = _DisassemblyCache(tool)
    # Launch by launch: two launches of one name may have run two modules' code (a Triton
    # report of several autotuned configurations); each module a kernel ran is audited once.
    for launch in launches:
        name = launch.identity.mangled
        found = _code_that_ran(cubins_for(cubins, name), name, launch, disassemble_once)
        if found is None:
            log.warning("no cubin in %s holds %s", path.name, name)
            continue
        cubin, dis, which = found
        if (name, cubin.digest) in seen:
            continue
        seen.add((name, cubin.digest))
        sass = dis.kernel(name)
        if arch is not None and sass.arch and sass.arch != arch:
            raise PerfscopeError(f"{path.name}'s kernel ran as {sass.arch} code, not {arch}; "
                                 "leave out --arch for a report")
        notes = origin.notes + ((which,) if which else ())
        if options.save_to is not None:
            file = options.save_to / f"{report_stem(path)}.{cubin.digest}.cubin"
            notes += (f"its cubin (the whole module, {len(cubin.data):,} bytes): "
                      f"{_save_cubin(cubin.data, file)}",)
        checks = (check_fingerprint(sass, spec.fingerprint, spec.absent)
                  if spec is not None and spec.entry in name else ())
        audited = _audit_kernel(replace(origin, arch=sass.arch or arch or "?", notes=notes),
                                sass, dis.tool, None, checks)
        if options.listing:
            audited = replace(audited, listing=hot_listing(launch, sass.instructions,
                                                           options.share))
        out.append(audited)
    if not out:
        raise PerfscopeError(f"none of the cubins in {path.name} holds its kernel"
                             f"{'s' if len(names) > 1 else ''} ({', '.join(names)})")
    return out


def _disassemble_one(cubin: EmbeddedCubin, name: str, tool: Tool) -> Disassembly:
    with tempfile.TemporaryDirectory(prefix="perfscope-sass-") as tmp:
        file = Path(tmp) / f"{cubin.digest}.cubin"
        file.write_bytes(cubin.data)
        return disassemble(file, tool, (name,))


class _DisassemblyCache:
    """One kernel of one module disassembled once, however many launches ask for it."""

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self._done: dict[tuple[str, str], Disassembly] = {}

    def __call__(self, cubin: EmbeddedCubin, name: str) -> Disassembly:
        key = (cubin.digest, name)
        if key not in self._done:
            self._done[key] = _disassemble_one(cubin, name, self.tool)
        return self._done[key]


def _code_that_ran(candidates: tuple[EmbeddedCubin, ...], name: str, profile: KernelProfile,
                   disassemble_once: _DisassemblyCache
                   ) -> tuple[EmbeddedCubin, Disassembly, str | None] | None:
    """Of the modules holding a kernel of this name, the one whose code is the report's
    (code_check: opcode for opcode at every PC the report executed), its disassembly, and a
    note when that could not be told; None when no module holds the name."""
    if not candidates:
        return None
    first: tuple[EmbeddedCubin, Disassembly] | None = None
    why = None
    for cubin in candidates:
        dis = disassemble_once(cubin, name)
        why = code_check(profile, dis.kernel(name).instructions)
        if why is None:
            return cubin, dis, None
        first = first or (cubin, dis)
        if why == NOT_COLLECTED:
            break   # nothing to tell them apart by: the first is as good as any
    assert first is not None   # candidates is not empty
    n = len(candidates)
    if why == NOT_COLLECTED:
        note = (None if n == 1 else
                f"{n} modules in the report hold a kernel of this name, and without "
                "per-instruction executions in the report which one ran cannot be told: the "
                "first is shown")
    elif n == 1:
        note = f"its module's code does not line up with the report's own SASS ({why})"
    else:
        note = (f"none of the {n} modules in the report holding a kernel of this name lines "
                f"up with the report's own SASS ({why}); the first is shown")
    return first[0], first[1], note


def _save_cubin(data: bytes, file: Path) -> Path:
    """Write a cubin where the user asked (the folder made if missing); one sentence if not."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
    except OSError as exc:
        raise PerfscopeError(f"cannot write {file} ({exc.strerror or exc})") from None
    return file


def _is_file(target: str) -> bool:
    """A .cu or .cubin target (or any path), not a stage name."""
    return (bool(re.search(r"\.(cu|cubin)$", target, re.IGNORECASE)) or os.sep in target
            or Path(target).exists())


def audit(target: str, arch: str | None = None, dtype: str | None = None,
          report: ReportAuditOptions = ReportAuditOptions(),
          params: Mapping[str, int] | None = None) -> AuditDocument:
    """``perfscope sass TARGET``: a stage name, a .cu, a .cubin or an Nsight Compute report
    (report: what a report's audit adds; refused for any other target; params: a stage's
    template parameters, refused for any other target)."""
    if params and (REPORT_RE.search(target) or _is_file(target)):
        raise PerfscopeError(f"--param changes a registry stage's template parameters; {target} "
                             "is a report or a file, not a stage name")
    if REPORT_RE.search(target):
        return AuditDocument(tuple(audit_report(Path(target), arch, dtype, options=report)))
    if (pick := launch_selector(target)) is not None and REPORT_RE.search(pick.path.name):
        return AuditDocument(tuple(audit_report(pick.path, arch, dtype,
                                                options=replace(report, pick=pick))))
    if report.save_to is not None:
        raise PerfscopeError("--save-cubin takes the cubins out of an Nsight Compute report; "
                             f"{target} is not one (a stage or .cu leaves its cubin in "
                             "perfscope's cache, a .cubin is one already)")
    if report.listing:
        raise PerfscopeError("--listing puts a report's counts on each instruction of the hot "
                             f"loop; {target} is not a report (.ncu-rep or .ncu-rep.xz)")
    if _is_file(target):
        return AuditDocument(tuple(audit_file(Path(target), arch, dtype)))
    return AuditDocument((audit_stage(target, arch, dtype, params=params),))
