// perfscope: the Hopper building blocks that hopper.cu's stages and fused.cu's stages share.
//
// wgmma descriptors and issue (m64n128k16 / m64n256k16 from shared memory), setmaxnreg,
// named barriers, the 128B-swizzled ring slot and its TMA loads, the warp-specialised
// mbarrier ring, grouped tile order, the two C epilogues (fragment stores and the
// swizzled staging tile + TMA store), and the persistent warp-specialised body that
// hgemm_tma_wgmma_persistent and fused.cu's hgemm_fused_bias_act share, parameterised by
// an epilogue policy. The layouts they assume (operand tiles, accumulator fragment,
// tensor maps) are described once, in the header comment of hopper.cu.
//
// Moved here from hopper.cu (issue 19) so fused.cu can build on them; the four hopper.cu
// stages compile to the same SASS as before (tests/test_fused.py checks it).
// Written for perfscope from the PTX ISA; no code is taken from CUTLASS or other libraries.
#pragma once

#include "tma.cuh"
#include <cuda_fp8.h>

namespace hop {

using tma::smem_u32;

// -------------------------------------------------------------- wgmma descriptors
// PTX ISA "Matrix Descriptor Format" (wgmma): start address bits 0-13, leading-dimension
// byte offset 16-29, stride-dimension byte offset 32-45 (each as bytes >> 4), base
// offset 49-51 (0: ring slots are 1024-byte aligned), layout type 62-63 (1 = 128B swizzle).
constexpr unsigned LAYOUT_SWIZZLE_128B = 1;

__host__ __device__ constexpr unsigned long long wgmma_desc(unsigned addr, unsigned lbo_bytes,
                                                            unsigned sbo_bytes) {
    return (static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4))
         | (static_cast<unsigned long long>((lbo_bytes >> 4) & 0x3FFFu) << 16)
         | (static_cast<unsigned long long>((sbo_bytes >> 4) & 0x3FFFu) << 32)
         | (static_cast<unsigned long long>(LAYOUT_SWIZZLE_128B) << 62);
}
static_assert(wgmma_desc(0x400, 16, 1024) == 0x4000004000010040ull,
              "descriptor fields in the PTX ISA positions");

// The same descriptor from its address already masked to the CTA's 2^18 bytes and divided
// by 16 (`addr16`), with the leading-offset field added rather than or-ed. A slot's
// descriptors are then its base ((slot & 0x3FFFF) >> 4) plus a constant: one 32-bit add
// each, in uniform registers when the base is warp-uniform, where wgmma_desc on each
// address took a mask, a shift and an or per descriptor in per-thread registers and two
// moves into uniform ones.
__host__ __device__ constexpr unsigned long long wgmma_desc16(unsigned addr16, unsigned lbo_bytes,
                                                              unsigned sbo_bytes) {
    return (static_cast<unsigned long long>(((sbo_bytes >> 4) & 0x3FFFu)
                                            | (LAYOUT_SWIZZLE_128B << 30)) << 32)
         | (addr16 + (((lbo_bytes >> 4) & 0x3FFFu) << 16));
}
static_assert(wgmma_desc16(0x3F400 >> 4, 16, 1024) == wgmma_desc(0x3F400, 16, 1024)
              && wgmma_desc16(0x2400 >> 4, 8192, 1024) == wgmma_desc(0x2400, 8192, 1024),
              "wgmma_desc16 is wgmma_desc of a 16-byte aligned address");
// A ring slot's address as wgmma_desc16 takes it (slots are 1024-byte aligned, so >> 4
// loses nothing). The mask keeps the low 18 bits, as wgmma_desc's does: without it the
// 2-CTA cluster kernels computed wrong results on the H200 (their shared::cta addresses
// carry bits above the CTA's 2^18 bytes).
__device__ __forceinline__ unsigned desc_addr16(unsigned slot) { return (slot & 0x3FFFFu) >> 4; }

// ------------------------------------------------------------------ wgmma issue
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed wgmma groups of this warpgroup are still pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(REGS));
}
// Barrier `id` (1..15; 0 is __syncthreads) over `count` threads: one warpgroup's sync.
__device__ __forceinline__ void named_sync(unsigned id, unsigned count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N] (fp8: A[64 x 32] * B[32 x N]), both operands from
// shared memory through descriptors; scale_d == 0 overwrites D. One operand register per
// accumulator.
template <typename T, int N> struct Wgmma;

#define PS_WGMMA_SS_N128(CXX_T, KIND, TRANS) \
template <> struct Wgmma<CXX_T, 128> { \
    static __device__ __forceinline__ void mma(float (&d)[64], unsigned long long da, \
                                               unsigned long long db, int scale_d) { \
        asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128" KIND " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, p, 1, 1" TRANS ";\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(da), "l"(db), "r"(scale_d) : "memory"); \
    } \
};

