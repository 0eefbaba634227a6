// perfscope FP8 stage: e4m3 inputs on QGMMA with per-tensor scales (sm_90a; issue 19's stretch).
//
// What the stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); this header says how.
//
// C[M][N] = bf16(scale_a * scale_b * sum_k A[m][k] * Bt[n][k]): A is M x K and Bt is N x K,
// both row-major e4m3 (one byte, K contiguous: the "TN" layout every FP8 GEMM takes, since
// the PTX ISA's e4m3 wgmma reads both operands K-major and has no transpose), accumulated in
// fp32 by the tensor cores, scaled once in fp32 and rounded to bf16. scale_a and scale_b
// are the per-tensor dequantisation scales of A and B (float, on the device, as cuBLASLt
// takes them), read once per consumer thread.
//
// ABI: hopper.cu's tensor-map ABI with one pointer appended,
//   (const __grid_constant__ TensorMap2D tmap_a, tmap_b, tmap_c, __nv_bfloat16* C,
//    int M, int N, int K, const float* scales)      scales[0] = scale_a, scales[1] = scale_b
//   tmap_a: dims {K, M}, row stride K bytes, box {128, BM}, 128B swizzle
//   tmap_b: dims {K, N}, row stride K bytes, box {128, BN}, 128B swizzle
//   tmap_c: dims {N, M}, row stride 2N bytes, box {64, 64}, 128B swizzle (TMA stores)
// with zero out-of-bounds fill. K % 16 == 0 (TMA strides are multiples of 16 bytes) and
// N % 8 == 0 (C's).
//
// Shared-memory operand layout: a ring slot holds BM rows of A and BN rows of Bt, each row
// 128 bytes (128 e4m3 of K) in 8-row groups 1024 bytes apart (SBO), 128B-swizzled as the
// TMA box leaves it: the K-major canonical layout of both wgmma operands. The next k32
// step is 32 bytes along the row, as a 16-bit k16 step is. The accumulator fragment is
// that of the 16-bit wgmmas (hopper.cu's header).
//
// hgemm_fp8
//   template <typename T = __nv_fp8_e4m3, int BM = 128, int BN = 256, int BK = 128,
//             int STAGES = 4, int GROUP = 16, int BOXES = 1, int DEFER = 1>
//   threads  384, 1-D: warpgroup 0 produces (one thread issues TMA), 1 and 2 consume
//   grid     dim3(min(tiles, multiprocessors)), persistent, grouped tile order
//   smem     dynamic STAGES * (BM + BN) * BK + 2 * min(BOXES, BN/64) * 64 * 64 * 2 + 1024;
//            static 2 * STAGES mbarriers
//   parent   hgemm_tma_wgmma_persistent (at the configuration `perfscope tune` chose at
//            4096^3: STAGES 4, GROUP 16, one staging box, the deferred store)
//   how      The persistent body (hop::persistent_gemm) with an fp8 ring slot (SlotK8: A and
//            Bt both K-major, BK 128 one-byte elements, four wgmma m64nBNk32 e4m3 steps per
//            k tile) and the parent's store with the scale: each consumer multiplies its
//            fp32 tile by scale_a * scale_b as it rounds it to bf16. A k tile moves the same
//            48 KB as the parent's and holds twice its math, which the tensor cores do in
//            the same time (dense e4m3 is twice the bf16 rate).
//   seed     000 §4 (Hopper TMA + wgmma), §7.1 (inference: low-precision inputs)
//
// Written for perfscope from the PTX ISA (wgmma .e4m3, cp.async.bulk.tensor); no code is
// taken from the seed articles, CUTLASS or other libraries.

#include "hopper.cuh"

namespace hop {

// A ring slot of one-byte inputs: BM rows of A, then BN rows of Bt, each K-major.
template <int BM, int BN, int BK>
struct SlotK8 {
    static_assert(BK == 128, "a 128B-swizzled K-major row holds exactly 128 one-byte elements");
    static_assert(BN % 64 == 0 && BN <= 256, "Bt arrives as one TMA box of at most 256 rows");
    static constexpr unsigned A_BYTES = BM * BK;
    static constexpr unsigned BYTES = (BM + BN) * BK;
    static constexpr int K_STEPS = BK / 32;   // wgmma k32 steps per k tile

