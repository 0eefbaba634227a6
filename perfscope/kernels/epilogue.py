"""Fused epilogues: what a stage applies to A·B before it rounds C, its float64 reference,
and the separate elementwise pass that does the same after cuBLAS (the unfused baseline).

A stage of the fused family (kernels/fused_specs.py) computes ``C = act(A·B + bias) (+
residual)`` in fp32 and rounds C once; its template parameters ``ACT`` (0 none, 1 GELU-tanh,
2 SiLU) and ``RESIDUAL`` (0/1) say which. :func:`epilogue_of` reads them off a spec (None
for a plain GEMM). The baseline a framework runs without fusion is cuBLAS followed by one
elementwise kernel that re-reads C, adds the bias, applies the activation, adds the
residual and writes C again: :data:`ELEMENTWISE_SOURCE`, the same fp32 math and the same
``tanh.approx.f32`` as the fused epilogue, 16 bytes per thread per step.

The checks (perfscope.verify) hold the result to the GEMM's tolerances widened by the
activation: an accumulation error before it grows by at most its slope (:data:`MAX_SLOPE`),
and ``tanh.approx`` adds :data:`ACT_TOL` of the pre-activation value.

Nothing here imports CuPy: the array math takes the array module (NumPy or CuPy) as ``xp``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.kernels.fused_specs import ACTIVATIONS, QUANTS, group_name, quant_of
from perfscope.kernels.spec import KernelSpec

ACT_NAMES: Mapping[int, str] = {v: k for k, v in ACTIVATIONS.items()}
ACT_TITLES: Mapping[str, str] = {"none": "no activation", "gelu": "GELU (tanh form)",
                                 "silu": "SiLU"}

# The largest slope of GELU-tanh (1.1289 near x = 1.5) and of SiLU (1.0998 near x = 2.4):
# an accumulation error before the activation grows by at most this much.
MAX_SLOPE: Mapping[str, float] = {"none": 1.0, "gelu": 1.13, "silu": 1.13}
# tanh.approx.f32 is within ~2^-11 of tanh (relative); 0.5x * that error is ~2.5e-4 |x|.
# Four times that, against the pre-activation value.
ACT_TOL: Mapping[str, float] = {"none": 0.0, "gelu": 1e-3, "silu": 1e-3}


@dataclass(frozen=True)
class Epilogue:
    """What follows the GEMM: + bias[n], an activation, optionally + residual[m][n], and
    optionally the output quantised to one byte (``quant`` "fp8" or "int8", :data:`QUANTS`)."""

    act: str = "gelu"
    residual: bool = False
    quant: str | None = None

    def __post_init__(self) -> None:
        if self.act not in ACTIVATIONS:
            raise PerfscopeError(f"unknown activation {self.act!r}; the epilogues know "
                                 f"{', '.join(ACTIVATIONS)}")
        if self.quant is not None and self.quant not in QUANTS:
            raise PerfscopeError(f"unknown output quantisation {self.quant!r}; the epilogues "
                                 f"know {', '.join(QUANTS)}")

    @property
    def label(self) -> str:
        """``bias+gelu``, ``bias+silu+residual``, ``bias``, ``bias+gelu+fp8``: what the
        epilogue computes."""
        parts = ["bias", *([self.act] if self.act != "none" else []),
                 *(["residual"] if self.residual else []), *([self.quant] if self.quant else [])]
        return "+".join(parts)

    @property
    def group(self) -> str:
        """The unfused baseline's name: cuBLAS, then this epilogue as one elementwise pass
        (``cublas+gelu``, ``cublas+silu+residual``, ``cublas+bias``, ``cublas+gelu+fp8``)."""
        return group_name(self.act, self.residual, self.quant)

    @property
    def params(self) -> dict[str, int]:
        """The template parameters that select this epilogue."""
        out = {"ACT": ACTIVATIONS[self.act], "RESIDUAL": int(self.residual)}
        if self.quant is not None:
            out["QUANT"] = QUANTS[self.quant]
        return out


def epilogue_of(spec: KernelSpec) -> Epilogue | None:
    """The epilogue a stage fuses (from its ACT and RESIDUAL parameters), None for a plain
    GEMM; a value the kernel has no code for is refused in one sentence."""
    p = spec.param_dict
    if "ACT" not in p:
        return None
    act = ACT_NAMES.get(p["ACT"])
    if act is None:
        known = ", ".join(f"{v} ({k})" for k, v in ACTIVATIONS.items())
        raise PerfscopeError(f"{spec.name} has no epilogue for ACT={p['ACT']}; ACT takes {known}")
    if p.get("RESIDUAL", 0) not in (0, 1):
        raise PerfscopeError(f"{spec.name} takes RESIDUAL=0 or 1, not {p['RESIDUAL']}")
    return Epilogue(act, bool(p.get("RESIDUAL", 0)), quant_of(spec))


@dataclass(frozen=True)
class EpilogueOperands:
    """The operands an epilogue reads besides A and B: bias[N] and residual[M][N] (or None),
    device arrays of the GEMM's dtype; for a quantising epilogue, ``scale`` (float32: one
    element for fp8, M for int8) and ``amax`` (one float32 the kernel max-es |x| into, or
    None)."""

    bias: Any
    residual: Any | None = None
    scale: Any | None = None
    amax: Any | None = None


# ------------------------------------------------------------------ float64 reference
def gelu_tanh(xp: Any, x: Any) -> Any:
    """GELU in its tanh form, 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))."""
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(xp: Any, x: Any) -> Any:
    """x * sigmoid(x)."""
    return x / (1.0 + xp.exp(-x))


def apply(xp: Any, epilogue: Epilogue, pre: Any, residual: Any | None) -> Any:
    """act(pre) (+ residual), pre being A·B + bias in float64; a new array."""
    out = {"none": lambda v: v.copy(), "gelu": lambda v: gelu_tanh(xp, v),
           "silu": lambda v: silu(xp, v)}[epilogue.act](pre)
    if epilogue.residual:
        if residual is None:
            raise PerfscopeError("a residual epilogue needs the residual operand")
        out += residual
    return out


# ------------------------------------------------------------------ quantisation
E4M3_MAX = 448.0
# e4m3's smallest normal exponent: below 2^-6 the spacing stays 2^-9 (subnormals).
E4M3_MIN_EXP = -6
E4M3_MANTISSA_BITS = 3
INT8_MIN, INT8_MAX = -128, 127
# The scale every quantising run uses unless told otherwise: with A scaled by 1/sqrt(K)
# (perfscope.verify) the epilogue's outputs are of order one, a few units at most, so
# x * 16 spans most of e4m3's range (max 448) and of int8's without saturating.
DEFAULT_QUANT_SCALE = 16.0


def check_quant_scale(scale: float) -> float:
    """A quantisation scale as given, or a one-sentence refusal of 0, a negative, NaN or
    infinity (each makes every output 0, NaN or saturated)."""
    if not math.isfinite(scale) or scale <= 0:
        raise PerfscopeError(f"the quantisation scale must be a finite number above 0, not "
                             f"{scale!r}: it multiplies every output before rounding")
    return float(scale)


def e4m3_values() -> Any:
    """The 256 e4m3 (OCP e4m3fn) codes as float64 values, NaN for 0x7F and 0xFF."""
    import numpy as np

    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** E4M3_MIN_EXP, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    mag[(exp == 15) & (man == 7)] = np.nan
    return np.where(codes & 0x80, -mag, mag)


def e4m3_step(xp: Any, mag: Any) -> Any:
    """The spacing of e4m3 values in the binade of |mag| (2^-9 below the normals)."""
    _, ex = xp.frexp(mag)   # mag = f * 2^ex with f in [0.5, 1): floor(log2 mag) = ex - 1
    return xp.ldexp(xp.ones_like(mag), xp.maximum(ex - 1, E4M3_MIN_EXP) - E4M3_MANTISSA_BITS)


def round_e4m3(xp: Any, y: Any) -> Any:
    """float64 values rounded to e4m3 as cvt.rn.satfinite does: to the nearest, ties to
    even, |y| > 448 to +-448, NaN kept, the sign of a zero kept."""
    mag = xp.abs(y)
    step = e4m3_step(xp, mag)
    return xp.copysign(xp.minimum(xp.rint(mag / step) * step, E4M3_MAX), y)


def round_int8(xp: Any, y: Any) -> Any:
    """float64 values rounded to int8 as the quantising epilogue does: to the nearest, ties
    to even, saturated to [-128, 127], NaN to 0; an integer has no -0, so neither has this."""
    return xp.clip(xp.nan_to_num(xp.rint(y), nan=0.0), INT8_MIN, INT8_MAX) + 0.0


def quantised(xp: Any, quant: str, x: Any, scale: Any) -> Any:
    """What the epilogue stores for outputs x, as float64 values: fp32(x) * fp32(scale) in
    fp32 (the kernel's one multiply), then rounded (round_e4m3 / round_int8). ``scale`` is
    one value (fp8) or one per row (int8, an M-vector)."""
    s = xp.asarray(scale, dtype=xp.float32)
    y = x.astype(xp.float32) * (s[:, None] if s.ndim == 1 else s)
    y = y.astype(xp.float64)
    return round_e4m3(xp, y) if quant == "fp8" else round_int8(xp, y)


def decoded(xp: Any, quant: str, c: Any) -> Any:
    """A quantised C (bytes) as float64 values."""
    if quant == "fp8":
        return xp.asarray(e4m3_values())[c.view(xp.uint8).astype(xp.int32)]
    return c.view(xp.int8).astype(xp.float64)


# ------------------------------------------------------------------ the unfused pass
# y = act(y + bias[n]) (+ residual[m][n]) in place, 8 elements (16 bytes) per thread and
# step, fp32 math: the activation is activation.cuh's, the one fused.cu's epilogue applies
# (compile with include_dir=KERNEL_DIR). N must be a multiple of 8 (the fused stages
# require it for TMA anyway).
ELEMENTWISE_SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "activation.cuh"

template <typename T> struct Conv;
template <> struct Conv<__half> {
    static __device__ float in(unsigned short u) { return __half2float(__ushort_as_half(u)); }
    static __device__ unsigned short out(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
template <> struct Conv<__nv_bfloat16> {
    static __device__ float in(unsigned short u) { return __uint_as_float(static_cast<unsigned>(u) << 16); }
    static __device__ unsigned short out(float f) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
};

// x = act(y + bias[n]) (+ residual[m][n]) in fp32 for the 8 elements of 16-byte vector v
// of C (rows of vectors_per_row vectors).
template <typename T, int ACT, int RESIDUAL>
__device__ __forceinline__ void epilogue8(float (&x)[8], const unsigned short* y,
                                          const unsigned short* bias,
                                          const unsigned short* residual, long long v,
                                          int vectors_per_row) {
    const uint4 yv = reinterpret_cast<const uint4*>(y)[v];
    const uint4 bv = reinterpret_cast<const uint4*>(bias)[v % vectors_per_row];
    uint4 rv = make_uint4(0, 0, 0, 0);
    if (RESIDUAL) rv = reinterpret_cast<const uint4*>(residual)[v];
    const unsigned* yw = reinterpret_cast<const unsigned*>(&yv);
    const unsigned* bw = reinterpret_cast<const unsigned*>(&bv);
    const unsigned* rw = reinterpret_cast<const unsigned*>(&rv);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[2 * i] = act::activate<ACT>(Conv<T>::in(yw[i] & 0xFFFFu) + Conv<T>::in(bw[i] & 0xFFFFu));
        x[2 * i + 1] = act::activate<ACT>(Conv<T>::in(yw[i] >> 16) + Conv<T>::in(bw[i] >> 16));
        if (RESIDUAL) {
            x[2 * i] += Conv<T>::in(rw[i] & 0xFFFFu);
            x[2 * i + 1] += Conv<T>::in(rw[i] >> 16);
        }
    }
}

template <typename T, int ACT, int RESIDUAL>
__global__ void bias_act_inplace(unsigned short* y, const unsigned short* bias,
                                 const unsigned short* residual, long long vectors,
                                 int vectors_per_row) {
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < vectors;
         v += (long long)gridDim.x * blockDim.x) {
        float x[8];
        epilogue8<T, ACT, RESIDUAL>(x, y, bias, residual, v, vectors_per_row);
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            w[i] = static_cast<unsigned>(Conv<T>::out(x[2 * i])) |
                   (static_cast<unsigned>(Conv<T>::out(x[2 * i + 1])) << 16);
        reinterpret_cast<uint4*>(y)[v] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// q = quant(act(y + bias[n]) (+ residual[m][n]) * scale) from a GEMM output y that stays
// as it is; scale is one float (fp8, read once) or one per row (int8); amax (or nullptr)
// is max-ed with |act(...)|, one atomic per block: the block's warps meet in shared
// memory first, since thousands of same-address atomics at the end of the grid
// serialise in one L2 slice (16,896 of them, one per warp, took the fp8 pass at 4096^2 to
// 24.4 us against the in-place pass's 16.8 us for more bytes).
template <typename T, int ACT, int RESIDUAL, int QUANT>
__global__ void bias_act_quant(const unsigned short* y, unsigned char* q,
                               const unsigned short* bias, const unsigned short* residual,
                               const float* scale, float* amax, long long vectors,
                               int vectors_per_row) {
    __shared__ unsigned block_big;
    unsigned big = 0;
    // q may alias nothing the loop reads, but the compiler cannot know: read the
    // per-tensor scale once, before the first store.
    const float tensor_scale = QUANT == quant::QUANT_INT8 ? 0.f : scale[0];
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < vectors;
         v += (long long)gridDim.x * blockDim.x) {
        float x[8];
        epilogue8<T, ACT, RESIDUAL>(x, y, bias, residual, v, vectors_per_row);
        const float s = QUANT == quant::QUANT_INT8 ? scale[v / vectors_per_row] : tensor_scale;
        unsigned out[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            big = max(big, max(quant::abs_bits(x[2 * i]), quant::abs_bits(x[2 * i + 1])));
            out[i / 2] |= quant::two<QUANT>(x[2 * i] * s, x[2 * i + 1] * s) << (16 * (i % 2));
        }
        reinterpret_cast<uint2*>(q)[v] = make_uint2(out[0], out[1]);
    }
    if (amax != nullptr) {   // the same for every thread of the launch
        big = __reduce_max_sync(0xFFFFFFFFu, big);
        if (threadIdx.x == 0) block_big = 0;
        __syncthreads();
        if (threadIdx.x % 32 == 0 && big != 0) atomicMax(&block_big, big);
        __syncthreads();
        if (threadIdx.x == 0 && block_big != 0)
            atomicMax(reinterpret_cast<unsigned*>(amax), block_big);
    }
}
"""
ELEMENTWISE_SOURCE_NAME = "perfscope_elementwise.cu"
_CXX_TYPES = {"fp16": "__half", "bf16": "__nv_bfloat16"}


def elementwise_expression(dtype: str, epilogue: Epilogue) -> str:
    """The name expression NVRTC instantiates for one dtype and epilogue (the in-place pass,
    or for a quantising epilogue the pass that writes the one-byte output)."""
    if dtype not in _CXX_TYPES:
        raise PerfscopeError(f"the elementwise epilogue pass takes fp16 or bf16, not {dtype}")
    args = f"{_CXX_TYPES[dtype]}, {ACTIVATIONS[epilogue.act]}, {int(epilogue.residual)}"
    if epilogue.quant is not None:
        return f"bias_act_quant<{args}, {QUANTS[epilogue.quant]}>"
    return f"bias_act_inplace<{args}>"


def elementwise_grid(m: int, n: int, multiprocessors: int) -> tuple[int, int]:
    """(vectors, blocks of 256): 16-byte vectors of C, a grid-stride loop of at most 16
    blocks per multiprocessor."""
    vectors = m * n // 8
    return vectors, max(1, min(-(-vectors // 256), multiprocessors * 16))