#define PS_WGMMA_SS_N256(CXX_T, KIND, TRANS) \
template <> struct Wgmma<CXX_T, 256> { \
    static __device__ __forceinline__ void mma(float (&d)[128], unsigned long long da, \
                                               unsigned long long db, int scale_d) { \
        asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n256" KIND " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
        "}, %128, %129, p, 1, 1" TRANS ";\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "l"(da), "l"(db), "r"(scale_d) : "memory"); \
    } \
};

// 16-bit inputs: k16, A K-major (imm-trans-a 0) and B N-major (imm-trans-b 1). fp8 e4m3
// inputs: k32 (32 bytes of K either way), both operands K-major, which is the only layout
// the PTX ISA allows them (the instruction has no transpose immediates).
PS_WGMMA_SS_N128(__half, "k16.f32.f16.f16", ", 0, 1")
PS_WGMMA_SS_N128(__nv_bfloat16, "k16.f32.bf16.bf16", ", 0, 1")
PS_WGMMA_SS_N256(__half, "k16.f32.f16.f16", ", 0, 1")
PS_WGMMA_SS_N256(__nv_bfloat16, "k16.f32.bf16.bf16", ", 0, 1")
PS_WGMMA_SS_N128(__nv_fp8_e4m3, "k32.f32.e4m3.e4m3", "")
PS_WGMMA_SS_N256(__nv_fp8_e4m3, "k32.f32.e4m3.e4m3", "")
#undef PS_WGMMA_SS_N128
#undef PS_WGMMA_SS_N256

// The operand tiles of one ring slot: BM x 64 of A (K-major), 64 x BN of B (N-major).
template <int BM, int BN, int BK>
struct Slot {
    static_assert(BK == 64, "a 128B-swizzled K-major row holds exactly 64 16-bit elements");
    static_assert(BN % 64 == 0, "B arrives in 64-column (128-byte) swizzle atoms");
    static constexpr unsigned A_BYTES = BM * BK * 2;
    static constexpr unsigned B_ATOM_BYTES = BK * 64 * 2;
    static constexpr unsigned BYTES = A_BYTES + BK * BN * 2;
    static constexpr int K_STEPS = BK / 16;   // wgmma k16 steps per k tile

    // A rows 64*i .. 64*i+63, k16 step k.
    static __device__ __forceinline__ unsigned long long a_desc(unsigned slot, int i, int k) {
        return wgmma_desc16(desc_addr16(slot) + (i * 64 * 128 + k * 32) / 16, 16, 1024);
    }
    // All BN columns of B, k16 step k.
    static __device__ __forceinline__ unsigned long long b_desc(unsigned slot, int k) {
        return wgmma_desc16(desc_addr16(slot) + (A_BYTES + k * 16 * 128) / 16, B_ATOM_BYTES, 1024);
    }
    // One TMA load of A (box 64 x BM) and BN/64 of B (box 64 x BK), all on `bar`.
    static __device__ __forceinline__ void load(unsigned slot, unsigned bar, const TensorMap2D* ta,
                                                const TensorMap2D* tb, int m0, int n0, int kt) {
        tma::mbar_expect_tx(bar, BYTES);   // out-of-bounds zero fill counts too
        tma::load_2d(slot, ta, bar, kt * BK, m0);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)
            tma::load_2d(slot + A_BYTES + j * B_ATOM_BYTES, tb, bar, n0 + 64 * j, kt * BK);
    }
    // The two CTAs of a cluster share B (same n0): each loads its own A and half of B's
    // atoms, multicast to both, so each slot still fills with all BYTES on `bar`.
    static __device__ __forceinline__ void load_pair(unsigned slot, unsigned bar,
                                                     const TensorMap2D* ta, const TensorMap2D* tb,
                                                     int m0, int n0, int kt, unsigned rank) {
        constexpr int HALF = BN / 64 / 2;
        tma::mbar_expect_tx(bar, BYTES);
        tma::load_2d(slot, ta, bar, kt * BK, m0);
#pragma unroll
        for (int j = rank * HALF; j < (rank + 1) * HALF; ++j)
            tma::load_2d_multicast(slot + A_BYTES + j * B_ATOM_BYTES, tb, bar, n0 + 64 * j,
                                   kt * BK, 0b11);
    }
};

// The slot layout of an element type: Slot for the 16-bit types; a stage with other
// inputs (fp8.cu) specialises it, and the ring and the persistent body take theirs from here.
template <typename T, int BM, int BN, int BK>
struct SlotOf { using type = Slot<BM, BN, BK>; };

__device__ __forceinline__ unsigned align1024(unsigned addr) { return (addr + 1023u) & ~1023u; }

// The warp-specialised stages' ring: STAGES slots, each with a "full" mbarrier (the
// producer's expect_tx, completed by TMA bytes) and an "empty" one (every consumer thread
// arrives once its wgmmas have read the slot). `it` counts k tiles across output tiles,
// so slot and phase carry over from one tile to the next.
// With CLUSTER == 2 a slot is refilled by both CTAs' multicasts, so its "empty" barrier
// waits for the consumers of both: lane 0 of each of the 8 consumer warps of each CTA.
template <typename T, int BM, int BN, int BK, int STAGES, int CLUSTER = 1>
struct Ring {
    static_assert(CLUSTER == 1 || CLUSTER == 2, "one CTA, or a pair sharing B");
    using S = typename SlotOf<T, BM, BN, BK>::type;
    static constexpr unsigned CONSUMERS = CLUSTER == 1 ? 128 * (BM / 64) : 8 * CLUSTER;
    unsigned ring, full0, empty0;

    __device__ __forceinline__ void init() const {
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full0 + 8 * s, 1);
            tma::mbar_init(empty0 + 8 * s, CONSUMERS);
        }
        tma::mbar_init_fence();
    }
    // Producer: round r >= 1 of slot s waits for the consumers' (r-1)-th release.
    __device__ __forceinline__ void produce(int it, const TensorMap2D* ta, const TensorMap2D* tb,
                                            int m0, int n0, int kt, unsigned rank = 0) const {
        const int s = it % STAGES;
        if (it >= STAGES) tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) + 1) & 1);
        if constexpr (CLUSTER == 1)
            S::load(ring + s * S::BYTES, full0 + 8 * s, ta, tb, m0, n0, kt);
        else
            S::load_pair(ring + s * S::BYTES, full0 + 8 * s, ta, tb, m0, n0, kt, rank);
    }
    // Consumer warpgroup `half` (rows 64*half..): k tile `it` into acc. One wgmma group
    // stays in flight; the one before it has finished reading its slot, which is freed.
    __device__ __forceinline__ void consume(int it, bool free_previous, float (&acc)[BN / 2],
                                            int half) const {
        const int s = it % STAGES;
        const unsigned slot = ring + s * S::BYTES;
        tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < S::K_STEPS; ++k) {
            if constexpr (BM == 192 && BN == 256) {
                // ptxas checks a wgmma's registers against the launch cap (128 at 512
                // threads), not setmaxnreg's: m64n256's 128 accumulators do not fit it.
                float (&lo)[64] = *reinterpret_cast<float (*)[64]>(&acc[0]);
                float (&hi)[64] = *reinterpret_cast<float (*)[64]>(&acc[64]);
                Wgmma<T, 128>::mma(lo, S::a_desc(slot, half, k), S::b_desc(slot, k), 1);
                Wgmma<T, 128>::mma(hi, S::a_desc(slot, half, k),
                                   S::b_desc(slot, k) + 2 * S::B_ATOM_BYTES / 16, 1);
            } else {
                Wgmma<T, BN>::mma(acc, S::a_desc(slot, half, k), S::b_desc(slot, k), 1);
            }
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (free_previous) release(it - 1);
    }
    __device__ __forceinline__ void release(int it) const {
        if constexpr (CLUSTER == 1) {
            tma::mbar_arrive(empty0 + 8 * (it % STAGES));
        } else {
            __syncwarp();   // the warp's wgmma wait is done in every lane
            if (threadIdx.x % 32 == 0)
                for (unsigned cta = 0; cta < CLUSTER; ++cta)
                    tma::mbar_arrive_cluster(empty0 + 8 * (it % STAGES), cta);
        }
    }
};