    // A rows 64*i .. 64*i+63, k32 step k (a base plus constants, as Slot's: wgmma_desc16).
    static __device__ __forceinline__ unsigned long long a_desc(unsigned slot, int i, int k) {
        return wgmma_desc16(desc_addr16(slot) + (i * 64 * 128 + k * 32) / 16, 16, 1024);
    }
    // All BN rows of Bt (the BN columns of C), k32 step k: the same K-major layout as A.
    static __device__ __forceinline__ unsigned long long b_desc(unsigned slot, int k) {
        return wgmma_desc16(desc_addr16(slot) + (A_BYTES + k * 32) / 16, 16, 1024);
    }
    static __device__ __forceinline__ void load(unsigned slot, unsigned bar, const TensorMap2D* ta,
                                                const TensorMap2D* tb, int m0, int n0, int kt) {
        tma::mbar_expect_tx(bar, BYTES);   // out-of-bounds zero fill counts too
        tma::load_2d(slot, ta, bar, kt * BK, m0);
        tma::load_2d(slot + A_BYTES, tb, bar, kt * BK, n0);
    }
};

template <int BM, int BN, int BK>
struct SlotOf<__nv_fp8_e4m3, BM, BN, BK> { using type = SlotK8<BM, BN, BK>; };

// hgemm_tma_wgmma_persistent's StoreEpilogue (bf16 C) with the per-tensor scales applied
// to the fp32 accumulators as they are rounded.
template <int BN, int MAX_BOXES, int DEFER>
struct ScaledStoreEpilogue {
    using Plain = StoreEpilogue<__nv_bfloat16, BN, MAX_BOXES, DEFER>;
    static constexpr int BOXES = Plain::BOXES;
    static constexpr unsigned STAGING_BYTES = Plain::STAGING_BYTES;
    static constexpr bool DEFERRED = Plain::DEFERRED;
    struct Args { const float* scales; };
    float scale;

    __device__ __forceinline__ ScaledStoreEpilogue(const Args& args, int)
        : scale(args.scales[0] * args.scales[1]) {}
    __device__ __forceinline__ void after_k_tile(int, int, int, int, int, int) const {}
    __device__ __forceinline__ void before_last_wait(int, int, int, int) const {}
    __device__ __forceinline__ void store(float (&acc)[BN / 2], unsigned staging,
                                          const TensorMap2D* tmap_c, int row0, int n0, int, int,
                                          unsigned bar_id) const {
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[j] *= scale;
        store_tile_staged<__nv_bfloat16, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);
    }
    __device__ __forceinline__ void pack(const float (&acc)[BN / 2], unsigned (&words)[BN / 4], int,
                                         int, int, int) const {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            words[2 * j] = tma::Pack<__nv_bfloat16>::two(scale * acc[4 * j], scale * acc[4 * j + 1]);
            words[2 * j + 1] =
                tma::Pack<__nv_bfloat16>::two(scale * acc[4 * j + 2], scale * acc[4 * j + 3]);
        }
    }
    __device__ __forceinline__ void store_box(const unsigned (&words)[BN / 4], int box,
                                              unsigned staging, const TensorMap2D* tmap_c,
                                              int row0, int n0, unsigned bar_id) const {
        store_words_box<BN, BOXES>(words, box, staging, tmap_c, row0, n0, bar_id);
    }
};

}  // namespace hop

template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int BOXES, int DEFER>
__global__ void __launch_bounds__(384, 1)
hgemm_fp8(const __grid_constant__ TensorMap2D tmap_a, const __grid_constant__ TensorMap2D tmap_b,
          const __grid_constant__ TensorMap2D tmap_c, __nv_bfloat16* __restrict__ C, int M, int N,
          int K, const float* __restrict__ scales) {
    static_assert(sizeof(T) == 1, "e4m3 inputs");
    hop::persistent_gemm<T, BM, BN, BK, STAGES, GROUP, hop::ScaledStoreEpilogue<BN, BOXES, DEFER>>(
        &tmap_a, &tmap_b, &tmap_c, M, N, K, {scales});
}
