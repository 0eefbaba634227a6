"""Diagnosed: one kernel launch with everything perfscope knows about it, and the one loader.

Every consumer (diagnose, diff, the review page, the exports) reads the same record:

    Diagnosed(label, path, profile, manifest, evaluation, stage)

``diagnose(paths)`` builds one per profiled launch in the reports under paths: it loads
the report (perfscope.profile), reads the run manifest beside it (perfscope.manifest),
names the stage (from the manifest, else from the file name) with what the registry
says of it (a StageInfo), and evaluates the rules (pure). ``resolve(arg)`` turns what a
user types into one record: a report file, ``FILE:REGEX``, ``FILE:REGEX@N`` (the N-th
matching launch), ``FILE#ID`` (the launch id diagnose prints), a stage name (its newest
report), or ``cublas``/``cublaslt`` for another record's reference at the same shape.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.kernels import DTYPES, REFERENCE_FOR_DTYPE, Shape, run_reads, stage_catalogue
from perfscope.loadpool import prefetch
from perfscope.locations import LOCAL_ROOT
from perfscope.manifest import RunManifest, manifest_beside, manifest_path
from perfscope.profile import KernelProfile, compile_kernel_regex, load
from perfscope.reader import REPORT_SUFFIXES, find_reports, report_stem
from perfscope.record import Catalogue, Diagnosed, as_group, machine_settings, machine_settings_by_device
from perfscope.rules import Context, evaluate
from perfscope.stage import OperandRead, StageInfo
from perfscope.tensormaps import reads_for

log = logging.getLogger(__name__)

# What `cublas` / `cublaslt` as B stand for, by A's element type.
REFERENCE_ALIASES = ("cublas", "cublaslt")
_LAUNCH_AT = re.compile(r"^(?P<regex>.*)@(?P<n>\d+)$")
_LAUNCH_ID = re.compile(r"^(?P<file>.+)#(?P<id>\d+)$")


def stage_of(path: Path, manifest: RunManifest | None,
             catalogue: Catalogue) -> tuple[str | None, str | None]:
    """(stage, dtype) of a report: from its manifest, else from its file name.

    Reports are named ``<stage>[@params]-<dtype>-<shape>``; the fixtures
    ``cublas_sgemm_4096``. A name that starts with no stage is any program's kernel.
    """
    if manifest is not None:
        return manifest.stage, manifest.dtype
    stem = report_stem(path)
    for name in catalogue.names_longest_first():
        if stem == name or stem.startswith((f"{name}-", f"{name}_", f"{name}@")):
            rest = stem[len(name):].lstrip("-_@").split("-")
            if stem[len(name):].startswith("@"):
                rest = rest[1:]
            dtypes = catalogue.stages[name].dtypes
            dtype = rest[0] if rest and rest[0] in DTYPES else (dtypes[0] if len(dtypes) == 1 else None)
            return name, dtype
    return None, None


def _label(path: Path, kp: KernelProfile, stage: StageInfo | None, dtype: str | None,
           manifest: RunManifest | None, several: bool) -> str:
    if stage is not None:
        label = stage.name + (f" · {dtype}" if dtype else "")
        if manifest is not None and (note := stage.params_note(manifest.params)):
            label += f" ({note})"
    else:
        label = report_stem(path)
    if several:
        label += f" #{kp.identity.launch_index} {kp.name}"
    return label


def manifest_reads(manifest: RunManifest | None) -> tuple[OperandRead, ...] | None:
    """How the manifest's run read A and B by TMA, planned from the stage it names (a
    program's own kernel, or a run without a manifest: unknown)."""
    if manifest is None or not (manifest.m and manifest.n and manifest.k):
        return None
    return run_reads(manifest.stage, manifest.params, manifest.dtype,
                     Shape(manifest.m, manifest.n, manifest.k, manifest.batch))


