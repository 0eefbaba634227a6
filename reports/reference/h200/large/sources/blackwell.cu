// perfscope Blackwell stage: tcgen05.mma with the accumulator in tensor memory (seed 000 §4).
//
// What each stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); the headers here say how.
//
// COMPILED, NEVER RUN. No Blackwell GPU has executed this file; perfscope builds it for
// sm_100a and sm_103a and audits its SASS (`perfscope sass hgemm_tcgen05`). Its
// descriptor encodings are unit-tested against the PTX ISA tables; its results are not.
//
// C[M][N] = A[M][K] * B[K][N], all row-major (numpy `a @ b`), T = __half or
// __nv_bfloat16, fp32 accumulation in tensor memory, C rounded to T.
//
// hgemm_tcgen05
//   template <typename T, int BM = 128, int BN = 128, int BK = 64, int STAGES = 4>
//   params   (const __grid_constant__ TensorMap2D tmap_a, tmap_b, tmap_c, T* C, int M,
//            int N, int K), the tensor-map ABI hopper.cu shares (tmap_c unused here):
//            unlike the mma.sync ladder, A and B arrive as CUtensorMaps
//            (cuTensorMapEncodeTiled on the host):
//              tmap_a: dims {K, M}, row stride K*2 bytes, box {BK, BM}, 128B swizzle
//              tmap_b: dims {N, K}, row stride N*2 bytes, box {64, BK}, 128B swizzle
//            both with zero out-of-bounds fill, which pads ragged M/N/K edges with 0.
//   threads  128, 1-D (4 warps). Thread 0 issues every TMA copy and every MMA; warp 0
//            allocates and frees tensor memory; all 4 warps drain the accumulator (warp w
//            may only read tensor-memory lanes 32w..32w+31, i.e. C rows 32w..32w+31).
//   grid     dim3((N + BN - 1) / BN, (M + BM - 1) / BM)
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 1024 bytes (the 1024 re-aligns the
//            ring: 128B-swizzled operands must start on 1024-byte boundaries); static:
//            2*STAGES + 1 mbarriers and the tensor-memory address slot.
//   tmem     BN fp32 columns x 128 lanes (one 128xBN accumulator); BN a power of 2 >= 32.
//   flags    NVRTC/nvcc with -lineinfo for sm_100a or sm_103a only (tcgen05 exists on
//            the arch-specific targets of compute capability 10.0 and 10.3).
//   headers  tma.cuh (cuda_fp16.h and cuda_bf16.h; no cuda.h: TensorMap2D stands in for
//            CUtensorMap, an opaque 128-byte, 64-byte-aligned object).
//   shapes   K % 8 == 0 and N % 8 == 0 (TMA global strides are multiples of 16 bytes);
//            A, B, C 16-byte aligned.
//   SASS     UTMALDG (TMA) + UTCHMMA (tcgen05.mma kind::f16) + UTCBAR (tcgen05.commit)
//            + LDTM (tcgen05.ld) + tensor-memory alloc/dealloc; SYNCS for the mbarriers.
//   parent   hgemm_bcf_dbf_rw (the mma.sync ladder's last stage)
//   how      Operands reach shared memory by TMA (one thread, 128B hardware swizzle), one
//            thread issues 128xBNx16 tcgen05.mma into a tensor-memory accumulator, each
//            stage is released by tcgen05.commit on an mbarrier, and the epilogue reads
//            the accumulator with tcgen05.ld.
//
// Pipeline: STAGES shared buffers, each with a "full" mbarrier (TMA bytes landed,
// expect_tx) and an "empty" mbarrier (tcgen05.commit: the MMAs that read it are done).
// Thread 0 keeps STAGES-1 tiles in flight while the tensor core works on the current one.
//
// Written for perfscope from the PTX ISA (tcgen05, cp.async.bulk.tensor, mbarrier);
// no code is taken from the seed article, CUTLASS or other libraries.

#include "tma.cuh"

namespace tc05 {

// --------------------------------------------------------------------- descriptors
// Both encoders are constexpr so the unit tests can static_assert them against the
// Python mirror (perfscope/kernels/tcgen05_desc.py), which is itself checked against the
// PTX ISA bit tables. The kernel calls the same functions at run time.

// PTX ISA "Tensorcore 5th Generation: Shared memory descriptor" (tcgen05 matrix
// descriptors): start address bits 0-13, leading-dimension byte offset 16-29,
// stride-dimension byte offset 32-45 (each as bytes >> 4), fixed 0b001 at 46-48, base
// offset 49-51, LBO mode 52, swizzle 61-63.
enum Swizzle : unsigned { SWIZZLE_NONE = 0, SWIZZLE_128B_BASE32B = 1, SWIZZLE_128B = 2,
                          SWIZZLE_64B = 4, SWIZZLE_32B = 6 };

__host__ __device__ constexpr unsigned long long smem_desc(unsigned addr, unsigned lbo_bytes,
                                                           unsigned sbo_bytes, unsigned swizzle,
                                                           unsigned base_offset = 0) {
    return (static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4))
         | (static_cast<unsigned long long>((lbo_bytes >> 4) & 0x3FFFu) << 16)
         | (static_cast<unsigned long long>((sbo_bytes >> 4) & 0x3FFFu) << 32)
         | (1ull << 46)
         | (static_cast<unsigned long long>(base_offset & 0x7u) << 49)
         | (static_cast<unsigned long long>(swizzle & 0x7u) << 61);
}

// PTX ISA "Instruction descriptor" for .kind::f16: dtype bits 4-5 (F16 0, F32 1), atype
// 7-9 and btype 10-12 (F16 0, BF16 1), transpose A 15 / B 16 (0 = K-major), N >> 3 at
// 17-22, M >> 4 at 24-28; sparsity, saturate, negate and max-shift left 0.
enum AbType : unsigned { AB_F16 = 0, AB_BF16 = 1 };

__host__ __device__ constexpr unsigned instr_desc_f16(unsigned ab_type, bool d_f32, int m, int n,
                                                      bool a_mn_major, bool b_mn_major) {
    return (static_cast<unsigned>(d_f32) << 4)
         | ((ab_type & 0x7u) << 7)
         | ((ab_type & 0x7u) << 10)
         | (static_cast<unsigned>(a_mn_major) << 15)
         | (static_cast<unsigned>(b_mn_major) << 16)
         | ((static_cast<unsigned>(n) >> 3 & 0x3Fu) << 17)
         | ((static_cast<unsigned>(m) >> 4 & 0x1Fu) << 24);
}

template <typename T> struct Elem;
template <> struct Elem<__half> { static constexpr unsigned AB = AB_F16; };
template <> struct Elem<__nv_bfloat16> { static constexpr unsigned AB = AB_BF16; };

// ------------------------------------------------------------------------ helpers
// (TMA, mbarrier and packing helpers come from tma.cuh, shared with hopper.cu.)
using tma::smem_u32;
using tma::mbar_init;
using tma::mbar_expect_tx;
using tma::mbar_wait;

__device__ __forceinline__ void tmem_alloc(unsigned slot, unsigned ncols) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                 :: "r"(slot), "r"(ncols) : "memory");
}
__device__ __forceinline__ void tmem_relinquish() {
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tmem_dealloc(unsigned taddr, unsigned ncols) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n"
                 :: "r"(taddr), "r"(ncols) : "memory");
}
__device__ __forceinline__ void tc_fence_before() {
    asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory");
}
__device__ __forceinline__ void tc_fence_after() {
    asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory");
}

