"""Correctness against a float64 reference: what decides whether a stage gets a speed.

Inputs are fresh standard-normal values (never zeros), the output is poisoned with NaN
before the launch, and the result must pass two checks against ``A·B`` computed in
float64 from the same (already rounded) inputs:

* relative Frobenius error ``||C - ref|| / ||ref||`` under 1e-5 (fp32) or 1e-2 (fp16,
  bf16, and fp8 inputs with their bf16 C), and
* elementwise ``|C - ref| <= acc_tol·(|A|·|B|) + out_tol·|ref| + abs_tol``: the first term
  bounds the fp32 accumulation error, the second the rounding of C to its dtype, so one
  wrong element (a missed k-tile, a race) fails even when the norm barely moves.

NaN or infinity anywhere fails. For fp8 (kernels/fp8.py) the inputs are standard-normal
values rounded to e4m3, decoded exactly to float64, and the reference is
``scale_a * scale_b * A·Btᵀ``.

A stage with a fused epilogue (and its unfused group reference) is checked against
``act(A·B + bias) (+ residual)`` in float64, with A scaled by 1/sqrt(K) so that A·B is of
order one, where GELU and SiLU bend; the elementwise bound grows by the activation's
slope and adds ``tanh.approx``'s error on the pre-activation value (kernels/epilogue.py).

A quantising epilogue (fp8 e4m3, int8) is checked in the quantised domain: every stored
value must lie within half a quantisation step (of the binade it falls in) plus the
scaled elementwise bound of the value the float64 reference quantises, after both are
saturated as the kernel saturates; unwritten outputs are poisoned (the fp8 NaN code,
int8 -128) and so fail; amax must match max |x| within the largest elementwise bound.
Given outputs that fp32 computes exactly (tests/test_gpu_fused.py), the rounding is held
bit for bit against :func:`perfscope.kernels.epilogue.quantised` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfscope.kernels.epilogue import (
    ACT_TOL,
    DEFAULT_QUANT_SCALE,
    E4M3_MAX,
    INT8_MAX,
    INT8_MIN,
    MAX_SLOPE,
    Epilogue,
    EpilogueOperands,
    apply,
    check_quant_scale,
    decoded,
    e4m3_step,
)
from perfscope.kernels.fp8 import FP8, fp8_operands_f64, make_fp8_inputs, scale_product
from perfscope.kernels.fused_specs import output_dtype
from perfscope.kernels.launch import Prepared, numpy_dtype, output_array, require_gpu
from perfscope.kernels.spec import Shape
from perfscope.manifest import OK, WRONG, Verification

# dtype -> (Frobenius tolerance, accumulation tolerance, output rounding, absolute floor)
TOLERANCES: dict[str, tuple[float, float, float, float]] = {
    "fp32": (1e-5, 1e-5, 1e-6, 1e-6),
    # fp16 rounds C to 11 significant bits (2^-11 relative), bf16 to 8 (2^-8); twice that.
    "fp16": (1e-2, 2e-3, 1e-3, 1e-5),
    "bf16": (1e-2, 2e-3, 8e-3, 1e-5),
    # e4m3 inputs (exact in float64 once decoded), C rounded to bf16: bf16's bounds.
    "fp8": (1e-2, 2e-3, 8e-3, 1e-5),
}
# A quantised C: e4m3 keeps 4 significant bits (relative rounding error up to 2^-4, about
# 2.4% RMS over many values), int8 steps of 1 on values of order 16-100.
QUANT_FRO_TOL = 0.05
# The poison a quantised output starts as: e4m3's NaN code, int8's -128 (which a run whose
# outputs stay above -127.5 never stores).
QUANT_POISON = {"fp8": 0x7F, "int8": -128}

CHECK_SHAPES: tuple[Shape, ...] = (
    Shape(1, 1, 1), Shape(2, 3, 5), Shape(127, 129, 65), Shape(1000, 2000, 500),
    Shape(4096, 4096, 4096),
)


def make_inputs(cp: Any, shape: Shape, dtype: str, seed: int | None,
                scaled: bool = False) -> tuple[Any, Any]:
    """Seeded standard-normal A (MxK) and B (KxN), or B of each for a batch, in the element
    type, contiguous on the GPU;
    ``scaled``: A divided by sqrt(K), so A·B is of order one (for the epilogues)."""
    if dtype == FP8:   # e4m3 codes, B as Bt (N x K); no fp8 stage has an epilogue
        return make_fp8_inputs(cp, shape.m, shape.n, shape.k, seed)
    rng = cp.random.default_rng(seed)
    nd = numpy_dtype(dtype)
    a = rng.standard_normal((*shape.lead, shape.m, shape.k), dtype=cp.float32)
    a = (a / float(shape.k) ** 0.5 if scaled else a).astype(nd)
    b = rng.standard_normal((*shape.lead, shape.k, shape.n), dtype=cp.float32).astype(nd)
    return cp.ascontiguousarray(a), cp.ascontiguousarray(b)


def make_epilogue_operands(cp: Any, shape: Shape, dtype: str, seed: int | None,
                           epilogue: Epilogue,
                           quant_scale: float = DEFAULT_QUANT_SCALE) -> EpilogueOperands:
    """Seeded bias N(0, 0.5^2) of length N and, for a residual epilogue, residual N(0, 1);
    for a quantising one its scale (fp8: ``quant_scale``; int8: one per row, stepping from
    0.5 to 1.0 times it so that a row read with another row's scale shows) and a zeroed
    amax."""
    rng = cp.random.default_rng(None if seed is None else seed + 1)
    nd = numpy_dtype(dtype)
    bias = (0.5 * rng.standard_normal(shape.n, dtype=cp.float32)).astype(nd)
    res = (rng.standard_normal((shape.m, shape.n), dtype=cp.float32).astype(nd)
           if epilogue.residual else None)
    if epilogue.quant is None:
        return EpilogueOperands(bias, res)
    base = check_quant_scale(quant_scale)
    if epilogue.quant == "fp8":
        scale = cp.full(1, base, dtype=cp.float32)
    else:
        scale = (base * (0.5 + (cp.arange(shape.m) % 5) / 8.0)).astype(cp.float32)
    return EpilogueOperands(bias, res, scale, cp.zeros(1, dtype=cp.float32))


@dataclass(frozen=True)
class Reference:
    """Seeded inputs with A·B and |A|·|B| in float64, made once and checked against every
    kernel run on them (``perfscope tune`` verifies dozens of configurations per shape)."""

    a: Any
    b: Any
    product: Any
    scale: Any


def reference(cp: Any, shape: Shape, dtype: str, seed: int | None) -> Reference:
    """Seeded inputs with their float64 A·B and |A|·|B|."""
    a, b = make_inputs(cp, shape, dtype, seed)
    product, scale = _products(cp, a, b, dtype)
    return Reference(a, b, product, scale)


def _products(cp: Any, a: Any, b: Any, dtype: str) -> tuple[Any, Any]:
    """A·B and |A|·|B| in float64 from a GEMM's operands as it takes them (fp8: e4m3 codes
    of A and Bt, the product carrying scale_a * scale_b)."""
    if dtype == FP8:
        a64, b64 = fp8_operands_f64(cp, a, b)
        factor = scale_product()
    else:
        a64, b64, factor = a.astype(cp.float64), b.astype(cp.float64), 1.0
    product, scale = a64 @ b64, cp.abs(a64) @ cp.abs(b64)
    if factor != 1.0:
        product, scale = factor * product, factor * scale
    return product, scale


def _poisoned(cp: Any, shape: Shape, dtype: str) -> Any:
    # NaN in the output's own type: an element the kernel never writes stays NaN.
    return cp.full((*shape.lead, shape.m, shape.n), float("nan"),
                   dtype=cp.float32).astype(numpy_dtype(dtype))


def check_result(cp: Any, a: Any, b: Any, c: Any, dtype: str,
                 expected: Reference | None = None) -> Verification:
    """Compare c with a·b in float64 (expected: already computed for these a and b); see the
    module docstring for the two checks."""
    if expected is not None:
        ref, scale = expected.product, expected.scale
    else:
        ref, scale = _products(cp, a, b, dtype)
    return _compare(cp, c, ref, Bound(dtype, scale))


def _epilogue_reference(cp: Any, a: Any, b: Any, dtype: str, epilogue: Epilogue,
                        extra: EpilogueOperands) -> tuple[Any, Bound]:
    """act(a·b + bias) (+ residual) in float64, and the elementwise bound around it."""
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    pre = a64 @ b64 + extra.bias.astype(cp.float64)[None, :]
    scale = cp.abs(a64) @ cp.abs(b64)
    del a64, b64
    res = extra.residual.astype(cp.float64) if extra.residual is not None else None
    return apply(cp, epilogue, pre, res), Bound(dtype, scale, epilogue.act, pre)


def check_epilogue(cp: Any, a: Any, b: Any, c: Any, dtype: str, epilogue: Epilogue,
                   extra: EpilogueOperands) -> Verification:
    """Compare c with act(a·b + bias) (+ residual) in float64 (the module docstring)."""
    ref, bound = _epilogue_reference(cp, a, b, dtype, epilogue, extra)
    return _compare(cp, c, ref, bound)


def check_quantised(cp: Any, a: Any, b: Any, c: Any, dtype: str, epilogue: Epilogue,
                    extra: EpilogueOperands) -> Verification:
    """Compare a quantised c (and the amax the run left) with the float64 epilogue, in the
    quantised domain (the module docstring)."""
    x, bound = _epilogue_reference(cp, a, b, dtype, epilogue, extra)
    x_bound = bound.of(cp, x)
    s = extra.scale.astype(cp.float64)
    s = s[:, None] if epilogue.quant == "int8" else s[0]
    limit = E4M3_MAX if epilogue.quant == "fp8" else float(INT8_MAX)
    low = -E4M3_MAX if epilogue.quant == "fp8" else float(INT8_MIN)
    y = cp.clip(x * s, low, limit)
    slack = x_bound * s
    half = (0.5 * e4m3_step(cp, cp.abs(y) + slack) if epilogue.quant == "fp8"
            else cp.full(y.shape, 0.5))
    got = decoded(cp, epilogue.quant, c)
    nonfinite = int(cp.count_nonzero(~cp.isfinite(got)))
    if nonfinite:
        return Verification(WRONG, None, QUANT_FRO_TOL, None, nonfinite, nonfinite,
                            f"{nonfinite} of {c.size} quantised outputs are NaN (never written)")
    diff = cp.abs(got - y)
    ratio = diff / (half + slack)
    bad = int(cp.count_nonzero(ratio > 1.0))
    worst = float(ratio.max())
    y_norm, diff_norm = float(cp.linalg.norm(y)), float(cp.linalg.norm(diff))
    err = diff_norm / y_norm if y_norm > 0 else diff_norm
    # Outputs of a few quantisation steps (int8 at a small scale) round by a large share of
    # themselves: the norm fails only beyond both the tolerance and every half step at once.
    fro_fails = err > QUANT_FRO_TOL and diff_norm > float(cp.linalg.norm(half + slack))
    problems = []
    if fro_fails or bad:
        where = ""
        if bad:
            i, j = divmod(int(cp.argmax(ratio)), c.shape[1])
            where = f"; worst at C[{i}][{j}] = {float(got[i, j]):.6g}, reference {float(y[i, j]):.6g}"
        problems.append(f"relative Frobenius error {err:.3g} (tolerance {QUANT_FRO_TOL:g}); {bad} "
                        f"quantised elements outside the bound{where}")
    if extra.amax is not None:
        amax, want = float(extra.amax[0]), float(cp.abs(x).max())
        if not abs(amax - want) <= float(x_bound.max()):
            problems.append(f"amax {amax:.6g}, reference {want:.6g}")
    if problems:
        return Verification(WRONG, err, QUANT_FRO_TOL, worst, max(bad, 1), 0, "; ".join(problems))
    return Verification(OK, err, QUANT_FRO_TOL, worst, 0, 0, "")


@dataclass(frozen=True)
class LaunchOperands:
    """What one prepared GEMM launches on: A, B, an output C and, for an epilogue stage, its
    bias / residual / scale (``Prepared.launch(a, b, c, extra)``)."""

    a: Any
    b: Any
    c: Any
    extra: EpilogueOperands | None


def launch_operands(cp: Any, prep: Prepared, seed: int | None, scaled: bool = False,
                    quant_scale: float = DEFAULT_QUANT_SCALE) -> LaunchOperands:
    """Seeded inputs (``scaled`` as make_inputs), an output of the stage's C type and the
    epilogue's operands where it has one: what timed and profiled launches run on."""
    a, b = make_inputs(cp, prep.shape, prep.dtype, seed, scaled=scaled)
    extra = (make_epilogue_operands(cp, prep.shape, prep.dtype, seed, prep.epilogue, quant_scale)
             if prep.epilogue is not None else None)
    return LaunchOperands(a, b, output_array(cp, prep), extra)