// One k tile of a consumer warpgroup that owns MI m64 fragments (row blocks frag0..): wait
// until the slot's bytes have landed, issue its wgmmas, commit them as one group. The
// caller waits for the group (wgmma_wait) and frees the slot.
template <typename T, int BM, int BN, int BK, int MI>
__device__ __forceinline__ void mma_k_tile(float (&acc)[MI][BN / 2], unsigned slot, unsigned full,
                                           unsigned parity, int frag0) {
    using S = Slot<BM, BN, BK>;
    tma::mbar_wait(full, parity);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < BK / 16; ++k)
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
            Wgmma<T, BN>::mma(acc[mi], S::a_desc(slot, frag0 + mi, k), S::b_desc(slot, k), 1);
    wgmma_commit();
}

// Writes one warpgroup's 64 x N accumulator fragment to C rows row0.., columns col0..
// straight from registers (4-byte pairs; N % 8 == 0 keeps each pair inside a row).
template <typename T, int N>
__device__ __forceinline__ void store_fragment(const float (&d)[N / 2], T* C, int row0, int col0,
                                               int M, int Ncols) {
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    const int r = row0 + 16 * w + l / 4;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const int col = col0 + 8 * j + 2 * (l % 4);
        if (col < Ncols) {
            if (r < M)
                *reinterpret_cast<unsigned*>(C + (long long)r * Ncols + col) =
                    tma::Pack<T>::two(d[4 * j], d[4 * j + 1]);
            if (r + 8 < M)
                *reinterpret_cast<unsigned*>(C + (long long)(r + 8) * Ncols + col) =
                    tma::Pack<T>::two(d[4 * j + 2], d[4 * j + 3]);
        }
    }
}

// The k tile a unit loads i-th (k0 <= i < k1): in order, or, on every other unit of a CTA
// (`back`), from the far end. The CTAs of one round of tiles end their k loops on the last
// k tiles of their rows of A and columns of B, and the next round shares those rows (or
// columns) with it: walking back, it starts on the k tiles read last, still in L2, instead of
// on the first ones, which the round's own traffic has evicted. Only the order of the k
// tiles a unit adds changes. Measured on the H200 (2026-12-04, hgemm_tma_wgmma_persistent
// at 4096^3, ncu, fp16): DRAM reads 145.2 -> 124.6 MB at GROUP 16 and 178.8 -> 121.3 MB at
// GROUP 4 (A and B are 67 MB), the cycles unchanged. In alternating rounds against the
// forward order (reports/reference/h200/probes/k-order*.jsonl, two runs): 0.5-1.6% faster at
// the defaults, 0.0-0.3% at the tuned configurations, where the power cap sets the clock.
// hgemm_fused_pingpong's own tile loop keeps the forward order: reversed, it measured 0.994.
__device__ __forceinline__ int k_order(int i, int k0, int k1, bool back) {
    return back ? k0 + k1 - 1 - i : i;
}

// Grouped tile order: `group` tile rows at a time, down each column of the group, so the
// CTAs of one wave share B columns and A rows in L2. Tile `tile` -> (row tm, column tn).
__device__ __forceinline__ void grouped_tile(int tile, int tiles_m, int tiles_n, int group,
                                             int& tm, int& tn) {
    const int per_group = group * tiles_n;
    const int first_m = (tile / per_group) * group;
    const int rows = tiles_m - first_m < group ? tiles_m - first_m : group;
    const int in = tile % per_group;
    tm = first_m + in % rows;
    tn = in / rows;
}

// One consumer warpgroup's 64 x BN accumulator -> a swizzled staging tile -> TMA store of
// C rows row0.., columns n0.. (BN/64 boxes of 64 x 64). `bar_id` is the warpgroup's named
// barrier; the store is committed, not waited for, so it overlaps the next tile's math.
template <typename T, int BN>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[BN / 2], unsigned staging,
                                               const TensorMap2D* tmap_c, int row0, int n0,
                                               unsigned bar_id) {
    constexpr unsigned BOX_BYTES = 64 * 64 * 2;
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    if (t == 0) tma::store_wait_read<0>();   // the last tile's store has read the staging
    named_sync(bar_id, 128);
    const int r = 16 * w + l / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        // 16-byte chunk j % 8 of box j / 8, XOR-swizzled by the row (128B pattern), so the
        // warp's 32 four-byte writes land in 32 different banks.
        const unsigned box = staging + (j / 8) * BOX_BYTES + (l % 4) * 4;
        const unsigned chunk = ((j % 8) ^ (r % 8)) * 16;
        const unsigned lo = tma::Pack<T>::two(acc[4 * j], acc[4 * j + 1]);
        const unsigned hi = tma::Pack<T>::two(acc[4 * j + 2], acc[4 * j + 3]);
        asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(box + r * 128 + chunk), "r"(lo) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(box + (r + 8) * 128 + chunk), "r"(hi)
                     : "memory");
    }
    tma::fence_proxy_async();   // st.shared before the TMA unit reads the tile
    named_sync(bar_id, 128);
    if (t == 0) {
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)
            tma::store_2d(tmap_c, staging + j * BOX_BYTES, n0 + 64 * j, row0);
        tma::store_commit();
    }
}