// D[tmem] (+)= A[smem] * B[smem]; accumulate == false overwrites D (first k step).
__device__ __forceinline__ void mma_f16(unsigned d_tmem, unsigned long long a_desc,
                                        unsigned long long b_desc, unsigned idesc,
                                        bool accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred acc;\n"
        "setp.ne.b32 acc, %4, 0;\n"
        "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, acc;\n"
        "}\n" :: "r"(d_tmem), "l"(a_desc), "l"(b_desc), "r"(idesc), "r"((unsigned)accumulate)
        : "memory");
}
// Arrives once on `bar` when every tcgen05.mma this thread issued before it completes.
__device__ __forceinline__ void mma_commit(unsigned bar) {
    asm volatile(
        "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n"
        :: "r"(bar) : "memory");
}

// 32 lanes x 32 bits, 16 consecutive columns: thread i of the warp gets lane (base + i).
__device__ __forceinline__ void tmem_ld_16(unsigned taddr, unsigned (&r)[16]) {
    asm volatile(
        "tcgen05.ld.sync.aligned.32x32b.x16.b32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, [%16];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]),
          "=r"(r[6]), "=r"(r[7]), "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]),
          "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15])
        : "r"(taddr));
    asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void stg_128(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n"
                 :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

}  // namespace tc05

template <typename T, int BM, int BN, int BK, int STAGES>
__global__ void __launch_bounds__(128, 1)
hgemm_tcgen05(const __grid_constant__ TensorMap2D tmap_a, const __grid_constant__ TensorMap2D tmap_b,
              const __grid_constant__ TensorMap2D tmap_c, T* __restrict__ C, int M, int N, int K) {
    using namespace tc05;
    // One 128xBNx16 MMA per 16-wide k step: M = 128 puts C row i in tensor-memory lane i.
    static_assert(BM == 128, "cta_group::1 MMA with M = 128 maps C rows onto the 128 lanes");
    static_assert(BN % 64 == 0 && BN >= 64 && BN <= 256 && (BN & (BN - 1)) == 0,
                  "B is loaded in 64-column (128-byte) swizzle atoms; tmem takes 2^n columns");
    static_assert(BK == 64, "a K-major 128B-swizzled A row holds exactly 64 16-bit elements");
    static_assert(STAGES >= 2, "one stage would serialise every copy with every MMA");
    constexpr int UMMA_K = 16;                       // k per tcgen05.mma for 16-bit inputs
    constexpr unsigned A_BYTES = BM * BK * 2, B_ATOM_BYTES = BK * 64 * 2;
    constexpr unsigned B_BYTES = BK * BN * 2, STAGE_BYTES = A_BYTES + B_BYTES;
    // Layouts the TMA boxes produce (PTX ISA, canonical layouts for 128B swizzling):
    //  A, K-major: row m of the tile is 128 bytes at m * 128; 8-row groups are 1024 bytes
    //     apart (SBO); LBO is unused by swizzled K-major layouts and set to 16 (field 1).
    //  B, N-major: k row of one 64-column atom is 128 bytes at k * 128, 8-row groups 1024
    //     bytes apart (SBO); the next 64 columns are the next box, B_ATOM_BYTES on (LBO).
    constexpr unsigned A_LBO = 16, A_SBO = 1024, B_LBO = B_ATOM_BYTES, B_SBO = 1024;
    constexpr unsigned IDESC = instr_desc_f16(Elem<T>::AB, true, BM, BN, false, true);
    constexpr unsigned TMEM_COLS = BN;

    __shared__ alignas(8) unsigned long long bars[2 * STAGES + 1];
    __shared__ unsigned tmem_slot;
    extern __shared__ unsigned char dyn_smem[];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int KT = (K + BK - 1) / BK;

    // 128B-swizzled tiles need 1024-byte alignment; the launch adds 1024 bytes of slack.
    const unsigned ring = (smem_u32(dyn_smem) + 1023u) & ~1023u;
    const unsigned full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[STAGES]);
    const unsigned done = smem_u32(&bars[2 * STAGES]);

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full0 + 8 * s, 1);    // the producer's arrive.expect_tx
            mbar_init(empty0 + 8 * s, 1);   // one tcgen05.commit
        }
        mbar_init(done, 1);
        // Make the initialised barriers visible to the async proxy (TMA, tensor core).
        tma::mbar_init_fence();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
    }
    if (warp == 0) {
        tmem_alloc(smem_u32(&tmem_slot), TMEM_COLS);
        tmem_relinquish();   // one CTA per SM by design: let no later CTA wait on this one
    }
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
    const unsigned tmem_d = tmem_slot;

    if (tid == 0) {
        auto issue_load = [&](int kt, int s) {
            const unsigned a_dst = ring + s * STAGE_BYTES, b_dst = a_dst + A_BYTES;
            const unsigned full = full0 + 8 * s;
            mbar_expect_tx(full, STAGE_BYTES);   // out-of-bounds zero fill counts too
            tma::load_2d(a_dst, &tmap_a, full, kt * BK, m0);
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
                tma::load_2d(b_dst + j * B_ATOM_BYTES, &tmap_b, full, n0 + 64 * j, kt * BK);
        };
        const int prologue = KT < STAGES ? KT : STAGES;
        for (int kt = 0; kt < prologue; ++kt) issue_load(kt, kt);

        for (int kt = 0; kt < KT; ++kt) {
            const int s = kt % STAGES;
            const unsigned phase = (kt / STAGES) & 1;
            mbar_wait(full0 + 8 * s, phase);
            tc_fence_after();
            const unsigned a_base = ring + s * STAGE_BYTES, b_base = a_base + A_BYTES;
#pragma unroll
            for (int k = 0; k < BK / UMMA_K; ++k) {
                // K-major A: the next 16 elements are 32 bytes further along each swizzled
                // row (the hardware applies the XOR on address bits, base stays aligned).
                // N-major B: the next 16 k rows are two 1024-byte groups further on.
                const unsigned long long a_desc =
                    smem_desc(a_base + k * UMMA_K * 2, A_LBO, A_SBO, SWIZZLE_128B);
                const unsigned long long b_desc =
                    smem_desc(b_base + k * UMMA_K * 128, B_LBO, B_SBO, SWIZZLE_128B);
                mma_f16(tmem_d, a_desc, b_desc, IDESC, kt > 0 || k > 0);
            }
            mma_commit(empty0 + 8 * s);          // stage s is free once these MMAs finish
            if (kt + STAGES < KT) {
                mbar_wait(empty0 + 8 * s, phase);
                issue_load(kt + STAGES, s);
            }
        }
        mma_commit(done);                        // the whole accumulator is final
    }

    // ---- epilogue: tensor memory -> registers -> C ----
    mbar_wait(done, 0);
    __syncwarp();        // tcgen05.ld is .sync.aligned: warp 0's lanes must reconverge
    tc_fence_after();
    const int row = m0 + warp * 32 + lane;
    const unsigned lane_base = tmem_d + (static_cast<unsigned>(warp * 32) << 16);
#pragma unroll 1
    for (int c = 0; c < BN; c += 16) {
        unsigned r[16];
        tmem_ld_16(lane_base + c, r);            // warp-collective: every lane takes part
        const int col = n0 + c;
        if (row < M) {
            T* dst = C + (long long)row * N + col;
            // N % 8 == 0, so each 8-column half is either wholly inside C or wholly out.
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (col + 8 * h < N) {
                    const unsigned* f = r + 8 * h;
                    stg_128(dst + 8 * h,
                            tma::Pack<T>::two(__uint_as_float(f[0]), __uint_as_float(f[1])),
                            tma::Pack<T>::two(__uint_as_float(f[2]), __uint_as_float(f[3])),
                            tma::Pack<T>::two(__uint_as_float(f[4]), __uint_as_float(f[5])),
                            tma::Pack<T>::two(__uint_as_float(f[6]), __uint_as_float(f[7])));
                }
            }
        }
    }

    tc_fence_before();
    __syncthreads();
    if (warp == 0) {
        tc_fence_after();
        tmem_dealloc(tmem_d, TMEM_COLS);
    }
}
