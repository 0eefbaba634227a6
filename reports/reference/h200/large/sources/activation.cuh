// perfscope epilogue activations, shared by fused.cu's epilogue and the unfused baseline's
// elementwise pass (perfscope/kernels/epilogue.py), so both compute the same fp32 math:
//   ACT = 0: none; 1: GELU, tanh form 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
//         2: SiLU x * sigmoid(x), computed as 0.5x(1 + tanh(x/2)); tanh is tanh.approx.f32
//         (PTX ISA: tanh, sm_75+), within ~2^-11 relative of tanh.
// Written for perfscope from the PTX ISA; no code is taken from elsewhere.

#pragma once

namespace act {

constexpr int ACT_NONE = 0;
constexpr int ACT_GELU = 1;
constexpr int ACT_SILU = 2;

__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <int ACT>
__device__ __forceinline__ float activate(float x) {
    if constexpr (ACT == ACT_GELU) {
        // u = sqrt(2/pi) * (x + 0.044715 x^3) = x * (sqrt(2/pi) + sqrt(2/pi) * 0.044715 * x^2)
        const float h = 0.5f * x;
        const float u = x * fmaf(0.0356774081363001f, x * x, 0.7978845608028654f);
        return fmaf(h, tanh_approx(u), h);            // 0.5x + 0.5x * tanh(u)
    } else if constexpr (ACT == ACT_SILU) {
        const float h = 0.5f * x;
        return fmaf(h, tanh_approx(h), h);            // x * sigmoid(x) = 0.5x(1 + tanh(x/2))
    } else {
        return x;
    }
}

}  // namespace act

// Output quantisation after the activation, shared by fused.cu's hgemm_fused_quant and
// the unfused baseline's quantising pass, so both round the same way:
//   QUANT = 1: fp8 e4m3 (OCP "e4m3fn": max 448, no infinity), y = x * scale rounded to
//         nearest even with satfinite (|y| > 448 -> +-448, NaN stays NaN);
//   QUANT = 2: int8, y = x * scale rounded to nearest even, saturated to [-128, 127]
//         (NaN -> 0, as PTX's float-to-integer cvt gives).
// The product x * scale is one fp32 multiply (round to nearest), then the conversion.
namespace quant {

constexpr int QUANT_FP8 = 1;
constexpr int QUANT_INT8 = 2;

// Two values -> two bytes, lo in the low byte (the lower column).
template <int QUANT>
__device__ __forceinline__ unsigned two(float lo, float hi) {
    static_assert(QUANT == QUANT_FP8 || QUANT == QUANT_INT8, "QUANT is 1 (fp8) or 2 (int8)");
    if constexpr (QUANT == QUANT_FP8) {
        unsigned short r;
        // cvt...e4m3x2 puts its first source in the upper byte.
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
        return r;
    } else {
        int a, b;
        asm("cvt.rni.s32.f32 %0, %1;\n" : "=r"(a) : "f"(lo));
        asm("cvt.rni.s32.f32 %0, %1;\n" : "=r"(b) : "f"(hi));
        a = max(-128, min(127, a));
        b = max(-128, min(127, b));
        return (static_cast<unsigned>(a) & 0xFFu) | ((static_cast<unsigned>(b) & 0xFFu) << 8);
    }
}

// |x| as ordered bits: for non-negative floats the unsigned order is the float order, so
// atomicMax on these bits is a float max (a NaN, above +inf as bits, wins and shows).
__device__ __forceinline__ unsigned abs_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

}  // namespace quant
