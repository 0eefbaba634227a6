"""Correctness: a stage that computes a wrong answer is reported as wrong, never as fast.

Read from the run manifest only (a report cannot know the result was wrong); without a
manifest both rules are "not evaluated".
"""

from __future__ import annotations

from perfscope.manifest import OK, WRONG
from perfscope.manifest import UNVERIFIED as UNVERIFIED_VERDICT
from perfscope.rules.model import Evidence, Hit, Inputs, Rule


def _check_wrong(inputs: Inputs) -> Hit | None:
    """Symptom: the run manifest's verification verdict is WRONG.
    Why: a wrong kernel's speed means nothing, and tuning it wastes the effort
    (seed 000 §6.1 trap 5, §6.3 row 4).
    Fix: debug on small and unaligned shapes against the float64 reference first.
    Estimate: none (correctness is not a speed-up).
    Example:
        before: if (row < M) C[row * N + col] = acc;   // col never checked: 4100 x 4100 wrong
        after:  if (row < M && col < N) C[row * N + col] = acc;
    Source: seed 000 §6.1 trap 5, §6.2, §6.3 row 4."""
    m = inputs.need_manifest()
    v = m.verification
    if v.verdict != WRONG:
        return None
    ev = [Evidence("verification verdict (run manifest)", v.verdict, OK)]
    if v.rel_fro_error is not None:
        ev.append(Evidence("relative Frobenius error vs float64", v.rel_fro_error,
                           f"<= {v.tolerance}" if v.tolerance is not None else "tolerance"))
    if v.bad_elements:
        ev.append(Evidence("elements outside the bound", float(v.bad_elements), "0"))
    return Hit(tuple(ev), None)


INCORRECT = Rule(
    code="PS190", tag="incorrect-result", title="The stage computes a wrong result",
    severity="error",
    metrics=(),
    check=_check_wrong,
    fix="Fix correctness before tuning: run the shapes 1x1x1, 2x3x4 and 1000x2000x500 against the "
        "float64 reference, check tile-edge bounds, the __syncthreads() around shared-tile reuse "
        "and the cp.async wait_group depth, then profile again.",
    reference="CUDA C++ Best Practices Guide: Numerical Accuracy and Precision; "
              "compute-sanitizer (memcheck, racecheck)",
)


def _check_unverified(inputs: Inputs) -> Hit | None:
    """Symptom: the run manifest says verification did not complete (an error or a
    refusal), so nobody knows whether the profiled kernel is correct.
    Why: tuning a kernel not known to be correct is seed 000's fifth trap.
    Fix: rerun with verification and fix what stopped it.
    Estimate: none.
    Example:
        before: perfscope profile my_stage            # verification: error (launch failed)
        after:  perfscope bench my_stage --check-only  # ok, then profile
    Source: seed 000 §6.1 trap 5, §6.2."""
    m = inputs.need_manifest()
    v = m.verification
    # A program's kernel is never verified by perfscope (its inputs are the program's):
    # "unverified" is what it is, not a run that failed to verify.
    if v.verdict in (OK, WRONG, UNVERIFIED_VERDICT):
        return None
    return Hit((Evidence("verification verdict (run manifest)", v.verdict, OK),
                *((Evidence("verification detail", v.detail, "-"),) if v.detail else ())), None)


UNVERIFIED = Rule(
    code="PS191", tag="incorrect-result", title="The profiled run was not verified",
    severity="warning",
    metrics=(),
    check=_check_unverified,
    fix="Rerun the stage with verification against the float64 reference (perfscope bench "
        "--check-only) and fix what stopped it before reading its profile.",
    reference="CUDA C++ Best Practices Guide: Numerical Accuracy and Precision",
)

RULES = (INCORRECT, UNVERIFIED)
