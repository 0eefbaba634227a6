"""Calibration: every ladder step's predicted saving held against the saving bench measured.

For each step parent -> child (the child's KernelSpec names the parent findings its
change addresses), the prediction is the parent's estimates for those findings composed
the way the rules compose a kernel's findings (the largest per overlap group, groups as
independent savings, capped at the parent's headroom), and the measurement is the share
of the parent's time the child saved in the same bench run:

    measured = 1 - child time / parent time    (both event-timed, same dtype and shape)

from the parent timed in the child's own rounds where bench did so (Timing.step_ratio),
else from the medians of their separate rounds.

A step that saved 10% or more with no addressed finding predicting it is a rule gap.
Variants (kept as declared alternatives, or slow on purpose) are shown and not counted.
HPCToolkit's GPA advisor reports 1-16% error per optimisation: that is the bar.

A step whose child measured slower than its parent is held against the diff of the two
reports instead (perfscope.diff: the child against its parent): the reasons its verdict
gives a share of the child's time, and the loss they are to explain,

    loss = 1 - parent time / child time    (a share of the child's time, as the diff's are)

A step that lost 10% or more with no reason the diff can give a share is unexplained: a
change a kernel engineer would be told nothing about by perfscope.

A fix a finding names that the ladder makes in two steps (StageInfo.completes: PS103's shared
tiles and register block, sgemm_naive -> sgemm_smem -> sgemm_reg4x4) is held against both:
a row from the grandparent through the parent, measured as the product of the two steps,

    measured = 1 - (1 - first step's) (1 - second step's)

and the first step's row, whose prediction is of the whole fix, is shown and not counted.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from perfscope.diff import compare
from perfscope.manifest import BenchFile, RunManifest
from perfscope.record import Catalogue, Diagnosed
from perfscope.rules.engine import combine
from perfscope.rules.launch import tile_rounds
from perfscope.stage import StageInfo

# A step that saved at least this share of its parent's time must have been predicted.
SIGNIFICANT_SAVING = 0.10
# ... by an addressed finding estimating at least this much.
PREDICTED_MIN = 0.03
SCHEMA = "perfscope.calibration/1"


@dataclass(frozen=True)
class Step:
    """One ladder step: what the parent's findings predicted, what bench measured."""

    parent: str
    child: str
    dtype: str
    codes: tuple[str, ...]                     # parent findings the child's change addresses
    estimates: tuple[tuple[str, float], ...]   # (code, estimate) of those that fired
    predicted: float                           # composed, capped at the parent's headroom
    # 1 - child time / parent time; None while the child has not been timed (a pending row:
    # the prediction recorded before the measurement).
    measured: float | None
    variant: bool
    # Whether the child's change acts at this shape (StageInfo.min_rounds): a step where it
    # does not runs the parent's path, so its measurement says nothing of the prediction.
    acts: bool = True
    shape: str = ""                            # MxNxK of the two reports and the bench run
    # Where the child measured slower and both were profiled: the diff's reasons with a share
    # (a finding's code, or the aspect or path a reason names) and each one's share of the
    # child's time; None where there was nothing to explain or no report of the child.
    explained: tuple[tuple[str, float], ...] | None = None
    # A row over two steps: the stage between parent and child (StageInfo.completes).
    through: str = ""
    # The first step of a fix a later stage completes: its prediction is of the whole fix,
    # held against the row through it; shown, not counted.
    partial: bool = False

    @property
    def loss(self) -> float | None:
        """The share of the child's time lost against its parent (None unless it was slower)."""
        if self.measured is None or self.measured >= 0:
            return None
        return 1 - 1 / (1 - self.measured)

    @property
    def unexplained(self) -> bool:
        """Lost 10% or more of its time where its change acts, and the diff of the two
        reports gives no reason a share of it."""
        return (self.acts and self.explained == () and self.loss is not None
                and self.loss >= SIGNIFICANT_SAVING)

    @property
    def pending(self) -> bool:
        """Predicted, not yet timed."""
        return self.measured is None

    @property
    def error(self) -> float | None:
        """How far the prediction missed the measured saving (None while pending)."""
        return None if self.measured is None else abs(self.predicted - self.measured)

    @property
    def missed(self) -> bool:
        """Saved 10% or more, and no addressed finding predicted it."""
        return (not self.variant and self.acts and self.measured is not None
                and self.measured >= SIGNIFICANT_SAVING
                and not any(g >= PREDICTED_MIN for _, g in self.estimates))