// The same store through BOXES staging boxes of 64 x 64 (8 KB) instead of BN/64: box b of
// the tile goes to staging box b % BOXES once the TMA store that last read that box (BOXES
// stores ago, this tile's or the previous one's) is done reading it, so the tile leaves in
// BN/64 stores of one box each. BOXES = 2 keeps one store in flight while the next box is
// written; the 48 KB it frees from the consumers' staging (BN 256) pays for a fourth ring
// slot. Same swizzle and fragment mapping as store_tile_tma.
template <typename T, int BN, int BOXES>
__device__ __forceinline__ void store_tile_tma_boxes(const float (&acc)[BN / 2], unsigned staging,
                                                     const TensorMap2D* tmap_c, int row0, int n0,
                                                     unsigned bar_id) {
    static_assert(BOXES >= 1 && BOXES <= BN / 64, "between one box and the whole tile");
    constexpr unsigned BOX_BYTES = 64 * 64 * 2;
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    const int r = 16 * w + l / 4;
#pragma unroll
    for (int b = 0; b < BN / 64; ++b) {
        const unsigned box = staging + (b % BOXES) * BOX_BYTES + (l % 4) * 4;
        if (t == 0) tma::store_wait_read<BOXES - 1>();
        named_sync(bar_id, 128);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int j = 8 * b + jj;
            const unsigned chunk = (jj ^ (r % 8)) * 16;
            const unsigned lo = tma::Pack<T>::two(acc[4 * j], acc[4 * j + 1]);
            const unsigned hi = tma::Pack<T>::two(acc[4 * j + 2], acc[4 * j + 3]);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(box + r * 128 + chunk), "r"(lo)
                         : "memory");
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(box + (r + 8) * 128 + chunk), "r"(hi)
                         : "memory");
        }
        tma::fence_proxy_async();
        named_sync(bar_id, 128);
        if (t == 0) {
            tma::store_2d(tmap_c, staging + (b % BOXES) * BOX_BYTES, n0 + 64 * b, row0);
            tma::store_commit();
        }
    }
}

// ------------------------------------------------------------------ epilogue policies
// What persistent_gemm's consumers do with each output tile, as a policy type E:
//   E::Args                 what the kernel hands over (its extra pointer arguments);
//   E::STAGING_BYTES        the shared memory each consumer's store stages C in;
//   E(args, tid)            built once per consumer thread, before its first tile;
//   after_k_tile(kt, kt_prefetch, row0, n0, M, N)
//                           after every k tile kt of a unit (k tiles [k0, k1) of a tile);
//                           kt_prefetch (KT / 2, or (k0 + k1) / 2 with stream-K) is the
//                           k tile at which an epilogue that reads global memory should
//                           start fetching it (half a unit of math before it is needed);
//   before_last_wait(row0, n0, M, N)
//                           after the unit's last wgmmas are issued (and, with DEFER, the
//                           last tile's boxes sent), before they are waited for: loads
//                           issued here pass under the last k tile's math;
//   store(acc, staging, tmap_c, row0, n0, M, N, bar_id)
//                           the tile's fp32 accumulators once its last wgmma group is done
//                           and its ring slot released: to C, through store_tile_tma.
//   DEFERRED, pack(acc, words, row0, n0, M, N), store_box(words, box, staging, tmap_c,
//                           row0, n0, bar_id)
//                           optional: a policy with DEFERRED true has persistent_gemm pack
//                           each tile instead of storing it and send it a box per k tile of
//                           the next unit (StoreEpilogue and fused.cu's BiasActEpilogue
//                           at DEFER 1).
// row0 / n0 are the consumer's first C row (64 of them) and the tile's first column.
// StoreEpilogue is hgemm_tma_wgmma_persistent's: nothing in the k loop, then the swizzled
// staging (the whole 64 x BN tile when BOXES >= BN/64, else BOXES boxes in turn) + TMA store.
// fused.cu's BiasActEpilogue applies bias / activation / residual to the accumulators first.
// One warpgroup's 64 x BN fragment to C through BOXES staging boxes: the whole tile at once
// when BOXES == BN/64 (store_tile_tma), else BOXES boxes in turn (store_tile_tma_boxes).
template <typename T, int BN, int BOXES>
__device__ __forceinline__ void store_tile_staged(const float (&acc)[BN / 2], unsigned staging,
                                                  const TensorMap2D* tmap_c, int row0, int n0,
                                                  unsigned bar_id) {
    if constexpr (BOXES == BN / 64)
        store_tile_tma<T, BN>(acc, staging, tmap_c, row0, n0, bar_id);
    else
        store_tile_tma_boxes<T, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);
}

// A consumer's 64 x BN tile rounded to T pairs in registers, so that its accumulators are
// free for the next tile's wgmmas while the pairs go to C (store_words_box): word 2j holds
// row r's columns 8j + 2(l%4) and + 1, word 2j + 1 row r + 8's (r = 16w + l/4), the pairs
// store_tile_tma writes.
template <typename T, int BN>
__device__ __forceinline__ void pack_tile(const float (&acc)[BN / 2], unsigned (&words)[BN / 4]) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        words[2 * j] = tma::Pack<T>::two(acc[4 * j], acc[4 * j + 1]);
        words[2 * j + 1] = tma::Pack<T>::two(acc[4 * j + 2], acc[4 * j + 3]);
    }
}