def diagnose_profiles(path: Path, profiles: list[KernelProfile], catalogue: Catalogue,
                      several: bool | None = None,
                      machine: dict[str, float] | None = None) -> list[Diagnosed]:
    """Records for the launches of one report file (already loaded); machine: the settings
    shared by every launch judged together (default: this file's launches)."""
    manifest = manifest_beside(path)
    name, dtype = stage_of(path, manifest, catalogue)
    stage = catalogue.get(name)
    # The rules are told the stage only when a run manifest names it: a file name is a
    # guess, the manifest is what was run.
    context = Context(stage=stage if manifest is not None else None,
                      machine=machine_settings(profiles) if machine is None else machine,
                      reads=manifest_reads(manifest))
    several = len(profiles) > 1 if several is None else several
    out = []
    for kp in profiles:
        ctx = context if context.reads is not None else replace(context, reads=captured_reads(manifest, kp))
        out.append(Diagnosed(_label(path, kp, stage, dtype, manifest, several), path, kp, manifest,
                             evaluate(kp, manifest, ctx), stage, dtype, reads=ctx.reads))
    return out


def captured_reads(manifest: RunManifest | None, kp: KernelProfile) -> tuple[OperandRead, ...] | None:
    """How a launch read by TMA, from the maps `profile --tensor-maps` recorded as they were
    passed (a program's kernels, cuBLAS's), matched by mangled name, grid and block; None
    where none were."""
    if manifest is None or not manifest.tensor_maps:
        return None
    i = kp.identity
    return reads_for(manifest.tensor_maps, i.mangled, i.grid, i.block)


def load_checked(path: Path, kernel: str | None = None) -> list[KernelProfile]:
    """load, held against the launch count a program capture's run manifest records.

    A report cut after a whole result reads as complete (its framing ends cleanly), so
    fewer launches than the manifest counts is what says it was cut; every launch then
    carries the sentence (Identity.incomplete). With a kernel filter the count is unknown.
    """
    profiles = load(path, kernel)
    if kernel is not None or not profiles or profiles[0].identity.incomplete:
        return profiles
    manifest = manifest_beside(path)
    expected = manifest.capture.launches if manifest is not None and manifest.capture else 0
    if expected <= len(profiles):
        return profiles
    why = (f"{path} is incomplete: it holds {len(profiles)} of the {expected} launches its run "
           "manifest records (the file was cut short); only those are read.")
    return [replace(kp, identity=replace(kp.identity, incomplete=why)) for kp in profiles]


def default_catalogue() -> Catalogue:
    """The registry's stages, as the analysis sees them."""
    return Catalogue(stage_catalogue())


def diagnose(paths: Iterable[str | os.PathLike[str]], kernel: str | None = None,
             catalogue: Catalogue | None = None, pages: bool = False) -> list[Diagnosed]:
    """One record per profiled launch in the reports under paths (files, folders, or
    FILE#ID for one launch of a report, the name every view gives a launch). pages: the
    caller shows each kernel's source lines (many reports read in workers read them too)."""
    catalogue = catalogue or default_catalogue()
    compile_kernel_regex(kernel)       # a bad pattern is refused before any report is read
    # Each argument: one launch (FILE#ID), or the report files it names.
    given = [(one, None) if (one := _launch_selector(str(arg))) is not None
             else (None, find_reports([arg])) for arg in paths]
    # Many reports are read in worker processes first where allowed (loadpool says why);
    # the loop below then finds them in load's memory, and reads here what they could not.
    prefetch([p for _, files in given if files for p in files], kernel, pages)
    loaded = []
    for one, files in given:
        if one is not None:
            path, launch = one
            loaded.append((path, [_launch(path, launch, kernel)]))
            continue
        loaded += [(path, profiles) for path in files
                   if (profiles := load_checked(path, kernel))]
    machines = machine_settings_by_device(kp for _, profiles in loaded for kp in profiles)
    out: list[Diagnosed] = []
    for path, profiles in loaded:
        out += diagnose_profiles(path, profiles, catalogue,
                                 machine=machines[profiles[0].identity.device])
    if not out:
        raise PerfscopeError(f"no kernel matches {kernel!r} in the given reports." if kernel
                             else "no kernel launch in the given reports.")
    return out


