"""The source view: a kernel's hottest source lines, with their SASS and stall samples.

    view = source_view(profile, manifest.compile if manifest else None)
    for line in view.lines:
        print(line.file, line.line, line.text, line.samples)
        for s in line.sass:
            print("   ", hex(s.address), s.sass, s.samples, s.reasons)

What Nsight Compute's Source page shows in its GUI, for a page a reviewer opens from a
pull request: the warp-state samples of every PC (``smsp__pcsamp_sample_count`` and its
per-reason siblings) summed per source line through the report's line table, the lines
ranked by samples, and under each line the SASS instructions it compiled to.

The text of a line comes from, in this order:

1. the report itself, when ncu embedded the file (``--import-source yes``: the Triton
   captures carry their Python; perfscope's own stages do not, because NVRTC names the
   file e.g. ``hgemm.cu`` and ncu cannot find it to import);
2. for a ladder stage (a run manifest with a compile record), the copy the run keeps
   beside its reports (``sources/`` next to the report: a reference run outlives edits
   to the kernels; a folder holding reports of several trees keeps an older tree's files,
   by hand, under ``sources/<source hash>/``, looked at first), else the checkout's copy
   in ``perfscope/kernels/``, whichever hashes
   to the source hash the manifest recorded (same recipe as the build, perfscope.digest);
   a copy that hashes otherwise is not shown, since its line numbers would point at
   other code;
3. for any other report, the file at the path the line table names, when it exists on
   this machine (not checked: nothing recorded what was compiled);
4. else no text, and the view says why.

It reads the report lazily (through ``KernelProfile.correlation``), when a page asks:
diagnose never pays for it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from perfscope.digest import local_headers, source_hash
from perfscope.locations import KERNEL_SOURCES
from perfscope.manifest import CompileInfo
from perfscope.profile import KernelProfile

log = logging.getLogger(__name__)

HOT_LINES = 5            # source lines shown per kernel, most samples first
# ... of those, the ones holding at least this share of the samples (the hottest always):
# a line with 0.1% of the time is not where a reviewer looks, and each costs a SASS table.
MIN_LINE_SHARE = 0.02
SASS_PER_LINE = 3        # SASS instructions shown under a line (its hottest, in address order)
TOP_REASONS = 3          # stall reasons named per line (per instruction: the top 2)
MAX_TEXT = 160           # characters of a source line shown
CONTEXT_LINES = 3        # lines of the same statement shown above a hot continuation line

# Where a line's text comes from (SourceFile.origin).
EMBEDDED = "embedded"    # the report's own copy
RUN = "run"              # sources/ (or sources/<hash>/) beside the report, hash-verified
CHECKOUT = "checkout"    # perfscope/kernels/, verified against the manifest's source hash
DISK = "disk"            # the path on this machine, unverified
DIFFERS = "differs"      # the checkout's copy is not what was compiled: no text
MISSING = "missing"      # nowhere to be read: no text


@dataclass(frozen=True)
class SourceFile:
    """One file of the line table and where its text came from (or why there is none)."""

    name: str            # as the report's line table names it
    shown: str           # as the page names it
    origin: str          # EMBEDDED / CHECKOUT / DISK / DIFFERS / MISSING
    note: str            # one sentence a reader can check

    @property
    def has_text(self) -> bool:
        """Whether the file's text can be shown (embedded, or read from a verified or local copy)."""
        return self.origin in (EMBEDDED, RUN, CHECKOUT, DISK)


@dataclass(frozen=True)
class SassLine:
    """One SASS instruction under a source line."""

    address: int                           # offset from the kernel's first instruction
    sass: str
    samples: int
    reasons: tuple[tuple[str, int], ...]   # top stall reasons at this instruction


@dataclass(frozen=True)
class SourceLine:
    """One source line, its samples summed over the instructions it compiled to."""

    file: str                              # SourceFile.shown
    line: int
    text: str | None                       # None: the file's text is not available
    samples: int
    share: float | None                    # of all the kernel's samples
    reasons: tuple[tuple[str, int], ...]
    sass: tuple[SassLine, ...]             # the hottest SASS_PER_LINE, in address order
    other_sass: int = 0                    # instructions of this line left out
    other_samples: int = 0                 # and their samples
    # Lines above it of the same statement, when it continues one (an asm operand list).
    context: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceView:
    """A kernel's hottest source lines; ``note`` says why there are none."""

    lines: tuple[SourceLine, ...]
    files: tuple[SourceFile, ...]
    total_samples: int
    line_samples: int                      # samples at PCs the line table knows
    note: str | None = None

    @property
    def coverage(self) -> float | None:
        """Share of the kernel's samples that the line table places on a source line."""
        return self.line_samples / self.total_samples if self.total_samples else None

    @property
    def has_text(self) -> bool:
        """Whether any hot line has text to show."""
        return any(line.text is not None for line in self.lines)