// Box `box` (runtime, < BN/64) of pack_tile's words to C rows row0.., columns
// n0 + 64 * box.., through staging box box % BOXES once the store that last read it is
// done (as store_tile_tma_boxes sends a tile box by box). The loop over b is unrolled so
// that the words are indexed at compile time and stay in registers.
template <int BN, int BOXES>
__device__ __forceinline__ void store_words_box(const unsigned (&words)[BN / 4], int box,
                                                unsigned staging, const TensorMap2D* tmap_c,
                                                int row0, int n0, unsigned bar_id) {
    static_assert(BOXES >= 1 && BOXES <= BN / 64, "between one box and the whole tile");
    constexpr unsigned BOX_BYTES = 64 * 64 * 2;
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    const int r = 16 * w + l / 4;
#pragma unroll
    for (int b = 0; b < BN / 64; ++b) {
        if (b != box) continue;
        const unsigned base = staging + (b % BOXES) * BOX_BYTES;
        if (t == 0) tma::store_wait_read<BOXES - 1>();
        named_sync(bar_id, 128);
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int j = 8 * b + jj;
            const unsigned at = base + (l % 4) * 4 + ((jj ^ (r % 8)) * 16);
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(at + r * 128), "r"(words[2 * j])
                         : "memory");
            asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(at + (r + 8) * 128),
                         "r"(words[2 * j + 1]) : "memory");
        }
        tma::fence_proxy_async();
        named_sync(bar_id, 128);
        if (t == 0) {
            tma::store_2d(tmap_c, base, n0 + 64 * b, row0);
            tma::store_commit();
        }
    }
}

// DEFER = 1: persistent_gemm packs each finished tile (pack) and sends it one 64 x 64 box
// per k tile of the next unit (store_box), each after that k tile's wgmmas are issued and
// the slot before it freed, so the staging and the TMA stores run under the wgmmas instead
// of between two tiles' (64 more registers a consumer thread, inside setmaxnreg's 232).
template <typename T, int BN, int MAX_BOXES = BN / 64, int DEFER = 0>
struct StoreEpilogue {
    // BOXES >= BN/64 (BN 128 in a space that also holds BN 256) stages the whole tile.
    static constexpr int BOXES = MAX_BOXES < BN / 64 ? MAX_BOXES : BN / 64;
    static constexpr unsigned STAGING_BYTES = BOXES * 64 * 64 * 2;
    static constexpr bool DEFERRED = DEFER != 0;
    struct Args {};
    __device__ __forceinline__ StoreEpilogue(const Args&, int) {}
    __device__ __forceinline__ void after_k_tile(int, int, int, int, int, int) const {}
    __device__ __forceinline__ void before_last_wait(int, int, int, int) const {}
    __device__ __forceinline__ void store(float (&acc)[BN / 2], unsigned staging,
                                          const TensorMap2D* tmap_c, int row0, int n0, int, int,
                                          unsigned bar_id) const {
        store_tile_staged<T, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);
    }
    __device__ __forceinline__ void pack(const float (&acc)[BN / 2], unsigned (&words)[BN / 4], int,
                                         int, int, int) const {
        pack_tile<T, BN>(acc, words);
    }
    __device__ __forceinline__ void store_box(const unsigned (&words)[BN / 4], int box,
                                              unsigned staging, const TensorMap2D* tmap_c,
                                              int row0, int n0, unsigned bar_id) const {
        store_words_box<BN, BOXES>(words, box, staging, tmap_c, row0, n0, bar_id);
    }
};

// Whether an epilogue policy defers its stores (E::DEFERRED); policies that do not say so
// (fused.cu's QuantEpilogue) store each tile as soon as it is done.
template <typename E, typename = void>
struct Deferred { static constexpr bool value = false; };
template <typename E>
struct Deferred<E, decltype(void(E::DEFERRED))> { static constexpr bool value = E::DEFERRED; };

