"""Tuned configurations fed back: `bench`, `profile` and `diff` with --config best or --param.

``--config best`` reads the tune store for the one stage named, its dtype and the shape:
the verified configuration with the highest ratio to cuBLAS (its confirmation when it has
one). Explicit ``--param KEY=VALUE`` are laid over it. ``diff`` then names the stage's
report for exactly those parameters (``<stage>@K=V,...-<dtype>-<shape>``, what `profile`
writes for them). A best configuration measured on another version of the stage's source
(the source hash its trial carries) is still taken, with a warning that says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from perfscope.digest import source_hash
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec, normalize_dtype, parse_shape
from perfscope.kernels.spec import parse_params
from perfscope.reader import REPORT_SUFFIXES
from perfscope.runner import stem_for
from perfscope.tune.store import DEFAULT_STORE, best_trial

log = logging.getLogger(__name__)

CONFIGS = ("best",)


@dataclass(frozen=True)
class ConfigChoice:
    """What a command was told: --param items, --config, --store, for which stages."""

    params: tuple[str, ...] = ()
    config: str | None = None
    store: Path | None = None
    stages: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    shape: str | None = None


def chosen_params(choice: ConfigChoice) -> dict[str, int]:
    """The template parameters to run with: the store's best (with --config best) under
    the explicit --param items; refusals are one sentence."""
    explicit = parse_params(list(choice.params))
    if choice.config is None:
        if choice.store is not None:
            raise PerfscopeError("--store is read by --config best; add --config best, or drop --store")
        return explicit
    if choice.config not in CONFIGS:
        raise PerfscopeError(f"--config {choice.config!r} is not known; use --config best (the "
                             "best configuration the tune store holds for the stage and shape)")
    stage, dtype, shape = _one_stage(choice)
    best = best_trial(choice.store or DEFAULT_STORE, stage, dtype, parse_shape(shape))
    spec = get_spec(stage)
    now = source_hash(spec.source_path().read_text(), spec.kernel_dir)
    if best.key.source != now:
        # A comment edit changes the hash too, so this is a warning, not a refusal.
        log.warning("the tune store's best configuration of %s was measured on another version "
                    "of %s and its headers (source hash %s, now %s): its ranking may not hold; "
                    "`perfscope tune %s --dtype %s --shape %s` measures it again", stage,
                    spec.source, best.key.source, now, stage, dtype, shape)
    return {**best.params, **explicit}


def _one_stage(choice: ConfigChoice) -> tuple[str, str, str]:
    if len(choice.stages) != 1 or choice.stages[0] == "all":
        raise PerfscopeError("--config best reads one stage's best configuration: name exactly one "
                             "stage")
    if len(choice.dtypes) > 1:
        raise PerfscopeError("--config best is per dtype: give --dtype once")
    spec = get_spec(choice.stages[0])
    dtype = normalize_dtype(choice.dtypes[0]) if choice.dtypes else spec.dtypes[0]
    spec.check_dtype(dtype)
    if choice.shape is None:
        raise PerfscopeError("--config best is per shape: give --shape MxNxK")
    return spec.name, dtype, choice.shape


def configured_report(root: Path, stage: str, dtype: str | None, shape: str | None,
                      params: dict[str, int]) -> Path:
    """The newest report under root of stage run with params (what `profile --param` or
    `profile --config best` wrote), or a sentence saying how to make it."""
    if Path(stage).exists() or ":" in stage or "#" in stage:
        raise PerfscopeError(f"--param and --config best pick a stage's report, so A must be a stage "
                             f"name, not {stage}")
    spec = get_spec(stage)
    if shape is None:
        raise PerfscopeError("a stage with --param or --config best names one configuration at one "
                             "shape: give --shape MxNxK")
    dtype = normalize_dtype(dtype) if dtype else spec.dtypes[0]
    shape = str(parse_shape(shape))
    spec.with_params(**params)   # an unknown parameter is refused here
    changed = {k: v for k, v in params.items() if spec.param_dict.get(k) != v}
    stem = stem_for(stage, dtype, shape, changed)
    found = [p for p in (root.rglob(f"{stem}.*") if root.is_dir() else [])
             if p.name in {stem + s for s in REPORT_SUFFIXES}]
    if not found:
        flags = " ".join(f"--param {k}={v}" for k, v in changed.items())
        raise PerfscopeError(f"no report of {stem} under {root}; make it with `perfscope profile "
                             f"{stage} --dtype {dtype} --shape {shape}{' ' + flags if flags else ''}`")
    return max(found, key=lambda p: p.stat().st_mtime)