@dataclass(frozen=True)
class Calibration:
    """Every ladder step of a reference run, predicted against measured."""
    steps: tuple[Step, ...]
    source: str
    kind: str = "calibration"

    @property
    def counted(self) -> tuple[Step, ...]:
        """The steps that count towards the error: variants, steps whose change does not
        act at the shape, pending ones and the first steps of two-step fixes are shown, not
        counted."""
        return tuple(s for s in self.steps
                     if not s.variant and s.acts and not s.pending and not s.partial)

    @property
    def median_abs_error(self) -> float | None:
        """The median absolute error over the counted steps, None when there are none."""
        errors = [s.error for s in self.counted]
        return statistics.median(errors) if errors else None

    @property
    def missed(self) -> tuple[Step, ...]:
        """The rule gaps: steps that saved 10% or more with no addressed finding predicting it."""
        return tuple(s for s in self.steps if s.missed)

    @property
    def unexplained(self) -> tuple[Step, ...]:
        """The steps that lost 10% or more with no reason in the diff of their reports."""
        return tuple(s for s in self.steps if s.unexplained)

    def per_rule(self) -> dict[str, float]:
        """Mean absolute error of the steps each code was the largest addressed estimate of."""
        errors: dict[str, list[float]] = {}
        for s in self.counted:
            if s.estimates:
                code = max(s.estimates, key=lambda cg: cg[1])[0]
                errors.setdefault(code, []).append(s.error)
        return {code: round(statistics.fmean(v), 4) for code, v in sorted(errors.items())}

    def to_dict(self) -> dict:
        """The table as the JSON document (SCHEMA) it is written as."""
        return {"schema": SCHEMA, "source": self.source,
                "median_abs_error": self.median_abs_error,
                "significant_saving": SIGNIFICANT_SAVING,
                "missed": [f"{s.parent} -> {s.child} ({s.dtype})" for s in self.missed],
                "unexplained_losses": [f"{s.parent} -> {s.child} ({s.dtype}, {s.shape})"
                                       for s in self.unexplained],
                "per_rule_mean_abs_error": self.per_rule(),
                "rows": [{**asdict(s), "estimates": dict(s.estimates),
                          "error": None if s.error is None else round(s.error, 4),
                          "explained": None if s.explained is None else dict(s.explained),
                          "loss": None if s.loss is None else round(s.loss, 4)}
                         for s in self.steps]}

    def write(self, path: Path) -> None:
        """Write the table as JSON."""
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")


Config = frozenset[tuple[str, int]]


def _config(info: StageInfo, params: Mapping[str, int]) -> Config:
    """A run's parameters, those it leaves out at the stage's defaults (a parameter added
    after the run was recorded defaults to the kernel as it was)."""
    return frozenset({**info.defaults, **params}.items())


def _child_config(child: StageInfo, parent: StageInfo, parent_config: Config) -> Config:
    """The child's configuration in a step that changes only what the child adds: the
    parent run's values for every parameter the two share, the child's own at their defaults
    (hgemm_small_m_packed at the tile the host chose for hgemm_small_m)."""
    shared = {k: v for k, v in parent_config if k in child.defaults}
    return frozenset({**child.defaults, **shared}.items())


def _timed(bench: BenchFile, catalogue: Catalogue) -> dict[tuple[str, str, str, Config], RunManifest]:
    """Timed runs by (stage, dtype, shape, configuration)."""
    out = {}
    for m in bench.manifests:
        info = catalogue.get(m.stage)
        if m.timing is None or info is None:
            continue
        out[(m.stage, m.dtype, m.shape, _config(info, m.params))] = m
    return out


def _measured(child: RunManifest, parent: RunManifest, parent_name: str) -> float:
    """1 - child time / parent time: head to head when bench timed the parent in the child's
    rounds, else from the medians of their separate rounds."""
    h2h = child.timing.step_ratio(parent_name)
    speedup = (h2h.median if h2h is not None
               else child.timing.tflops.median / parent.timing.tflops.median)
    return 1 - 1 / speedup


def _predicted(parent: Diagnosed, codes: tuple[str, ...]) -> tuple[tuple[tuple[str, float], ...], float]:
    """The parent's estimates for the addressed codes that fired, and their composition
    (the largest per overlap group, groups as independent savings, capped at its headroom)."""
    fired = [(f.code, f.estimated_gain) for f in parent.evaluation.findings
             if f.code in codes and f.estimated_gain is not None]
    groups = {f.code: f.group for f in parent.evaluation.findings}
    predicted = combine([(groups[c], g) for c, g in fired]) or 0.0
    room = parent.evaluation.headroom
    if room is not None:
        predicted = min(predicted, room.fraction)
    return tuple(fired), round(predicted, 4)


def _explained(child: Diagnosed, parent: Diagnosed) -> tuple[tuple[str, float], ...]:
    """The reasons the diff of a slower child against its parent gives a share of the
    child's time: none where the child took fewer cycles under ncu (its verdict then says
    what the child improved, and nothing explains the loss the events timed)."""
    d = compare(child, parent)
    if d.improved:
        return ()
    return tuple((r.code or r.kind, round(r.estimated_gain, 4)) for r in d.verdict
                 if r.estimated_gain)