// ------------------------------------------------------------------ stream-K
// With STREAMK, persistent_gemm splits the tiles that do not fill a whole round of CTAs
// (the last tiles % CTAs of them) by k iterations instead of by tiles: CTA b takes
// iterations [b * I / CTAs, (b + 1) * I / CTAs) of those tiles' I, so all CTAs finish
// together instead of the last round leaving some idle. A CTA whose share starts inside a
// tile leaves that tile's fp32 partial sums in a global workspace and raises a flag; the
// CTA holding the tile's first k iterations (at the end of its share, about when the
// others have written theirs) waits for the flags, adds the partials and stores C. Each
// CTA writes at most one partial (its share's first, partial tile), so the workspace has
// one slot per CTA and consumer. The finisher clears the flags it consumed, so every
// launch finds them zero. The workspace is module data: launches of one module must not
// overlap (perfscope runs one at a time).
// What it costs, measured on the H200: the split tiles are walked at different k by
// different CTAs, so they share little in L2 and the split round runs slower than a whole
// one (with the partials' traffic removed it still does). With few rounds that loses more
// than the idle CTAs cost (0.95 of the data-parallel time at 4096^3, 3.9 rounds); with many
// it wins (1.02 at 8192^3, 15.5 rounds). STREAMK = 1 always splits; STREAMK = 2 splits only
// when the tiles make at least SK_MIN_ROUNDS rounds, the break-even the measurements put
// between 3.9 and 8.7 rounds.
// (The tune store has more: at 512 tiles on 132 CTAs STREAMK = 1 measured 0.95 of
// STREAMK = 0 at K = 4096 and 0.81-0.89 at K = 7168-8192, where the split round's staggered
// k reads A and B from DRAM, CTA by CTA.)
// STREAMK = 3, the tail split, keeps the k order that shares L2: each of the last round's
// tiles stays with the CTA that would have taken it, which runs its first `tail_cut` k tiles
// in step with the other tail tiles' CTAs (as in a whole round); its last KT - tail_cut k
// tiles go to the CTAs the round leaves idle (spares: tail tile j to spare j % spares, in
// turn), whose fp32 partial (one slot per tail tile) the tile's CTA adds before its store.
// tail_cut balances the two: a spare with P = ceil(tail tiles / spares) pieces finishes
// them, each with its partial's write, by the time the tile's CTA has run tail_cut k tiles
// and read the partial; the tail is split only where that is clearly shorter than a whole
// tile. Not at 512 tiles on 132 CTAs (116 tail tiles, 16 spares, P = 8: at 4096^3 a cut at 62
// would take 68 k tiles' time against 64); at 8192^3 (68 tail tiles, 64 spares, P = 2, KT =
// 128) the cut is at 88, the last round about 94 k tiles' time instead of 128.
constexpr int SK_MAX_CTAS = 160;   // H100/H200 have 132 SMs; a larger grid runs without stream-K
constexpr int SK_MIN_ROUNDS = 8;
// What a cut piece costs beyond its k tiles, in k tiles of math (about 1,100 clocks each at
// BN 256): a CTA's two 64 x BN fp32 partials (128 KB) written, fenced and flagged, and the
// ring restarted. Measured on the H200 (ncu, bf16 4096^3, the tail split at a first guess of
// 2): the spares ran their 8 pieces of 5 k tiles in about 98,000 cycles after their 3 whole
// tiles, 12,300 a piece, 6 k tiles more than the math; the busiest SM ran 10% longer than
// the data-parallel kernel's (307,054 against 278,579 cycles) and the kernel took 1.07x the
// time. The same cost is charged to the tile's own CTA for reading and adding the partial.
constexpr int SK_PARTIAL_K_TILES = 6;
template <int BN>
__device__ float4 sk_partials[SK_MAX_CTAS * 2 * 64 * BN / 4];
template <int BN>
__device__ unsigned sk_flags[SK_MAX_CTAS * 2];

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// MODE 0: no split; 1: the partial round is split; 2: it is when the tiles make at least
// SK_MIN_ROUNDS rounds; 3: the tail split (its tiles' last k tiles to the spares). A
// template parameter, so each mode's kernel holds only its own fixup (registers are tight:
// the consumers' 128 accumulators and a batch of partials).
template <int BN, int MODE>
struct StreamK {
    static_assert(MODE >= 0 && MODE <= 3, "STREAMK: 0 none, 1 and 2 stream-K, 3 the tail split");
    int ctas, KT, dp_tiles, sk_iters;
    int tail_tiles, tail_cut;   // the tail split's (tail_cut 0: none)

    __device__ __forceinline__ StreamK(int tiles, int kt, int ctas_)
        : ctas(ctas_), KT(kt), dp_tiles(tiles), sk_iters(0), tail_tiles(0), tail_cut(0) {
        const int rest = tiles % ctas;
        if (MODE == 0 || ctas > SK_MAX_CTAS || tiles <= ctas || rest == 0) return;
        if constexpr (MODE == 3) {
            // The smallest cut with P * (KT - cut + W) <= cut + W: the spares' pieces and
            // partial writes take no longer than the tile's own k tiles and partial read;
            // split only if that beats the whole tile by at least one more piece's cost
            // (cut + 2 W <= KT), the model's own uncertainty.
            const int pieces = (rest + (ctas - rest) - 1) / (ctas - rest);
            const int cut = (pieces * (KT + SK_PARTIAL_K_TILES) - SK_PARTIAL_K_TILES + pieces) /
                            (pieces + 1);
            if (cut + 2 * SK_PARTIAL_K_TILES <= KT) {
                dp_tiles = tiles - rest;
                tail_tiles = rest;
                tail_cut = cut < 1 ? 1 : cut;
            }
            return;
        }
        if (MODE == 1 || tiles >= SK_MIN_ROUNDS * ctas) {
            dp_tiles = tiles - rest;
            sk_iters = rest * KT;
        }
    }
    // Where the partial of a unit that does not finish its tile goes: the CTA's own slot
    // (stream-K: each CTA writes at most one), or the tail tile's (the tail split: a spare
    // writes several, one per tile).
    __device__ __forceinline__ int slot(int tile) const {
        return MODE == 3 ? tile - dp_tiles : static_cast<int>(blockIdx.x);
    }
    // The first stream-K iteration of CTA b (b = ctas: one past the last).
    __device__ __forceinline__ int start(int b) const {
        return static_cast<int>(static_cast<long long>(b) * sk_iters / ctas);
    }
    // The CTA whose share holds stream-K iteration i.
    __device__ __forceinline__ int owner(int i) const {
        return static_cast<int>((static_cast<long long>(i + 1) * ctas - 1) / sk_iters);
    }
    __device__ __forceinline__ float4* partial(int s, int half) const {
        return sk_partials<BN> + static_cast<long long>(s * 2 + half) * (64 * BN / 4);
    }
    // A consumer's share of a tile it does not finish: its fp32 fragment into slot `s`,
    // float4 by float4 (thread-major, so each warp's stores are coalesced), then the flag.
    __device__ __forceinline__ void write(const float (&acc)[BN / 2], int s, int half,
                                          unsigned bar_id) const {
        const int t = threadIdx.x % 128;
        float4* p = partial(s, half) + t;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
            p[j * 128] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        named_sync(bar_id, 128);   // every thread's partial is written before the flag
        if (t == 0) {
            __threadfence();
            atomicExch(&sk_flags<BN>[s * 2 + half], 1u);
        }
    }
    // The finisher of `tile` (it holds k iterations from 0): the other units' partials of
    // its rows, added into acc once each one's flag is up.
    __device__ __forceinline__ void fixup(float (&acc)[BN / 2], int tile, int half,
                                          unsigned bar_id) const {
        if constexpr (MODE == 3) {   // one spare wrote the rest of the tile, into its slot
            add_partial(acc, tile - dp_tiles, half, bar_id);
            return;
        }
        const int first = (tile - dp_tiles) * KT;
        const int last = owner(first + KT - 1);
        for (int c = owner(first) + 1; c <= last; ++c) {
            if (start(c) == start(c + 1)) continue;   // an empty share wrote nothing
            add_partial(acc, c, half, bar_id);
        }
    }
    // Slot `s`'s partial of consumer `half`, added into acc once its flag is up.
    __device__ __forceinline__ void add_partial(float (&acc)[BN / 2], int s, int half,
                                                unsigned bar_id) const {
        const int t = threadIdx.x % 128;
        if (t == 0) {
            unsigned* flag = &sk_flags<BN>[s * 2 + half];
            while (ld_acquire_gpu(flag) == 0) {}
            *flag = 0;   // consumed: the next launch starts from zero
        }
        named_sync(bar_id, 128);
        const float4* p = partial(s, half) + t;
#pragma unroll
        for (int j0 = 0; j0 < BN / 8; j0 += 8) {
            float4 v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) v[q] = __ldcg(p + (j0 + q) * 128);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                acc[4 * (j0 + q)] += v[q].x;
                acc[4 * (j0 + q) + 1] += v[q].y;
                acc[4 * (j0 + q) + 2] += v[q].z;
                acc[4 * (j0 + q) + 3] += v[q].w;
            }
        }
    }
};

