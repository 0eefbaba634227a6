"""The child process that profiles a tune's best and worst configurations and diffs them.

    python -m perfscope.tune.profiled REQUEST.json RESULT.json
    python -m perfscope.tune.profiled --check      (exit 0: the ncu found; 1: why none)

``perfscope tune --profile-best K`` writes REQUEST.json ({"out": folder, "timeout": s,
"pairs": [{stage, dtype, shape, best: params, worst: params}]}) and reads RESULT.json back
({"pairs": [one diff summary per pair, in order]} or {"error": sentence}). Every
configuration is profiled in one ncu process over one runner (perfscope.profiling; a
report that already exists is reused), then each pair is diffed with perfscope.diff: A is
the worst, B the best, so the verdict reads "why the worst is slower than the best", in
perfscope's own findings.

It runs apart from the tune because loading reports brings in Nsight Compute's reader,
which must never share a process with the CuPy of a GPU worker, and the coordinator
stays light.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from perfscope import diagnosis, profiling
from perfscope.diff import compare
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec, parse_shape
from perfscope.ncu import find_ncu, ncu_version
from perfscope.render.diff import verdict_lines
from perfscope.runner import RunnerJob, stem_for
from perfscope.tune.space import Config

log = logging.getLogger("perfscope.tune.profiled")


def _job(stage: str, dtype: str, shape: str, params: dict[str, int]) -> RunnerJob:
    defaults = get_spec(stage).param_dict
    changed = {k: v for k, v in params.items() if defaults.get(k) != v}
    return RunnerJob(stem_for(stage, dtype, shape, changed), stage, dtype, shape, changed)


def _label(job: RunnerJob) -> str:
    spec = get_spec(job.stage)
    return Config.of(spec, job.params).label(spec.param_dict)


def _finding(f: Any) -> str:
    return f"{f.code} {f.title}"


def profile_pairs(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Profile every configuration of the request's pairs once, then diff each pair."""
    pairs = []
    jobs: dict[str, RunnerJob] = {}
    for p in request["pairs"]:
        best = _job(p["stage"], p["dtype"], p["shape"], p["best"])
        worst = _job(p["stage"], p["dtype"], p["shape"], p["worst"])
        jobs.setdefault(best.stem, best)
        jobs.setdefault(worst.stem, worst)
        pairs.append((p, best, worst))
    req = profiling.ProfileRequest(stages=tuple(sorted({j.stage for j in jobs.values()})),
                                   out=Path(request["out"]), resume=True,
                                   timeout=request.get("timeout"))
    summary = profiling.profile_stages(req, plan=profiling.ProfilePlan(tuple(jobs.values()), ()))
    reports = {r.stem: r for r in summary.results}
    out = []
    for p, best, worst in pairs:
        entry: dict[str, Any] = {"best": _label(best), "worst": _label(worst)}
        b, w = reports.get(best.stem), reports.get(worst.stem)
        if b is None or b.report is None or w is None or w.report is None:
            why = "; ".join(f"{r.stem}: {r.verdict} {r.detail}".strip() for r in (b, w)
                            if r is not None and r.report is None)
            entry["error"] = why or "ncu made no report of this pair"
            out.append(entry)
            continue
        d = compare(diagnosis.diagnose([w.report])[0], diagnosis.diagnose([b.report])[0],
                    parse_shape(p["shape"]).flops)
        cycles = d.fields().get("cycles_ratio")
        entry.update({
            "best_report": str(b.report), "worst_report": str(w.report),
            "cycles_ratio": cycles if cycles is not None and math.isfinite(cycles) else None,
            "verdict": verdict_lines(d),
            "new_findings": [_finding(f) for f in d.new_findings],
            "gone_findings": [_finding(f) for f in d.gone_findings],
        })
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    """Profile and diff what REQUEST.json asks for, or check for ncu (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        # Asked by the tune before it starts: is there an ncu this perfscope can run?
        try:
            exe = find_ncu()
            ncu_version(exe)
        except PerfscopeError as exc:
            print(exc)
            return 1
        print(exe)
        return 0
    if len(args) != 2:
        print("usage: python -m perfscope.tune.profiled REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text())
    try:
        result: dict[str, Any] = {"pairs": profile_pairs(request)}
    except PerfscopeError as exc:
        result = {"error": str(exc)}
    except KeyboardInterrupt:
        result = {"error": "interrupted while profiling"}
    Path(args[1]).write_text(json.dumps(result, allow_nan=False, default=str))
    return 0 if "pairs" in result else 1


if __name__ == "__main__":
    sys.exit(main())