# ------------------------------------------------------------------------- resolving


class MissingReference(PerfscopeError):
    """No report of a reference exists yet; whoever may profile can make it and retry.

    folder is where it belongs: beside A's report (the profiler stores it there).
    """

    def __init__(self, stage: str, dtype: str, shape: str, folder: Path, like: Diagnosed) -> None:
        super().__init__(f"no report of {stage} in {dtype} at {shape} beside {like.path} or under "
                         f"the reports searched; make it with `perfscope profile {stage} --dtype "
                         f"{dtype} --shape {shape} --out {folder}` on a GPU machine with Nsight Compute.")
        self.stage, self.dtype, self.shape, self.folder, self.like = stage, dtype, shape, folder, like


@dataclass(frozen=True)
class ResolveOptions:
    """How stage names are looked up: in reports/local or a reference run folder."""

    reference: Path | None = None          # a folder, or None for reports/local
    dtype: str | None = None
    catalogue: Catalogue = field(default_factory=default_catalogue)

    @property
    def root(self) -> Path:
        """The folder stage names are looked up in: the reference run folder, else reports/local."""
        return self.reference if self.reference is not None else LOCAL_ROOT


def _one_launch(path: Path, regex: str | None, index: int | None, label: str,
                catalogue: Catalogue) -> Diagnosed:
    profiles = load_checked(path, regex)
    if not profiles:
        raise PerfscopeError(f"no kernel matches {regex!r} in {path}.")
    if index is not None:
        if index >= len(profiles):
            what = f"{regex!r} matches" if regex is not None else f"{path} holds"
            raise PerfscopeError(f"{what} {len(profiles)} launch(es) in {path}; @{index} is out of "
                                 f"range (0 to {len(profiles) - 1}).")
        profiles = [profiles[index]]
    elif len(profiles) > 1 and regex is None and _is_group(path, catalogue):
        return _group_record(path, profiles, label, catalogue)
    elif len(profiles) > 1:
        names = ", ".join(sorted({p.name for p in profiles}))
        ids = ", ".join(f"#{p.identity.launch_index}" for p in profiles[:6])
        if regex is not None:
            raise PerfscopeError(f"{regex!r} matches {len(profiles)} kernel launches in {path} "
                                 f"({names}); pick one with {path}:{regex}@N or {path}#ID ({ids}).")
        raise PerfscopeError(f"{path} holds {len(profiles)} kernel launches ({names}); pick one "
                             f"with {path}:REGEX, {path}:REGEX@N or {path}#ID ({ids}).")
    return replace(diagnose_profiles(path, profiles, catalogue, several=False)[0], label=label)


def _is_group(path: Path, catalogue: Catalogue) -> bool:
    """Whether the report's run manifest names a group of launches (cublas+gelu, ...)."""
    manifest = manifest_beside(path)
    stage = catalogue.get(manifest.stage) if manifest is not None else None
    return stage is not None and stage.is_group


def _group_record(path: Path, profiles: list[KernelProfile], label: str,
                  catalogue: Catalogue) -> Diagnosed:
    """One record for a group of launches, each diagnosed on its own (record.as_group)."""
    return replace(as_group(diagnose_profiles(path, profiles, catalogue, several=True)),
                   label=label)


def _launch_selector(arg: str) -> tuple[Path, int] | None:
    """(report, launch id) for FILE#ID naming an existing report (a file whose own name
    holds '#' stays a file)."""
    if Path(arg).exists():
        return None
    m = _LAUNCH_ID.match(arg)
    if m is None or not Path(m["file"]).is_file():
        return None
    return Path(m["file"]), int(m["id"])


@dataclass(frozen=True)
class LaunchSelector:
    """A report and which of its launches, as every command names them: FILE#ID (one launch
    id), FILE:REGEX (the kernels the pattern matches) and FILE:REGEX@N (the N-th of those)."""

    path: Path
    launch_id: int | None = None
    regex: str | None = None
    nth: int | None = None