# Beside a run's reports, the sources it compiled (its run manifests name them).
RUN_SOURCES = "sources"


def _copy_text(name: str, compile: CompileInfo, folder: Path) -> tuple[str | None, str | None]:
    """(text, None) of a compiled file in folder when the folder's copy of the compile's
    source hashes as recorded; (None, the hash it has) when it differs; (None, None) when
    the folder does not hold the compile's source or this file."""
    main = folder / compile.source
    if not main.is_file():
        return None, None
    main_text = main.read_text()
    base = PurePosixPath(name).name
    if base not in {compile.source, *(n for n, _ in local_headers(main_text, folder))}:
        return None, None
    on_disk = source_hash(main_text, folder)
    if on_disk != compile.source_hash:
        return None, on_disk
    return (folder / base).read_text(), None


def _stage_file(name: str, compile: CompileInfo, run_dir: Path | None, kernel_dir: Path
                ) -> tuple[SourceFile, list[str] | None] | None:
    """A ladder stage's file from the run's sources or the checkout, hash-checked."""
    base = PurePosixPath(name).name
    # A run folder that holds reports compiled from several trees keeps each older tree's
    # sources under sources/<source hash>/, beside the newest in sources/ itself.
    # Only a hash as perfscope.digest writes it names a folder (never a path out of sources/).
    kept = compile.source_hash if re.fullmatch(r"[0-9a-f]{16}", compile.source_hash or "") else None
    places = [*([(run_dir / kept, RUN, f"{RUN_SOURCES}/{kept}/{base}")] if kept else []),
              (run_dir, RUN, f"{RUN_SOURCES}/{base}"),
              (kernel_dir, CHECKOUT, f"perfscope/kernels/{base}")] if run_dir else \
        [(kernel_dir, CHECKOUT, f"perfscope/kernels/{base}")]
    where = {RUN: "the run's copy beside its reports", CHECKOUT: "the checkout's copy"}
    differs = None
    for folder, origin, shown in places:
        text, other = _copy_text(name, compile, folder)
        if text is not None:
            return SourceFile(name, shown, origin, f"{shown}: {where[origin]}, the source the run "
                              f"manifest recorded (source hash {compile.source_hash})."), \
                text.splitlines()
        if other is not None and differs is None:
            differs = (shown, other)
    if differs is None:
        return None
    shown, other = differs
    return SourceFile(name, shown, DIFFERS, f"{shown} differs from the source this kernel was "
                      f"compiled from (source hash {compile.source_hash} in the run manifest, "
                      f"{other} on disk): its lines are not shown, since their numbers would "
                      "point at other code."), None


def _resolve(name: str, embedded: Mapping[str, str], compile: CompileInfo | None,
             dirs: tuple[Path | None, Path]) -> tuple[SourceFile, list[str] | None]:
    """The file's SourceFile and its lines (None without text); dirs: the run's sources
    folder (or None) and the checkout's kernel folder."""
    text = embedded.get(name) or None
    if text is not None:
        return SourceFile(name, name, EMBEDDED, f"{name}: embedded in the report "
                          "(ncu --import-source)."), text.splitlines()
    if compile is not None and (staged := _stage_file(name, compile, *dirs)) is not None:
        return staged
    path = Path(name)
    if path.is_file():
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as exc:
            log.info("cannot read %s: %s", path, exc)
        else:
            return SourceFile(name, name, DISK, f"{name}: read from this machine, not checked "
                              "against what was compiled."), lines
    return SourceFile(name, name, MISSING, f"{name}: the report does not embed it and it is not "
                      "on this machine."), None


def _clip(text: str) -> str:
    text = text.expandtabs(4).strip()
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


def _text(lines: list[str] | None, number: int) -> str | None:
    if lines is None or not 0 < number <= len(lines):
        return None
    return _clip(lines[number - 1])


# A line that starts like this continues the statement above it (an inline-asm operand
# list, a wrapped argument list): the line table points at its last line.
_CONTINUES = (":", ")", ",", '"', "+", "-", "*", "&", "|", "?", ".")
_ENDS_STATEMENT = (";", "{", "}")


