"""The fp8 dtype: e4m3 inputs in the "TN" layout with per-tensor scales, a bf16 C.

A GEMM of dtype ``fp8`` computes ``C = bf16(scale_a * scale_b * (A · Btᵀ))``: A is M x K and
Bt is N x K, both row-major e4m3 bytes (K contiguous), because the e4m3 wgmma reads both
operands K-major and cuBLASLt's FP8 GEMM takes the same layout. The scales are the
per-tensor dequantisation scales of A and B (``FP8_SCALES``, fixed, so that every run,
check and reference multiplies by the same two numbers); their fp32 product is exact.

Inputs are standard-normal values rounded to e4m3 (to the nearest, ties to even, as
``cvt.rn.satfinite`` rounds), held as uint8 codes on the device: CuPy has no fp8 type.
The float64 reference decodes the codes (:func:`perfscope.kernels.epilogue.e4m3_values`).
"""

from __future__ import annotations

from typing import Any

from perfscope.kernels.epilogue import e4m3_values, round_e4m3
from perfscope.kernels.spec import FP8

__all__ = ["FP8", "FP8_SCALES", "decode_e4m3", "encode_e4m3", "fp8_operands_f64",
           "make_fp8_inputs", "scale_product"]
# scale_a, scale_b: not powers of two, so a kernel that drops one (or applies one twice)
# is off by a factor the check sees; their product 0.234375 is exact in fp32.
FP8_SCALES = (0.75, 0.3125)
# e4m3 codes 0x00..0x7E hold the non-negative finite values in increasing order.
_POSITIVE_CODES = 0x7F
SIGN_BIT = 0x80


def scale_product() -> float:
    """scale_a * scale_b, the factor C carries (exact in fp32 and float64 alike)."""
    return FP8_SCALES[0] * FP8_SCALES[1]


def encode_e4m3(xp: Any, x: Any) -> Any:
    """float values as e4m3 codes (uint8), rounded as ``cvt.rn.satfinite`` rounds them."""
    y = round_e4m3(xp, xp.asarray(x, dtype=xp.float64))
    table = xp.asarray(e4m3_values()[:_POSITIVE_CODES])
    codes = xp.searchsorted(table, xp.abs(y)).astype(xp.uint8)
    return xp.where(xp.signbit(y), codes | SIGN_BIT, codes).astype(xp.uint8)


def decode_e4m3(xp: Any, codes: Any) -> Any:
    """e4m3 codes (any one-byte array) as float64 values."""
    return xp.asarray(e4m3_values())[codes.view(xp.uint8).astype(xp.int32)]


def make_fp8_inputs(cp: Any, m: int, n: int, k: int, seed: int | None) -> tuple[Any, Any]:
    """Seeded standard-normal A (M x K) and Bt (N x K) rounded to e4m3, as contiguous uint8
    codes on the GPU (the same draws as the 16-bit inputs, B's transposed)."""
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n), dtype=cp.float32)
    return (cp.ascontiguousarray(encode_e4m3(cp, a)),
            cp.ascontiguousarray(encode_e4m3(cp, b.T)))


def fp8_operands_f64(xp: Any, a: Any, bt: Any) -> tuple[Any, Any]:
    """A (M x K) and B (K x N) in float64 from an fp8 GEMM's codes, so that A @ B is the
    product before the scales."""
    return decode_e4m3(xp, a), decode_e4m3(xp, bt).T
