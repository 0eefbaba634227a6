"""A kernel change measured against what it replaced: alternating rounds in one process.

    PYTHONPATH=. python3 benchmarks/kernel_ab.py --against OLD_KERNEL_DIR --case CASE ... --out F.jsonl
    PYTHONPATH=. python3 benchmarks/kernel_ab.py --versus STAGE[:K=V,...] --case CASE ... --out F.jsonl

CASE is ``STAGE[:K=V,...]@MxNxK/DTYPE`` (hgemm_small_m's tile parameters are the host's
choice for the shape unless given). With ``--against`` (a folder holding another
revision's ``perfscope/kernels``, e.g. ``git archive REV perfscope/kernels | tar x -C D``
then ``D/perfscope/kernels``) each case is built from this tree and from that folder; with
``--versus`` each case is held against that stage of this tree at the same shape. Both
sides are verified against float64, then timed in alternating rounds after an L2 flush
(perfscope.timing.time_stage: the ratio is the other side's time over the case's, so
above 1 the case is faster); the case is also timed against its cuBLAS reference. One JSON
line per case goes to ``--out`` and a line of text to the terminal. ``--until F`` adds
rounds past ``--rounds`` (up to ``--max-rounds``) until the ratio's distribution-free 90%
interval of its median is within +-F of it, as ``perfscope bench --until`` does.
``--probe`` times a case whose output is wrong (a probe that skips work on purpose, to
measure what that work costs); the row keeps its verdicts and says ``"probe": true``, and
the other side must still verify. ``--label NAME`` writes ``"variant": NAME`` into every row,
so a probe file says which patch each row measured (probes/README's variants).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfscope.errors import PerfscopeError  # noqa: E402
from perfscope.kernels import get_spec  # noqa: E402
from perfscope.kernels.fused_specs import small_m_for  # noqa: E402
from perfscope.kernels.spec import KernelSpec, parse_params, parse_shape  # noqa: E402
from perfscope.manifest import OK, WRONG  # noqa: E402
from perfscope.timing import BenchOptions  # noqa: E402

log = logging.getLogger("kernel_ab")

# Launches per round, and rounds of the case against its cuBLAS reference (the comparison
# with the other side takes --rounds).
RUNS = 20
REFERENCE_ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class Case:
    """One stage at one configuration, shape and dtype."""

    spec: KernelSpec
    shape_text: str
    dtype: str


def parse_stage(text: str) -> tuple[KernelSpec, dict[str, int]]:
    """``STAGE[:K=V,...]`` -> the stage's spec with those parameters, and the parameters."""
    name, _, params = text.partition(":")
    spec = get_spec(name)
    pinned = parse_params(params.split(",")) if params else {}
    return (spec.with_params(**pinned) if pinned else spec), pinned


def parse_case(text: str) -> Case:
    """``STAGE[:K=V,...]@MxNxK/DTYPE`` -> a Case; PerfscopeError names what is wrong."""
    stage, at, rest = text.partition("@")
    shape_text, slash, dtype = rest.partition("/")
    if not at or not slash or not dtype:
        raise PerfscopeError(f"case {text!r} is not STAGE[:K=V,...]@MxNxK/DTYPE")
    spec, pinned = parse_stage(stage)
    spec.check_dtype(dtype)
    spec = small_m_for(spec, parse_shape(shape_text), pinned)
    return Case(spec, shape_text, dtype)


def _spread(t) -> dict | None:
    return None if t is None else {k: round(v, 4) for k, v in dataclasses.asdict(t).items()}


def timed(verdicts: list[str], probe: bool) -> bool:
    """Whether a case with these verdicts (the case's, the other side's) is timed: both
    ok, or a probe's case wrong (it ran, its output is not the product) with the other
    side ok."""
    return verdicts[1] == OK and (verdicts[0] == OK or (probe and verdicts[0] == WRONG))