def calibrate(records: Sequence[Diagnosed], bench: BenchFile, catalogue: Catalogue,
              source: str = "") -> Calibration:
    """The calibration table of a reference run: its records and its bench file.

    A step pairs a parent run with a child run of the same dtype and shape where both are
    at their defaults (the ladder), or where the child runs the parent's configuration
    with only its own parameters added (a step that changes one thing at a tile the host
    chose). The parent must be profiled and both timed in the bench file; the child's
    report says whether the change acts at the shape (in a same-configuration step, the
    parent's stands in when the child has none). A child the bench file never timed, whose
    change an estimate of the parent's addresses, stands as a pending row: the prediction
    recorded before the timing (``measured`` None), counted once it is timed.
    """
    timed = _timed(bench, catalogue)
    ever_timed = {stage for stage, *_ in timed}
    children = [c for c in catalogue.stages.values() if c.parent]
    # One report per stage, dtype, shape and configuration: a folder's own before a
    # subfolder's (the reference run's ladder before probes/, whose reports of the same
    # stage may come from another card), so the deepest go in first and are overwritten.
    reports = {(r.stage.name, r.dtype, r.manifest.shape, _config(r.stage, r.manifest.params)): r
               for r in sorted(records, key=lambda r: -len(r.path.parts))
               if r.stage is not None and r.manifest is not None}
    steps, seen, parents = [], set(), {}
    for (name, dtype, shape, config), parent in sorted(
            reports.items(), key=lambda kv: (kv[0][1], kv[1].stage.order, kv[0][2], sorted(kv[0][3]))):
        t_parent = timed.get((name, dtype, shape, config))
        if t_parent is None:
            continue
        for child in (c for c in children if c.parent == name):
            for c_config in _child_configs(child, parent.stage, config):
                key = (child.name, dtype, shape, c_config)
                if key in seen:
                    continue
                fired, predicted = _predicted(parent, child.addresses)
                t_child, report = timed.get(key), reports.get(key)
                # Where the change acts: the child's report says. A ladder step's child
                # launches a grid of its own and needs one; a same-configuration step's
                # launches its parent's, whose report stands in.
                if report is None and c_config != _config(child, {}):
                    report = parent
                explained = None
                if t_child is not None and report is not None:
                    acts = child.acts(tile_rounds(report.manifest, report.profile.launch.grid_size))
                    measured = round(_measured(t_child, t_parent, name), 4)
                    if measured < 0 and report is not parent:
                        explained = _explained(report, parent)
                elif child.name not in ever_timed and fired and key[:3] not in seen:
                    # One pending row per child, dtype and shape: its configuration is not
                    # known until it runs.
                    acts, measured = True, None
                    seen.add(key[:3])
                else:
                    continue
                seen.add(key)
                steps.append(Step(name, child.name, dtype, child.addresses, fired, predicted,
                                  measured, child.variant, acts, shape, explained))
                parents[(name, child.name, dtype, shape)] = parent
    steps = _two_step_fixes(steps, parents, catalogue)
    steps.sort(key=lambda s: (s.dtype, catalogue.stages[s.child].order, s.shape, bool(s.through)))
    return Calibration(tuple(steps), source)


def _two_step_fixes(steps: list[Step], parents: Mapping[tuple[str, str, str, str], Diagnosed],
                    catalogue: Catalogue) -> list[Step]:
    """The steps, each first step of a fix a later stage completes marked partial, with a row
    from its parent through to that stage (both steps timed at the same dtype and shape)."""
    by_key = {(s.parent, s.child, s.dtype, s.shape): s for s in steps if not s.through}
    out = list(steps)
    for last in (c for c in catalogue.stages.values() if c.completes and c.parent):
        for (g, m, dtype, shape), first in by_key.items():
            second = by_key.get((m, last.name, dtype, shape)) if m == last.parent else None
            if second is None or first.pending or second.pending:
                continue
            fired, predicted = _predicted(parents[(g, m, dtype, shape)], last.completes)
            measured = round(1 - (1 - first.measured) * (1 - second.measured), 4)
            out.append(Step(g, last.name, dtype, last.completes, fired, predicted, measured,
                            last.variant, first.acts and second.acts, shape, through=m))
            if any(code in last.completes for code, _ in first.estimates):
                out[out.index(first)] = replace(first, partial=True)
    return out


def _child_configs(child: StageInfo, parent: StageInfo, parent_config: Config) -> tuple[Config, ...]:
    """The child configurations a parent run is a step for: both at their defaults, or the
    child at the parent run's configuration."""
    out = [_child_config(child, parent, parent_config)]
    defaults = _config(child, {})
    if parent_config == _config(parent, {}) and defaults not in out:
        out.append(defaults)
    return tuple(out)


def merge(*tables: Calibration) -> Calibration:
    """One table of several runs' steps (the ladder's bench.json, the fused stages'
    bench-fused.json), in order, their sources joined."""
    return Calibration(tuple(s for t in tables for s in t.steps),
                       "; ".join(t.source for t in tables if t.source))