def launch_selector(arg: str) -> LaunchSelector | None:
    """FILE#ID or FILE:REGEX[@N] naming an existing file; None for anything else (a file
    whose own name holds '#' or ':' stays a file)."""
    if (one := _launch_selector(arg)) is not None:
        return LaunchSelector(one[0], launch_id=one[1])
    if ":" in arg and not Path(arg).exists():
        head, _, regex = arg.rpartition(":")
        if Path(head).is_file():
            index = None
            if (at := _LAUNCH_AT.match(regex)) is not None:
                regex, index = at["regex"] or ".", int(at["n"])
            return LaunchSelector(Path(head), regex=regex, nth=index)
    return None


def _launch(path: Path, launch: int, kernel: str | None = None) -> KernelProfile:
    """Launch #launch of a report, refused in one sentence when it has none (or when it is
    not a kernel the filter keeps)."""
    profiles = load_checked(path)
    hit = [p for p in profiles if p.identity.launch_index == launch]
    if not hit:
        raise PerfscopeError(f"{path} has no launch #{launch}; its launches are #0 to "
                             f"#{len(profiles) - 1} (perfscope diagnose lists them).")
    pattern = compile_kernel_regex(kernel)
    if pattern is not None and not (pattern.search(hit[0].name)
                                    or pattern.search(hit[0].identity.demangled)):
        raise PerfscopeError(f"{path}#{launch} is {hit[0].name}, which --kernel {kernel!r} "
                             "leaves out.")
    return hit[0]


def _by_id(path: Path, launch: int, label: str, catalogue: Catalogue) -> Diagnosed:
    hit = [_launch(path, launch)]
    return replace(diagnose_profiles(path, hit, catalogue, several=False)[0], label=label)


def _report_files(root: Path, stage: str, recursive: bool = True) -> list[Path]:
    if not root.is_dir():
        return []
    pattern = f"{stage}[-@]*"
    found = [p for p in (root.rglob(pattern) if recursive else root.glob(pattern))
             if p.name.endswith(REPORT_SUFFIXES)]
    # The folder's own reports before a subfolder's, then the newest: the reference run's
    # top level is its ladder at 4096^3, and its subfolders hold other shapes or
    # configurations (large/ the stream-K step at 8192^3, probes/ single questions), which a
    # checkout's file times would otherwise put first at random.
    return sorted(found, key=lambda p: (len(p.relative_to(root).parts), -p.stat().st_mtime))


def resolve(arg: str, options: ResolveOptions | None = None, like: Diagnosed | None = None
            ) -> Diagnosed:
    """A report file, FILE:REGEX[@N], FILE#ID, a stage name, or cublas/cublaslt (given like)."""
    options = options or ResolveOptions()
    cat = options.catalogue
    path = Path(arg)
    if path.is_file():
        return _one_launch(path, None, None, arg, cat)
    if path.is_dir():
        raise PerfscopeError(f"{arg} is a folder; name one report in it (perfscope diagnose {arg} "
                             "lists them).")
    if (sel := launch_selector(arg)) is not None:
        if sel.launch_id is not None:
            return _by_id(sel.path, sel.launch_id, arg, cat)
        compile_kernel_regex(sel.regex)
        return _one_launch(sel.path, sel.regex, sel.nth, arg, cat)
    if arg in REFERENCE_ALIASES:
        return _reference_of(arg, like, options)
    if arg not in cat.stages:
        raise PerfscopeError(f"{arg!r} is neither a report file nor a stage; stages: "
                             f"{', '.join(cat.stages)}.")
    m = like.manifest if like is not None else None
    if m is not None and m.shape_known and m.dtype:
        # B named by stage beside an A of known shape: B's report at that shape and dtype.
        try:
            return _newest(arg, m.dtype, m.shape, options)
        except PerfscopeError:
            pass
    return _newest(arg, options.dtype, None, options)


