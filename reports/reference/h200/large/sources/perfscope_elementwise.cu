
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