def poisoned_output(cp: Any, prep: Prepared) -> Any:
    """C filled with a value no correct run leaves: NaN in the output's own type, the e4m3
    NaN code or int8 -128 for a quantised output."""
    quant = prep.epilogue.quant if prep.epilogue is not None else None
    if quant is None:
        return _poisoned(cp, prep.shape, prep.dtype)
    c = output_array(cp, prep)
    c.fill(QUANT_POISON[quant])
    return c


@dataclass(frozen=True)
class Bound:
    """What the elementwise bound is made of: the dtype's tolerances, |A|·|B|, and for an
    epilogue its activation and the pre-activation values."""

    dtype: str
    scale: Any
    act: str = "none"
    pre: Any = None

    def of(self, cp: Any, ref: Any) -> Any:
        """acc_tol·slope·(|A|·|B|) + out_tol·|ref| (+ act_tol·|pre|) + abs_tol."""
        _fro, acc_tol, out_tol, abs_tol = TOLERANCES[self.dtype]
        bound = acc_tol * MAX_SLOPE[self.act] * self.scale + out_tol * cp.abs(ref) + abs_tol
        if self.pre is not None and ACT_TOL[self.act]:
            bound = bound + ACT_TOL[self.act] * cp.abs(self.pre)
        return bound


def _compare(cp: Any, c: Any, ref: Any, limits: Bound) -> Verification:
    fro_tol = TOLERANCES[limits.dtype][0]
    c64 = c.astype(cp.float64)
    nonfinite = int(cp.count_nonzero(~cp.isfinite(c64)))
    if nonfinite:
        return Verification(WRONG, None, fro_tol, None, nonfinite, nonfinite,
                            f"{nonfinite} of {c.size} outputs are NaN or infinite "
                            "(never written, or overflowed)")
    diff = cp.abs(c64 - ref)
    ref_norm = float(cp.linalg.norm(ref))
    err = float(cp.linalg.norm(diff)) / ref_norm if ref_norm > 0 else float(cp.linalg.norm(diff))
    ratio = diff / limits.of(cp, ref)
    bad = int(cp.count_nonzero(ratio > 1.0))
    worst = float(ratio.max())
    if err > fro_tol or bad:
        where = ""
        if bad:
            import numpy as np

            # C[i][j], or C[b][i][j] for a batch.
            at = tuple(int(x) for x in np.unravel_index(int(cp.argmax(ratio)), c.shape))
            where = (f"; worst at C{''.join(f'[{x}]' for x in at)} = {float(c64[at]):.6g}, "
                     f"reference {float(ref[at]):.6g}")
        detail = (f"relative Frobenius error {err:.3g} (tolerance {fro_tol:g}); "
                  f"{bad} elements outside the elementwise bound{where}")
        return Verification(WRONG, err, fro_tol, worst, bad, 0, detail)
    return Verification(OK, err, fro_tol, worst, 0, 0, "")


