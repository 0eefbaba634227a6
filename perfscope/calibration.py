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
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from perfscope.manifest import BenchFile, RunManifest
from perfscope.record import Catalogue, Diagnosed
from perfscope.rules.engine import combine
from perfscope.rules.launch import tile_rounds

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
    measured: float                            # 1 - parent TFLOP/s / child TFLOP/s
    variant: bool
    # Whether the child's change acts at this shape (StageInfo.min_rounds): a step where it
    # does not runs the parent's path, so its measurement says nothing of the prediction.
    acts: bool = True
    shape: str = ""                            # MxNxK of the two reports and the bench run

    @property
    def error(self) -> float:
        """How far the prediction missed the measured saving."""
        return abs(self.predicted - self.measured)

    @property
    def missed(self) -> bool:
        """Saved 10% or more, and no addressed finding predicted it."""
        return (not self.variant and self.acts and self.measured >= SIGNIFICANT_SAVING
                and not any(g >= PREDICTED_MIN for _, g in self.estimates))


@dataclass(frozen=True)
class Calibration:
    """Every ladder step of a reference run, predicted against measured."""
    steps: tuple[Step, ...]
    source: str
    kind: str = "calibration"

    @property
    def counted(self) -> tuple[Step, ...]:
        """The steps that count towards the error: variants, and steps whose change does not
        act at the shape, are shown, not counted."""
        return tuple(s for s in self.steps if not s.variant and s.acts)

    @property
    def median_abs_error(self) -> float | None:
        """The median absolute error over the counted steps, None when there are none."""
        errors = [s.error for s in self.counted]
        return statistics.median(errors) if errors else None

    @property
    def missed(self) -> tuple[Step, ...]:
        """The rule gaps: steps that saved 10% or more with no addressed finding predicting it."""
        return tuple(s for s in self.steps if s.missed)

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
                "per_rule_mean_abs_error": self.per_rule(),
                "rows": [{**asdict(s), "estimates": dict(s.estimates), "error": round(s.error, 4)}
                         for s in self.steps]}

    def write(self, path: Path) -> None:
        """Write the table as JSON."""
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def _timed(bench: BenchFile, catalogue: Catalogue) -> dict[tuple[str, str, str], RunManifest]:
    """Timed runs at the stage's default parameters, by (stage, dtype, shape)."""
    out = {}
    for m in bench.manifests:
        info = catalogue.get(m.stage)
        if m.timing is None or info is None or not info.at_defaults(m.params):
            continue
        out[(m.stage, m.dtype, m.shape)] = m
    return out


def calibrate(records: Sequence[Diagnosed], bench: BenchFile, catalogue: Catalogue,
              source: str = "") -> Calibration:
    """The calibration table of a reference run: its records and its bench file."""
    timed = _timed(bench, catalogue)
    # One record per stage, dtype and shape: a folder may hold a stage at several shapes
    # (the reference run's large/ at 8192^3), each held against the bench file's own shape.
    by_stage = {(r.stage.name, r.dtype, r.manifest.shape): r for r in records
                if r.stage is not None and r.manifest is not None
                and r.stage.at_defaults(r.manifest.params)}
    steps = []
    for (name, dtype, shape), child in sorted(by_stage.items(),
                                              key=lambda kv: (kv[0][1], kv[1].stage.order)):
        info = child.stage
        parent = by_stage.get((info.parent, dtype, shape)) if info.parent else None
        if parent is None:
            continue
        t_child, t_parent = timed.get((name, dtype, shape)), timed.get((info.parent, dtype, shape))
        if t_child is None or t_parent is None:
            continue
        # Head to head when bench timed the parent in the child's rounds; else the medians
        # of separate rounds.
        h2h = t_child.timing.step_ratio(info.parent)
        speedup = (h2h.median if h2h is not None
                   else t_child.timing.tflops.median / t_parent.timing.tflops.median)
        measured = 1 - 1 / speedup
        fired = [(f.code, f.estimated_gain) for f in parent.evaluation.findings
                 if f.code in info.addresses and f.estimated_gain is not None]
        groups = {f.code: f.group for f in parent.evaluation.findings}
        predicted = combine([(groups[c], g) for c, g in fired]) or 0.0
        room = parent.evaluation.headroom
        if room is not None:
            predicted = min(predicted, room.fraction)
        steps.append(Step(info.parent, name, dtype, info.addresses, tuple(fired), round(predicted, 4),
                          round(measured, 4), info.variant,
                          info.acts(tile_rounds(child.manifest, child.profile.launch.grid_size)),
                          shape))
    return Calibration(tuple(steps), source)


def merge(*tables: Calibration) -> Calibration:
    """One table of several runs' steps (the ladder's bench.json, the fused stages'
    bench-fused.json), in order, their sources joined."""
    return Calibration(tuple(s for t in tables for s in t.steps),
                       "; ".join(t.source for t in tables if t.source))