// This CTA's work as (tile, first k tile, end k tile) units, in order: whole tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... below sk.dp_tiles, then (STREAMK 1, 2) its share
// of the stream-K iterations, cut at tile boundaries, or (STREAMK 3) its tail tile's first
// tail_cut k tiles, or, on a spare, the last k tiles of its tail tiles.
template <int STREAMK, int BN, typename F>
__device__ __forceinline__ void for_each_unit(const StreamK<BN, STREAMK>& sk, F&& unit) {
    for (int tile = blockIdx.x; tile < sk.dp_tiles; tile += gridDim.x) unit(tile, 0, sk.KT);
    if constexpr (STREAMK == 3) {
        if (sk.tail_cut) {
            // One call site for both roles: a tail tile's CTA takes its tile (one pass of
            // the loop), a spare the tiles spare, spare + spares, ...
            const int tail = sk.tail_tiles, b = blockIdx.x;
            const bool spare = b >= tail;
            const int k0 = spare ? sk.tail_cut : 0, k1 = spare ? sk.KT : sk.tail_cut;
            const int step = spare ? sk.ctas - tail : tail;
            for (int j = spare ? b - tail : b; j < tail; j += step) unit(sk.dp_tiles + j, k0, k1);
        }
    }
    if constexpr (STREAMK != 0 && STREAMK != 3) {
        const int end = sk.start(blockIdx.x + 1);
        for (int i = sk.start(blockIdx.x); i < end;) {
            const int k0 = i % sk.KT;
            const int k1 = min(sk.KT, k0 + (end - i));
            unit(sk.dp_tiles + i / sk.KT, k0, k1);
            i += k1 - k0;
        }
    }
}

// The units of a CTA: for_each_unit's, or with CTA pairs (CLUSTER = 2) the pair's whole
// units (pairs of tiles), the cluster's index striding by the clusters.
template <int CLUSTER, int STREAMK, int BN, typename F>
__device__ __forceinline__ void for_each_pair_unit(const StreamK<BN, STREAMK>& sk, int pair_units,
                                                   F&& unit) {
    if constexpr (CLUSTER == 1) {
        for_each_unit<STREAMK>(sk, unit);
    } else {
        for (int u = blockIdx.x / CLUSTER; u < pair_units; u += gridDim.x / CLUSTER)
            unit(u, 0, sk.KT);
    }
}

// ------------------------------------------------------------------ persistent body
// The body of hgemm_tma_wgmma_persistent (threads, grid and smem as the header of
// hopper.cu gives them), its epilogue an Epilogue policy: warpgroup 0 produces (thread 0
// walks the CTA's tiles in grouped order and keeps the ring full, running ahead into the
// next tile), warpgroups 1 and 2 consume 64 rows each and hand every finished tile to the
// policy's store (a deferring policy's: to pack, and its boxes to store_box during the
// next unit's first k tiles), whose TMA stores are waited for once, at the end. The kernels calling it
// keep their own ABI and pass their __grid_constant__ tensor maps by address. Both stages
// compile to the SASS they had as two bodies: the policy calls are shaped to inline to the
// same code (the epilogue is built per consumer thread before the tile loop; kt_prefetch is
// an argument, not computed inside after_k_tile), and tests/test_fused.py holds
// hgemm_tma_wgmma_persistent to the committed hopper.cu.
// CLUSTER = 2 (hgemm_tma_wgmma_cluster): the grid is CTA pairs in 2-CTA clusters, each pair
// walking units of two vertically adjacent tiles (tile rows 2p and 2p + 1 of one column) in
// grouped order of GROUP / 2 pair rows; each CTA loads its A and half of the B tile they
// share, multicast to both (Slot::load_pair), and a slot is free once both CTAs' consumers
// have released it. Stream-K is not combined with it (the pair's k loops must match).
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, typename Epilogue,
          int STREAMK = 0, int CLUSTER = 1>