def verify(prep: Prepared, seed: int | None = None, expected: Reference | None = None,
           quant_scale: float = DEFAULT_QUANT_SCALE) -> Verification:
    """Fresh inputs (or expected's, with their product), poisoned output, one launch, two
    checks; for an epilogue stage, its bias and residual (and a quantising one's scale, from
    ``quant_scale``) too, against the epilogue's math."""
    cp = require_gpu()
    epi = prep.epilogue
    if epi is not None:
        a, b = make_inputs(cp, prep.shape, prep.dtype, seed, scaled=True)
        extra = make_epilogue_operands(cp, prep.shape, prep.dtype, seed, epi, quant_scale)
        c = poisoned_output(cp, prep)
        prep.launch(a, prep.weight(b), c, extra)
        cp.cuda.get_current_stream().synchronize()
        if epi.quant is not None:
            return check_quantised(cp, a, b, c, prep.dtype, epi, extra)
        return check_epilogue(cp, a, b, c, prep.dtype, epi, extra)
    if expected is not None:
        a, b = expected.a, expected.b
    else:
        a, b = make_inputs(cp, prep.shape, prep.dtype, seed)
    c = _poisoned(cp, prep.shape, output_dtype(prep.spec, prep.dtype))
    prep.launch(a, prep.weight(b), c)
    cp.cuda.get_current_stream().synchronize()
    return check_result(cp, a, b, c, prep.dtype, expected)