def run_case(case: Case, other: KernelSpec, opts: BenchOptions, probe: bool = False,
             label: str | None = None) -> dict:
    """Verify both sides, time them in alternating rounds (opts: how many), and the case
    against cuBLAS (a probe's case is timed when wrong: see timed); label names the variant
    the row measured."""
    from perfscope.bench import reference_spec
    from perfscope.kernels.launch import prepare
    from perfscope.timing import time_stage
    from perfscope.verify import verify

    shape = parse_shape(case.shape_text)
    new, old = prepare(case.spec, case.dtype, shape), prepare(other, case.dtype, shape)
    verdicts = [verify(new, 1).verdict, verify(old, 1).verdict]
    row = {"stage": case.spec.name, "params": case.spec.param_dict, "shape": case.shape_text,
           "dtype": case.dtype, "other": {"stage": other.name, "params": other.param_dict,
                                          "kernel_dir": str(other.kernel_dir)},
           "verify": verdicts}
    if label is not None:
        row["variant"] = label
    if probe:
        row["probe"] = True
    if not timed(verdicts, probe):
        return row
    t = time_stage(new, old, opts)
    row.update(speed_over_other=_spread(t.ratio_to_reference), round_ratios=list(t.round_ratios),
               time_ms=_spread(t.time_ms), other_time_ms=_spread(t.reference_time_ms),
               sm_clock_mhz=_spread(t.sm_clock_mhz))
    ref = prepare(reference_spec(case.dtype, case.spec), case.dtype, shape)
    row["reference"] = ref.spec.name
    row["vs_reference"] = _spread(time_stage(new, ref, BenchOptions(
        runs=RUNS, rounds=REFERENCE_ROUNDS, warmup=3)).ratio_to_reference)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", required=True, help="STAGE[:K=V,...]@MxNxK/DTYPE")
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--against", type=Path, help="another revision's perfscope/kernels folder")
    side.add_argument("--versus", help="STAGE[:K=V,...] of this tree to hold each case against")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--until", type=float, default=None,
                    help="add rounds until the ratio's 90%% interval of its median is within "
                         "+-UNTIL of it (bench --until), up to --max-rounds")
    ap.add_argument("--max-rounds", type=int, default=15)
    ap.add_argument("--probe", action="store_true",
                    help="time the case even where its output is wrong (a probe that skips "
                         "work on purpose); the other side must verify")
    ap.add_argument("--label", help="the variant every row measured (its \"variant\" field)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.label is not None and not args.label.strip():
        print("kernel_ab: --label is empty; name the variant the rows measure", file=sys.stderr)
        return 2
    try:
        cases = [parse_case(c) for c in args.case]
        versus = parse_stage(args.versus)[0] if args.versus else None
        for case in cases:
            if versus is not None:
                versus.check_dtype(case.dtype)
    except PerfscopeError as exc:
        print(f"kernel_ab: {exc}", file=sys.stderr)
        return 2
    if args.against is not None and not (args.against / "hopper.cuh").is_file():
        print(f"kernel_ab: {args.against} holds no perfscope kernels (no hopper.cuh)",
              file=sys.stderr)
        return 2
    try:
        opts = BenchOptions(runs=RUNS, rounds=args.rounds, warmup=3, until=args.until,
                            max_rounds=args.max_rounds)
    except PerfscopeError as exc:
        print(f"kernel_ab: {exc}", file=sys.stderr)
        return 2
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("kernel_ab: needs CuPy and an NVIDIA GPU, and this machine has no CuPy",
              file=sys.stderr)
        return 2
    with args.out.open("w") as out:
        for case in cases:
            if versus is not None:
                other = small_m_for(versus, parse_shape(case.shape_text))
            else:
                other = dataclasses.replace(case.spec, kernel_dir=args.against.resolve())
            try:
                row = run_case(case, other, opts, args.probe, args.label)
            except PerfscopeError as exc:
                # The lines already written stay: each was flushed as its case finished.
                print(f"kernel_ab: {case.spec.name} at {case.shape_text} ({case.dtype}): {exc}",
                      file=sys.stderr)
                return 2
            out.write(json.dumps(row) + "\n")
            out.flush()
            s, r = row.get("speed_over_other") or {}, row.get("vs_reference") or {}
            print(f"{case.spec.name} {case.shape_text} {case.dtype} {row['verify']}: "
                  f"{s.get('median', float('nan')):.4f} ({s.get('min', float('nan')):.4f}-"
                  f"{s.get('max', float('nan')):.4f}) of the other's speed; "
                  f"{r.get('median', float('nan')):.4f} of {row.get('reference', '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
