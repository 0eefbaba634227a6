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