def _reference_of(alias: str, like: Diagnosed | None, options: ResolveOptions) -> Diagnosed:
    if like is None:
        raise PerfscopeError(f"'{alias}' names A's reference, so it goes second: perfscope diff A "
                             f"{alias}.")
    m = like.manifest
    if m is None or not m.dtype or not m.shape_known:
        why = ("has a run manifest without them" if m is not None else
               f"has a run manifest ({manifest_path(like.path).name}) this perfscope cannot read"
               if manifest_path(like.path).is_file() else "has no run manifest")
        raise PerfscopeError(f"'{alias}' needs A's GEMM shape and dtype, and {like.path} {why}: "
                             "profile A with --shape MxNxK --dtype D (or name the reference's "
                             "report).")
    # A fused stage's "cublas" is the group that computes the same epilogue unfused.
    own = like.stage.reference_for(m.dtype) if like.stage is not None else None
    stage = own if alias == "cublas" and own else reference_stage(alias, m.dtype)
    # Beside A first: that is where a reference made for A is stored.
    beside = [f for f in _report_files(like.path.parent, stage, recursive=False)
              if f"-{m.dtype}-" in f.name and report_stem(f).endswith(f"-{m.shape}")]
    if beside:
        return _one_launch(beside[0], None, None, f"{stage} ({beside[0].name})", options.catalogue)
    try:
        return _newest(stage, m.dtype, m.shape, options, like)
    except MissingReference:
        raise MissingReference(stage, m.dtype, m.shape, like.path.parent, like) from None


def reference_stage(alias: str, dtype: str) -> str:
    """The stage that stands for cublas/cublaslt at an element type."""
    base = REFERENCE_FOR_DTYPE.get(dtype)
    if base is None:
        raise PerfscopeError(f"no cuBLAS reference is known for dtype {dtype!r}.")
    # fp8's reference is cuBLASLt's already (cuBLAS through CuPy has no FP8): both aliases.
    return base if alias == "cublas" else base.replace("cublas_", "cublaslt_")


def _newest(stage: str, dtype: str | None, shape: str | None, options: ResolveOptions,
            like: Diagnosed | None = None) -> Diagnosed:
    root = options.root
    files = _report_files(root, stage)
    info = options.catalogue.get(stage)
    if not dtype and files and info is not None:
        # A stage reported in several dtypes means its first one unless --dtype says.
        first = info.dtypes[0]
        if any(f"-{first}-" in f.name for f in files):
            dtype = first
    if dtype:
        files = [f for f in files if f"-{dtype}-" in f.name]
    if shape:
        files = [f for f in files if report_stem(f).endswith(f"-{shape}")]
    if not files:
        if like is not None:
            raise MissingReference(stage, dtype or "", shape or "", root, like)
        hint = "" if options.reference is not None else " (add --reference for the committed H200 run)"
        have = sorted({report_stem(p).split("-")[0].split("@")[0] for p in root.rglob("*")
                       if p.name.endswith(REPORT_SUFFIXES)}) if root.is_dir() else []
        raise PerfscopeError(f"no report of {stage}" + (f" in {dtype}" if dtype else "")
                             + f" under {root.resolve()}{hint}; stages with reports there: "
                             + (", ".join(have) or "none") + ".")
    return _one_launch(files[0], None, None, f"{stage} ({files[0].name})", options.catalogue)


def resolve_pair(a: str, b: str, options: ResolveOptions,
                 make_reference: Callable[[MissingReference], None] | None = None
                 ) -> tuple[Diagnosed, Diagnosed]:
    """A and B for a diff; a missing cublas/cublaslt reference is made by make_reference
    (the profiler, when the caller may use the GPU) and looked up again."""
    side_a = resolve(a, options)
    try:
        side_b = resolve(b, options, like=side_a)
    except MissingReference as missing:
        if make_reference is None:
            raise
        make_reference(missing)
        side_b = resolve(b, options, like=side_a)
    return side_a, side_b