def _context(lines: list[str] | None, number: int) -> tuple[str, ...]:
    """The lines above a hot line that belong to its statement (CONTEXT_LINES at most)."""
    if lines is None or not 0 < number <= len(lines):
        return ()
    out: list[str] = []
    i = number - 1
    while i > 0 and len(out) < CONTEXT_LINES and lines[i].lstrip().startswith(_CONTINUES):
        above = lines[i - 1].rstrip()
        if not above.strip() or above.endswith(_ENDS_STATEMENT):
            break
        out.insert(0, _clip(above))
        i -= 1
    return tuple(out)


def top_reasons(counts: Mapping[str, float], n: int = TOP_REASONS) -> tuple[tuple[str, int], ...]:
    """The n stall reasons with the most samples, most first (the source view's and the
    hot-loop listing's)."""
    # "selected" samples are warps issuing, not stalled: the line's samples count them, its
    # stall reasons do not. Ties broken by name, never by a dict's insertion history.
    ranked = sorted(((k, int(v)) for k, v in counts.items() if v and k != "selected"),
                    key=lambda kv: (-kv[1], kv[0]))
    return tuple(ranked[:n])


def source_view(profile: KernelProfile, compile: CompileInfo | None = None, *,
                lines: int = HOT_LINES, kernel_dir: Path = KERNEL_SOURCES) -> SourceView:
    """The hottest source lines of one kernel (compile: its run manifest's compile record)."""
    corr = profile.correlation
    if corr is None:
        return SourceView((), (), 0, 0, "not collected (no report behind this profile)")
    samples = {pc: n for pc, n in corr.pc_samples().items() if n}
    total = int(sum(samples.values()))
    if not samples:
        return SourceView((), (), 0, 0, "not collected (no warp-state sampling in this report)")
    by_line: dict[tuple[str, int], list[int]] = {}
    for pc in samples:
        file, line = corr.source_of(pc)
        if file and line:
            by_line.setdefault((file, line), []).append(pc)
    if not by_line:
        return SourceView((), (), total, 0, "no line information: the kernel was compiled without "
                          "-lineinfo (libraries such as cuBLAS ship without it), so samples "
                          "stay on SASS (see the hottest instructions)")
    line_samples = int(sum(samples[pc] for pcs in by_line.values() for pc in pcs))
    ranked = sorted(by_line.items(), key=lambda kv: (-sum(samples[pc] for pc in kv[1]), kv[0]))
    hot = [kv for i, kv in enumerate(ranked[:lines])
           if i == 0 or sum(samples[pc] for pc in kv[1]) >= MIN_LINE_SHARE * total]
    wanted = {pc for _, pcs in hot for pc in pcs}
    reasons = corr.reason_samples(wanted)
    embedded = corr.embedded_sources()
    run_dir = Path(profile.identity.source).parent / RUN_SOURCES
    dirs = (run_dir if run_dir.is_dir() else None, kernel_dir)
    files: dict[str, tuple[SourceFile, list[str] | None]] = {}
    base = corr.function_start()
    base = min(samples) if base is None else base
    out = []
    for (file, number), pcs in hot:
        if file not in files:
            files[file] = _resolve(file, embedded, compile, dirs)
        info, text = files[file]
        pcs_ranked = sorted(pcs, key=lambda pc: (-samples[pc], pc))
        shown = sorted(pcs_ranked[:SASS_PER_LINE])
        left = pcs_ranked[SASS_PER_LINE:]
        line_reasons: dict[str, float] = {}
        for reason, per_pc in reasons.items():
            n = sum(per_pc.get(pc, 0.0) for pc in pcs)
            if n:
                line_reasons[reason] = n
        n_line = int(sum(samples[pc] for pc in pcs))
        out.append(SourceLine(
            file=info.shown, line=number, text=_text(text, number),
            context=_context(text, number), samples=n_line,
            share=n_line / total, reasons=top_reasons(line_reasons),
            sass=tuple(SassLine(int(pc - base), corr.sass_of(pc), int(samples[pc]),
                                top_reasons({r: v.get(pc, 0.0) for r, v in reasons.items()}, 2))
                       for pc in shown),
            other_sass=len(left), other_samples=int(sum(samples[pc] for pc in left))))
    return SourceView(tuple(out), tuple(f for f, _ in files.values()), total, line_samples)