__device__ __forceinline__ void persistent_gemm(const TensorMap2D* tmap_a,
                                                const TensorMap2D* tmap_b,
                                                const TensorMap2D* tmap_c, int M, int N, int K,
                                                const typename Epilogue::Args& args) {
    static_assert(BM == 128 || (BM == 192 && CLUSTER == 1 && STREAMK == 0),
                  "two consumer warpgroups of 64 rows each, or three (BM 192) alone");
    static_assert(BN == 128 || BN == 256, "wgmma m64nBNk16 with BN 128 or 256");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");
    static_assert(GROUP >= 1, "at least one tile row per group");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && STREAMK == 0 && GROUP % 2 == 0),
                  "a CTA pair takes whole tile-row pairs, without stream-K");
    // Each consumer's C staging (swizzled 64 x 64 boxes of 8 KB), as the epilogue sizes it.
    constexpr unsigned STAGING_BYTES = Epilogue::STAGING_BYTES;

    __shared__ alignas(8) unsigned long long bars[2 * STAGES];
    extern __shared__ unsigned char dyn_smem[];
    const Ring<T, BM, BN, BK, STAGES, CLUSTER> ring{align1024(smem_u32(dyn_smem)),
                                                    smem_u32(&bars[0]), smem_u32(&bars[STAGES])};
    const unsigned staging0 = ring.ring + STAGES * SlotOf<T, BM, BN, BK>::type::BYTES;
    const int tid = threadIdx.x, wg = tid / 128;
    const int KT = (K + BK - 1) / BK;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int tiles = tiles_m * tiles_n;
    const StreamK<BN, STREAMK> sk(tiles, KT, gridDim.x);
    const unsigned rank = CLUSTER == 1 ? 0u : tma::cluster_rank();
    // A unit's tile: the grouped tile, or for a pair its row of the grouped pair unit.
    const int pair_rows = (tiles_m + CLUSTER - 1) / CLUSTER;
    const auto tile_of = [&](int unit, int& tm, int& tn) {
        if constexpr (CLUSTER == 1) {
            grouped_tile(unit, tiles_m, tiles_n, GROUP, tm, tn);
        } else {
            grouped_tile(unit, pair_rows, tiles_n, GROUP / CLUSTER, tm, tn);
            tm = tm * CLUSTER + static_cast<int>(rank);
        }
    };

    if (tid == 0) {
        ring.init();
        tma::prefetch_tmap(tmap_a);
        tma::prefetch_tmap(tmap_b);
        tma::prefetch_tmap(tmap_c);
    }
    if constexpr (CLUSTER == 1) {
        __syncthreads();
    } else {
        tma::cluster_sync();   // both CTAs' barriers exist before either multicasts or arrives
    }

    if (wg == 0) {
        if constexpr (BM == 128) setmaxnreg_dec<40>(); else setmaxnreg_dec<32>();
        if (tid == 0) {
            int it = 0;      // k tiles loaded so far, across output tiles
            int units = 0;   // units begun (k_order: every other one walks K backwards)
            const auto load = [&](int tile, int k0, int k1) {
                int tm, tn;
                tile_of(tile, tm, tn);
                const bool back = (units++ & 1) != 0;
                for (int i = k0; i < k1; ++i, ++it)
                    ring.produce(it, tmap_a, tmap_b, tm * BM, tn * BN, k_order(i, k0, k1, back),
                                 rank);
            };
            for_each_pair_unit<CLUSTER, STREAMK>(sk, pair_rows * tiles_n, load);
        }
    } else {
        if constexpr (BM == 128) setmaxnreg_inc<232>(); else setmaxnreg_inc<160>();
        const int half = wg - 1;
        const Epilogue epi(args, tid);
        const unsigned staging = staging0 + half * STAGING_BYTES;
        constexpr bool DEFER = Deferred<Epilogue>::value;
        constexpr int BOXES_N = BN / 64;
        // DEFER: the last finished tile, packed, where it goes, and its next box to send
        // (BOXES_N: all sent).
        unsigned words[BN / 4];   // unused (and dropped) unless DEFER
        int words_row0 = 0, words_n0 = 0, next_box = BOXES_N;
        const auto send_box = [&]() {
            if constexpr (DEFER)   // a policy that does not defer has no store_box
                epi.store_box(words, next_box, staging, tmap_c, words_row0, words_n0, 1 + half);
            ++next_box;
        };
        int it = 0;
        const auto compute = [&](int tile, int k0, int k1) {
            int tm, tn;
            tile_of(tile, tm, tn);
            const int row0 = tm * BM + 64 * half, n0 = tn * BN;
            float acc[BN / 2];
#pragma unroll
            for (int j = 0; j < BN / 2; ++j) acc[j] = 0.f;
            // Halfway through the unit: with stream-K a unit may be any stretch of its tile's
            // k tiles (the tail split's own unit [0, KT / 2) at one piece per spare), and the
            // one that finishes the tile must reach it.
            const int kt_prefetch = STREAMK == 0 ? KT / 2 : (k0 + k1) / 2;
            // The same warpgroup as a warp-uniform value (lane 0's, by a shuffle: tid / 128
            // is per-thread to the compiler), so the k loop's wgmma descriptors are built in
            // uniform registers; made uniform for the whole consumer, it cost the tail split
            // 16 bytes of spills.
            const int frag = __shfl_sync(0xFFFFFFFFu, half, 0);
            for (int kt = k0; kt < k1; ++kt, ++it) {
                ring.consume(it, kt > k0, acc, frag);
                if constexpr (DEFER) {
                    if (next_box < BOXES_N) send_box();   // under this k tile's wgmmas
                }
                epi.after_k_tile(kt, kt_prefetch, row0, n0, M, N);
            }
            if constexpr (DEFER) {
                while (next_box < BOXES_N) send_box();   // a unit of fewer k tiles than boxes
            }
            epi.before_last_wait(row0, n0, M, N);
            wgmma_wait<0>();
            ring.release(it - 1);
            if constexpr (STREAMK != 0) {
                if (k0 != 0) {   // another CTA finishes this tile
                    sk.write(acc, sk.slot(tile), half, 1 + half);
                    return;
                }
                if (k1 != KT) sk.fixup(acc, tile, half, 1 + half);
            }
            if constexpr (DEFER) {
                epi.pack(acc, words, row0, n0, M, N);
                words_row0 = row0;
                words_n0 = n0;
                next_box = 0;
            } else {
                epi.store(acc, staging, tmap_c, row0, n0, M, N, 1 + half);
            }
        };
        for_each_pair_unit<CLUSTER, STREAMK>(sk, pair_rows * tiles_n, compute);
        if constexpr (DEFER) {
            while (next_box < BOXES_N) send_box();
        }
        if (tid % 128 == 0) tma::store_wait_all();
    }
    // No CTA of a pair leaves while its peer may still multicast into it or arrive on its
    // barriers.
    if constexpr (CLUSTER > 1) tma::cluster_sync();
}

}  // namespace hop
