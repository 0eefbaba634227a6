// perfscope FP16/BF16 HGEMM ladder: mma.sync.m16n8k16 on tensor cores (seed 004).
//
// What each stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); the headers here say how.
//
// C[M][N] = A[M][K] * B[K][N], all row-major (numpy `a @ b`), T = __half or
// __nv_bfloat16, fp32 accumulation, C rounded to T (round to nearest even).
//
// Shared by the first four stages (hgemm_ring, last, adds STAGES and takes dynamic
// shared memory; its header says how):
//   template <typename T, int BM = 128, int BN = 128, int BK = 32, int GROUP = 8>
//   threads  256, 1-D (8 warps as 2 x 4; each warp owns a BM/2 x BN/4 = 64x32 C tile,
//            i.e. 4 x 4 m16n8 accumulator fragments, 64 fp32 registers)
//   grid     dim3((N + BN - 1) / BN, (M + BM - 1) / BM); the kernel remaps blockIdx so
//            that consecutive blocks walk strips GROUP tile-columns wide (L2 reuse of B,
//            and of A across the strip); the remap is a bijection for any grid.
//   flags    NVRTC/nvcc with -lineinfo for sm_80 or sm_90a (any arch >= sm_80: cp.async,
//            ldmatrix and bf16 mma.sync need Ampere). C++17 (`if constexpr`).
//   headers  cuda_fp16.h and cuda_bf16.h only.
//   pointers A, B, C from cudaMalloc (16-byte aligned); hgemm_naive checks instead.
//   SASS     LDGSTS (cp.async) + LDSM / LDSM.T (ldmatrix) + HMMA.16816.F32 (fp16) or
//            HMMA.16816.F32.BF16 (bf16); BAR.SYNC; DEPBAR / LDGDEPBAR for the groups.
//
// Name expressions for NVRTC: "hgemm_naive<__half, 128, 128, 32>",
// "hgemm_bcf<__nv_bfloat16, 128, 128, 32>", and so on for the kernels below;
// "hgemm_ring<__half, 128, 256, 64, 3, 8>" (BM, BN, BK, STAGES, GROUP).
//
// Written for perfscope; no code is taken from the seed article, only its design.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace hgemm_detail {

// The mma instruction and the fp32 -> T rounding differ only in their type suffix, so a
// traits struct picks them; T itself never appears in arithmetic.
template <typename T> struct Traits;

template <> struct Traits<__half> {
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // lo lands in the low 16 bits, i.e. at the lower address / lower column.
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    static __device__ __forceinline__ unsigned short bits(float x) {
        return __half_as_ushort(__float2half_rn(x));
    }
};

template <> struct Traits<__nv_bfloat16> {
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    static __device__ __forceinline__ unsigned short bits(float x) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    }
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// src_bytes == 0 reads nothing and writes 16 zero bytes: out-of-range chunks become the
// zero padding that makes ragged M/N/K edges contribute nothing to the product.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, unsigned src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2,
                                              unsigned& r3, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void sts_128(unsigned addr, unsigned a, unsigned b, unsigned c,
                                        unsigned d) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n"
                 :: "r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ void sts_32(unsigned addr, unsigned a) {
    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(addr), "r"(a) : "memory");
}
__device__ __forceinline__ void lds_128(unsigned addr, unsigned& a, unsigned& b, unsigned& c,
                                        unsigned& d) {
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr) : "memory");
}
__device__ __forceinline__ void stg_128(void* p, unsigned a, unsigned b, unsigned c,
                                        unsigned d) {
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n"
                 :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// Physical 16-byte chunk for logical chunk c of row r in a tile whose rows are RC chunks
// wide. ldmatrix serves one 8x8 matrix per phase from 8 row addresses that share c; a
// 128-byte bank line holds 8 chunks, so those 8 rows must land on 8 different chunk
// slots. Rows of RC < 8 chunks pack 8/RC rows per line, so the row bits above that
// pick the XOR; rows of >= 8 chunks take r % 8 directly. Only r % 8 matters either way,
// which lets callers pass lane-derived bits instead of the full row.
template <int RC>
__device__ __forceinline__ int swz(int r, int c) {
    if constexpr (RC >= 8) {
        return c ^ (r & 7);
    } else {
        return c ^ (((r & 7) / (8 / RC)) & (RC - 1));
    }
}

// Grid remap: strips GROUP tile-columns wide, row-major inside a strip. The last strip
// may be narrower, so its width is computed, not assumed (the naive formula that
// assumes gridDim.x % GROUP == 0 maps blocks outside the grid on small shapes).
template <int GROUP>
__device__ __forceinline__ void tile_coords(int& tile_m, int& tile_n) {
    const int gx = gridDim.x, gy = gridDim.y;
    const int lin = blockIdx.y * gx + blockIdx.x;
    const int per_strip = GROUP * gy;
    const int strip = lin / per_strip;
    const int first = strip * GROUP;
    const int width = gx - first < GROUP ? gx - first : GROUP;
    const int local = lin - strip * per_strip;
    tile_n = first + local % width;
    tile_m = local / width;
}

enum Stage { NAIVE = 0, BCF = 1, BCF_DBF = 2, BCF_DBF_RW = 3, RING = 4, RING_SPREAD = 5 };

// RING_DEPTH is read only by the ring stages (the earlier stages fix 1 or 2 buffers).
template <int BM, int BN, int BK, int STAGE, int RING_DEPTH = 2>
struct Shape {
    static constexpr int THREADS = 256;
    static constexpr int WM = BM / 2, WN = BN / 4;       // warp tile, 2 x 4 warps
    static constexpr int MI = WM / 16, NI = WN / 8;      // m16n8 fragments per warp
    static constexpr int KS = BK / 16;                   // k16 steps per tile
    static constexpr int A_RC = BK / 8, B_RC = BN / 8;   // 16-byte chunks per smem row
    static constexpr int A_LOADS = BM * A_RC / THREADS;  // chunks per thread per tile
    static constexpr int B_LOADS = BK * B_RC / THREADS;
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BK * BN * 2;
    static constexpr int STAGES = STAGE >= RING ? RING_DEPTH : STAGE >= BCF_DBF ? 2 : 1;
    static constexpr int OPERAND_BYTES = STAGES * (A_BYTES + B_BYTES);
    static constexpr int C_BYTES = STAGE >= BCF_DBF_RW ? BM * BN * 2 : 0;
    static constexpr int SMEM_BYTES = OPERAND_BYTES > C_BYTES ? OPERAND_BYTES : C_BYTES;

    static_assert(BM % 32 == 0 && BN % 64 == 0 && BK % 16 == 0, "tile must split 2x4 warps");
    static_assert((BK & (BK - 1)) == 0, "the A swizzle needs a power-of-two row of chunks");
    static_assert((BM * A_RC) % THREADS == 0 && (BK * B_RC) % THREADS == 0,
                  "each thread copies a whole number of 16-byte chunks");
    static_assert((BM * B_RC) % THREADS == 0, "C staging splits evenly over threads");
    static_assert(THREADS / A_RC % 8 == 0 && THREADS / B_RC % 8 == 0,
                  "a thread's chunks must share row % 8 so one swizzle serves all");
    static_assert(STAGE >= RING || SMEM_BYTES <= 48 * 1024,
                  "static shared memory is capped at 48 KiB");
    static_assert(STAGE < RING || (RING_DEPTH >= 2 && SMEM_BYTES <= 227 * 1024),
                  "a ring needs two slots and must fit the 227 KiB a block may opt into");
};

// One body for the six stages; the flags below are the ladder. The kernels are thin
// wrappers so each stage is a separately named, separately profiled entry point.
template <typename T, int BM, int BN, int BK, int GROUP, int STAGE, int RING_DEPTH = 2,
          int SPREAD = 1>
__device__ __forceinline__ void hgemm_body(const T* __restrict__ A, const T* __restrict__ B,
                                           T* __restrict__ C, int M, int N, int K,
                                           unsigned char* smem) {
    using S = Shape<BM, BN, BK, STAGE, RING_DEPTH>;
    constexpr bool SWIZZLE = STAGE >= BCF;
    constexpr bool ANY_SHAPE = STAGE == NAIVE;
    constexpr bool STAGED_C = STAGE >= BCF_DBF_RW;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_m = warp >> 2, warp_n = warp & 3;

    int tile_m, tile_n;
    tile_coords<GROUP>(tile_m, tile_n);
    const int m0 = tile_m * BM, n0 = tile_n * BN;

    const unsigned s_base = smem_u32(smem);

    // ---- global -> shared copy assignment (fixed per thread for the whole k loop) ----
    // Thread tid copies chunk tid + i*256 of each tile: rows are whole chunks apart, so a
    // warp covers contiguous 16-byte runs of a global row (coalesced LDGSTS).
    const int a_row0 = tid / S::A_RC, a_chk = tid % S::A_RC;
    const int b_row0 = tid / S::B_RC, b_chk = tid % S::B_RC;
    constexpr int A_ROW_STEP = S::THREADS / S::A_RC, B_ROW_STEP = S::THREADS / S::B_RC;
    const int a_phys = SWIZZLE ? swz<S::A_RC>(a_row0, a_chk) : a_chk;
    const int b_phys = SWIZZLE ? swz<S::B_RC>(b_row0, b_chk) : b_chk;
    const unsigned a_dst = a_row0 * (BK * 2) + a_phys * 16;
    const unsigned b_dst = S::A_BYTES + b_row0 * (BN * 2) + b_phys * 16;

    // Vector (cp.async 16 B) paths need every chunk to be 8 whole, aligned elements.
    // The naive stage checks at run time and falls back to predicated scalar loads; the
    // other stages require K % 8 == 0 and N % 8 == 0 and aligned pointers.
    bool vec_a = true, vec_b = true, vec_c = true;
    if constexpr (ANY_SHAPE) {
        vec_a = (K % 8 == 0) && ((reinterpret_cast<unsigned long long>(A) & 15) == 0);
        vec_b = (N % 8 == 0) && ((reinterpret_cast<unsigned long long>(B) & 15) == 0);
        vec_c = (N % 2 == 0) && ((reinterpret_cast<unsigned long long>(C) & 3) == 0);
    }

    const T* a_src[S::A_LOADS];
    bool a_row_ok[S::A_LOADS];
#pragma unroll
    for (int i = 0; i < S::A_LOADS; ++i) {
        const int gm = m0 + a_row0 + i * A_ROW_STEP;
        a_row_ok[i] = gm < M;
        a_src[i] = A + (long long)(a_row_ok[i] ? gm : 0) * K + a_chk * 8;
    }
    const int a_col = a_chk * 8;
    const int b_col = n0 + b_chk * 8;
    const bool b_col_ok = b_col < N;
    const T* b_src = B + (long long)b_row0 * N + (b_col_ok ? b_col : 0);

    auto load_tile = [&](int kt, unsigned stage_off) {
        const int k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < S::A_LOADS; ++i) {
            const unsigned dst = s_base + stage_off + a_dst + i * A_ROW_STEP * (BK * 2);
            const int gk = k0 + a_col;
            if (vec_a) {
                const bool ok = a_row_ok[i] && gk < K;
                cp_async_16(dst, ok ? (const void*)(a_src[i] + k0) : (const void*)A, ok ? 16u : 0u);
            } else {
                const unsigned short* p = reinterpret_cast<const unsigned short*>(a_src[i] + k0);
                unsigned w[4];
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const unsigned lo = (a_row_ok[i] && gk + e < K) ? p[e] : 0u;
                    const unsigned hi = (a_row_ok[i] && gk + e + 1 < K) ? p[e + 1] : 0u;
                    w[e / 2] = lo | (hi << 16);
                }
                sts_128(dst, w[0], w[1], w[2], w[3]);
            }
        }
#pragma unroll
        for (int i = 0; i < S::B_LOADS; ++i) {
            const unsigned dst = s_base + stage_off + b_dst + i * B_ROW_STEP * (BN * 2);
            const int gk = k0 + b_row0 + i * B_ROW_STEP;
            const T* src = b_src + (long long)(k0 + i * B_ROW_STEP) * N;
            if (vec_b) {
                const bool ok = b_col_ok && gk < K;
                cp_async_16(dst, ok ? (const void*)src : (const void*)B, ok ? 16u : 0u);
            } else {
                const unsigned short* p = reinterpret_cast<const unsigned short*>(src);
                unsigned w[4];
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const bool row_ok = gk < K;
                    const unsigned lo = (row_ok && b_col + e < N) ? p[e] : 0u;
                    const unsigned hi = (row_ok && b_col + e + 1 < N) ? p[e + 1] : 0u;
                    w[e / 2] = lo | (hi << 16);
                }
                sts_128(dst, w[0], w[1], w[2], w[3]);
            }
        }
    };

    // ---- shared -> register fragment addressing ----
    // A (row-major M x K) fragment of m16n8k16 = four 8x8 matrices: (rows 0-7, k 0-7),
    // (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15), which is exactly the
    // order ldmatrix.x4 returns when lane l points at row l % 16, k chunk l / 16.
    // B (row-major K x N) is needed "col": each thread holds two consecutive k of one n.
    // ldmatrix.trans on 8 k-rows of 8 n gives exactly that, so one .x4.trans yields
    // (k 0-7, k 8-15) for n-fragment j and j+1 when lane l points at k row l % 16,
    // n chunk l / 16. Every row used here has row % 8 == lane % 8 (tiles start at
    // multiples of 16), hence swizzles keyed on lane bits.
    const int l16 = lane & 15, lhi = lane >> 4, l8 = lane & 7;
    unsigned a_frag_off[S::KS];
#pragma unroll
    for (int ks = 0; ks < S::KS; ++ks) {
        const int chunk = ks * 2 + lhi;
        const int phys = SWIZZLE ? swz<S::A_RC>(l8, chunk) : chunk;
        a_frag_off[ks] = (warp_m * S::WM + l16) * (BK * 2) + phys * 16;
    }
    unsigned b_frag_off[S::NI / 2];
#pragma unroll
    for (int p = 0; p < S::NI / 2; ++p) {
        const int chunk = (warp_n * S::WN) / 8 + p * 2 + lhi;
        const int phys = SWIZZLE ? swz<S::B_RC>(l8, chunk) : chunk;
        b_frag_off[p] = S::A_BYTES + l16 * (BN * 2) + phys * 16;
    }

    float acc[S::MI][S::NI][4];
#pragma unroll
    for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < S::NI; ++ni)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;

    auto compute_tile = [&](unsigned stage_off) {
        const unsigned sb = s_base + stage_off;
#pragma unroll
        for (int ks = 0; ks < S::KS; ++ks) {
            unsigned af[S::MI][4];
            unsigned bf[S::NI][2];
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
                ldsm_x4(af[mi], sb + a_frag_off[ks] + mi * 16 * (BK * 2));
#pragma unroll
            for (int p = 0; p < S::NI / 2; ++p)
                ldsm_x4_trans(bf[2 * p][0], bf[2 * p][1], bf[2 * p + 1][0], bf[2 * p + 1][1],
                              sb + b_frag_off[p] + ks * 16 * (BN * 2));
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < S::NI; ++ni)
                    Traits<T>::mma(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
        }
    };

    // ---- main loop ----
    const int KT = (K + BK - 1) / BK;
    if constexpr (S::STAGES == 1) {
        for (int kt = 0; kt < KT; ++kt) {
            load_tile(kt, 0);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
            compute_tile(0);
            __syncthreads();  // the next tile overwrites what this one read
        }
    } else if constexpr (STAGE >= RING) {
        // Both ring stages hold each warp's fragments double-buffered in registers
        // across k16 steps and across tiles; they differ in when the copies go.
        static_assert(S::KS % 2 == 0, "the fragment double buffer needs an even k16 count");
        constexpr unsigned STAGE_BYTES = S::A_BYTES + S::B_BYTES;
        constexpr int R = S::STAGES;
        unsigned af[2][S::MI][4];
        unsigned bf[2][S::NI][2];
        auto load_frags = [&](unsigned sb, int ks, int buf) {
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
                ldsm_x4(af[buf][mi], sb + a_frag_off[ks] + mi * 16 * (BK * 2));
#pragma unroll
            for (int p = 0; p < S::NI / 2; ++p)
                ldsm_x4_trans(bf[buf][2 * p][0], bf[buf][2 * p][1], bf[buf][2 * p + 1][0],
                              bf[buf][2 * p + 1][1], sb + b_frag_off[p] + ks * 16 * (BN * 2));
        };
        auto mma_frags = [&](int buf) {
#pragma unroll
            for (int mi = 0; mi < S::MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < S::NI; ++ni)
                    Traits<T>::mma(acc[mi][ni], af[buf][mi], bf[buf][ni][0], bf[buf][ni][1]);
        };
        if constexpr (STAGE == RING_SPREAD) {
            // The ring's copies, cheaper and spread out. A thread's 16-byte chunks of a tile
            // keep what does not change from tile to tile (their row, clamped inside M or N,
            // and whether that row or column is in bounds at all) from the setup above, so a
            // copy is one address and one LDGSTS; only a tile that runs past K (the last, when
            // K % BK != 0) checks k, on a branch every thread takes alike. Tile kt + R - 1
            // goes into the slot tile kt - 1 left (free since the barrier that ended it), in
            // SPREAD shares, one before each of tile kt's k16 steps, so its address work
            // interleaves with the mma.sync stream instead of holding a warp for the whole
            // batch while the tensor pipe waits on the other warp of its scheduler. The price:
            // a tile's copies start up to a tile later, R - 2 tiles (plus the rest of tile kt)
            // ahead of their use instead of the ring's R - 1.
            constexpr int COPIES = S::A_LOADS + S::B_LOADS;
            constexpr int SHARES = SPREAD < 1 ? 1 : SPREAD > S::KS ? S::KS : SPREAD;
            constexpr int PER_SHARE = (COPIES + SHARES - 1) / SHARES;
            const int KT_WHOLE = K / BK;
            const char* a_from[S::A_LOADS];
            unsigned a_bytes[S::A_LOADS];
#pragma unroll
            for (int i = 0; i < S::A_LOADS; ++i) {
                a_from[i] = reinterpret_cast<const char*>(a_src[i]);
                a_bytes[i] = a_row_ok[i] ? 16u : 0u;
            }
            const char* b_from = reinterpret_cast<const char*>(b_src);
            const unsigned b_bytes = b_col_ok ? 16u : 0u;
            const int b_pitch = N * 2;
            // Chunk j of tile kt (A's chunks first, then B's) into the slot at slot_off.
            auto copy_chunk = [&](int j, int kt, unsigned slot_off, bool past_k) {
                const int k0 = kt * BK;
                if (j < S::A_LOADS) {
                    const unsigned dst = slot_off + a_dst + j * A_ROW_STEP * (BK * 2);
                    const bool in_k = !past_k || k0 + a_col < K;
                    cp_async_16(dst, in_k ? (const void*)(a_from[j] + k0 * 2) : (const void*)A,
                                in_k ? a_bytes[j] : 0u);
                } else {
                    const int i = j - S::A_LOADS;
                    const int k = k0 + i * B_ROW_STEP;
                    const unsigned dst = slot_off + b_dst + i * B_ROW_STEP * (BN * 2);
                    const bool in_k = !past_k || k + b_row0 < K;
                    cp_async_16(dst, in_k ? (const void*)(b_from + (long long)k * b_pitch)
                                          : (const void*)B, in_k ? b_bytes : 0u);
                }
            };
            // FILL_WHOLE: the tile lies inside K; FILL_EDGE: it may not (checked, or skipped
            // past KT). Callers pass a constant where they can, so the k loop proper carries
            // no check at all.
            constexpr int FILL_WHOLE = 0, FILL_EDGE = 1;
            auto copy_share = [&](int share, int kt, unsigned slot_off, int mode) {
                if (mode == FILL_WHOLE || kt < KT_WHOLE) {
#pragma unroll
                    for (int j = share * PER_SHARE; j < (share + 1) * PER_SHARE && j < COPIES; ++j)
                        copy_chunk(j, kt, slot_off, false);
                } else if (kt < KT) {
#pragma unroll
                    for (int j = share * PER_SHARE; j < (share + 1) * PER_SHARE && j < COPIES; ++j)
                        copy_chunk(j, kt, slot_off, true);
                }
            };
            // Tiles 0..R-2 before the loop, one group each (empty past KT), so at the end of
            // tile kt, once it has committed tile kt + R - 1's group, "tile kt + 1 landed" is
            // "at most R - 2 groups pending".
#pragma unroll
            for (int t = 0; t < R - 1; ++t) {
#pragma unroll
                for (int share = 0; share < SHARES; ++share)
                    copy_share(share, t, s_base + t * STAGE_BYTES, FILL_EDGE);
                cp_async_commit();
            }
            cp_async_wait<R - 2>();
            __syncthreads();
            load_frags(s_base, 0, 0);
            int slot = 0;
            auto run_tile = [&](int kt, int mode) {
                const unsigned sb = s_base + slot * STAGE_BYTES;
                const int next = slot + 1 == R ? 0 : slot + 1;
                const unsigned fill = s_base + (slot == 0 ? R - 1 : slot - 1) * STAGE_BYTES;
#pragma unroll
                for (int ks = 0; ks < S::KS; ++ks) {
                    if (ks < SHARES) copy_share(ks, kt + R - 1, fill, mode);
                    if (ks + 1 < S::KS) {
                        load_frags(sb, ks + 1, (ks + 1) & 1);
                    } else {
                        cp_async_commit();
                        cp_async_wait<R - 2>();
                        __syncthreads();
                        if (kt + 1 < KT) load_frags(s_base + next * STAGE_BYTES, 0, 0);
                    }
                    mma_frags(ks & 1);
                }
                slot = next;
            };
            // Every tile but the last R - 1 fills a whole-K tile; those last fill the edge
            // tile (if K % BK != 0) or nothing.
            int kt = 0;
            for (; kt < KT_WHOLE - (R - 1); ++kt) run_tile(kt, FILL_WHOLE);
            for (; kt < KT; ++kt) run_tile(kt, FILL_EDGE);
        } else {
            // Tile kt lives in slot kt % STAGES; all STAGES slots are in flight. Fragments are
            // double-buffered in registers across k16 steps and across tiles: at a tile's
            // last k16 step every fragment of it is already in registers, so that is where
            // the one barrier per tile goes (tile kt+1 has landed and is visible, every warp
            // is done reading slot kt, which the next copy refills with tile kt+STAGES), and
            // tile kt+1's first fragments load before the last mma.sync of tile kt, so the
            // tensor pipe has work across the barrier instead of draining at it.
            // Groups are committed even when empty, so "tile t landed" is always "at most
            // STAGES - 2 newer groups pending" at a tile's end (STAGES - 1 before the loop).
#pragma unroll
            for (int s = 0; s < R; ++s) {
                if (s < KT) load_tile(s, s * STAGE_BYTES);
                cp_async_commit();
            }
            cp_async_wait<R - 1>();
            __syncthreads();
            load_frags(s_base, 0, 0);
            int slot = 0;
            for (int kt = 0; kt < KT; ++kt) {
                const unsigned sb = s_base + slot * STAGE_BYTES;
                const int next = slot + 1 == R ? 0 : slot + 1;
#pragma unroll
                for (int ks = 0; ks < S::KS; ++ks) {
                    if (ks + 1 < S::KS) {
                        load_frags(sb, ks + 1, (ks + 1) & 1);
                    } else {
                        cp_async_wait<R - 2>();
                        __syncthreads();
                        if (kt + R < KT) load_tile(kt + R, slot * STAGE_BYTES);
                        cp_async_commit();
                        if (kt + 1 < KT) load_frags(s_base + next * STAGE_BYTES, 0, 0);
                    }
                    mma_frags(ks & 1);
                }
                slot = next;
            }
        }
    } else {
        constexpr unsigned STAGE_BYTES = S::A_BYTES + S::B_BYTES;
        load_tile(0, 0);
        cp_async_commit();
        for (int kt = 0; kt < KT; ++kt) {
            cp_async_wait<0>();
            // One barrier per tile does two jobs: tile kt is visible to every warp, and
            // every warp has finished reading tile kt-1, whose buffer the next copy reuses.
            __syncthreads();
            if (kt + 1 < KT) load_tile(kt + 1, ((kt + 1) & 1) * STAGE_BYTES);
            cp_async_commit();
            compute_tile((kt & 1) * STAGE_BYTES);
        }
    }

    // ---- epilogue ----
    const int g = lane >> 2, t4 = lane & 3;  // C fragment: rows g and g+8, cols 2*t4, +1
    if constexpr (!STAGED_C) {
#pragma unroll
        for (int mi = 0; mi < S::MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < S::NI; ++ni) {
                const int col = n0 + warp_n * S::WN + ni * 8 + t4 * 2;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = m0 + warp_m * S::WM + mi * 16 + g + h * 8;
                    const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                    if (row >= M) continue;
                    T* dst = C + (long long)row * N + col;
                    if (!ANY_SHAPE || (vec_c && col + 1 < N)) {
                        // N even here, so col < N implies col + 1 < N.
                        if (col < N) *reinterpret_cast<unsigned*>(dst) = Traits<T>::pack2(v0, v1);
                    } else {
                        unsigned short* d16 = reinterpret_cast<unsigned short*>(dst);
                        if (col < N) d16[0] = Traits<T>::bits(v0);
                        if (col + 1 < N) d16[1] = Traits<T>::bits(v1);
                    }
                }
            }
        }
    } else {
        // Stage the BM x BN C tile through the (now idle) operand buffers so global
        // writes become whole 16-byte chunks, a warp covering two full 256-byte rows.
        // Rows are BN/8 chunks; XOR by row % 8 spreads the 8 fragment rows a warp writes
        // per st.shared over 8 chunk slots (32 distinct banks), and keeps each 8-thread
        // phase of the 16-byte read-back inside one permuted 128-byte line.
        cp_async_wait<0>();
        __syncthreads();
        constexpr int C_RC = BN / 8;
#pragma unroll
        for (int mi = 0; mi < S::MI; ++mi) {
#pragma unroll
            for (int ni = 0; ni < S::NI; ++ni) {
                const int chunk = (warp_n * S::WN) / 8 + ni;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = warp_m * S::WM + mi * 16 + g + h * 8;
                    const unsigned addr =
                        s_base + r * (BN * 2) + swz<C_RC>(g, chunk) * 16 + t4 * 4;
                    sts_32(addr, Traits<T>::pack2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]));
                }
            }
        }
        __syncthreads();
        constexpr int C_LOADS = BM * C_RC / S::THREADS;
        constexpr int C_ROW_STEP = S::THREADS / C_RC;
        const int c_row0 = tid / C_RC, c_chk = tid % C_RC;
        const int c_phys = swz<C_RC>(c_row0, c_chk);
        const int gn = n0 + c_chk * 8;
#pragma unroll
        for (int i = 0; i < C_LOADS; ++i) {
            const int r = c_row0 + i * C_ROW_STEP;
            unsigned x, y, z, w;
            lds_128(s_base + r * (BN * 2) + c_phys * 16, x, y, z, w);
            const int gm = m0 + r;
            if (gm < M && gn < N) stg_128(C + (long long)gm * N + gn, x, y, z, w);
        }
    }
}

}  // namespace hgemm_detail

// ---------------------------------------------------------------------------------------
// hgemm_naive<T, BM = 128, BN = 128, BK = 32, GROUP = 8>
//   flags: -lineinfo, -arch=sm_80 or sm_90a (NVRTC, CUDA 13.0). ptxas at the defaults, sm_90a:
//     126 registers, no spills, so two 256-thread blocks fit per SM (register-limited).
//   threads 256; grid dim3(ceil(N/BN), ceil(M/BM)); static shared 16384 B (one A+B stage)
//   shapes: any M, N, K >= 1 and any pointer alignment. Chunks that are 8 aligned,
//     in-bounds elements go by cp.async 16 B (out-of-range chunks zero-filled through
//     src-size 0); when K % 8 != 0 (A) or N % 8 != 0 (B), or a pointer is not 16-byte
//     aligned, that operand is loaded with predicated scalar loads and zero fill
//     instead; C stores are predicated per element.
//   parent: none (first stage of the FP16/BF16 ladder).
//   how: cp.async + ldmatrix + mma.sync m16n8k16 with a 2x4-warp 128x128x32 tile and a
//     grid swizzle; shared tiles are NOT swizzled, so ldmatrix hits 4-way (A) and 8-way
//     (B) bank conflicts on purpose.
//   seed 004 section 1 (hgemm_naive).
//   SASS: LDGSTS, LDSM, LDSM.T, HMMA.16816.F32[.BF16], BAR.SYNC, STG.E (32-bit); plus the
//     scalar fallback's LDG.E.U16 / STS.128.
template <typename T, int BM = 128, int BN = 128, int BK = 32, int GROUP = 8>
__global__ void __launch_bounds__(256)
hgemm_naive(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
            int M, int N, int K) {
    using S = hgemm_detail::Shape<BM, BN, BK, hgemm_detail::NAIVE>;
    __shared__ __align__(128) unsigned char smem[S::SMEM_BYTES];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::NAIVE>(A, B, C, M, N, K, smem);
}

// ---------------------------------------------------------------------------------------
// hgemm_bcf<T, BM = 128, BN = 128, BK = 32, GROUP = 8>
//   flags: -lineinfo, -arch=sm_80 or sm_90a (NVRTC, CUDA 13.0). ptxas at the defaults, sm_90a:
//     124 registers, no spills, so two 256-thread blocks fit per SM (register-limited).
//   threads 256; grid dim3(ceil(N/BN), ceil(M/BM)); static shared 16384 B
//   shapes: K % 8 == 0 and N % 8 == 0 (16-byte rows for cp.async); any M; ragged M/N/K
//     tile edges are zero-filled (cp.async src-size 0) and C stores predicated;
//     A, B, C 16-byte aligned.
//   parent: hgemm_naive.
//   how: XOR-swizzles the A and B shared tiles (16-byte chunk ^ row bits) so every
//     ldmatrix phase hits 8 distinct bank groups, i.e. conflict-free.
//   seed 004 section 2 (hgemm_bcf).
//   SASS: LDGSTS, LDSM, LDSM.T, HMMA.16816.F32[.BF16], BAR.SYNC, STG.E (32-bit).
template <typename T, int BM = 128, int BN = 128, int BK = 32, int GROUP = 8>
__global__ void __launch_bounds__(256)
hgemm_bcf(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
          int M, int N, int K) {
    using S = hgemm_detail::Shape<BM, BN, BK, hgemm_detail::BCF>;
    __shared__ __align__(128) unsigned char smem[S::SMEM_BYTES];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::BCF>(A, B, C, M, N, K, smem);
}

// ---------------------------------------------------------------------------------------
// hgemm_bcf_dbf<T, BM = 128, BN = 128, BK = 32, GROUP = 8>
//   flags: -lineinfo, -arch=sm_80 or sm_90a (NVRTC, CUDA 13.0). ptxas at the defaults, sm_90a:
//     123 registers, no spills, so two 256-thread blocks fit per SM (register-limited).
//   threads 256; grid dim3(ceil(N/BN), ceil(M/BM)); static shared 32768 B (two stages)
//   shapes: K % 8 == 0 and N % 8 == 0; any M; edges zero-filled, C stores predicated;
//     A, B, C 16-byte aligned.
//   parent: hgemm_bcf.
//   how: double-buffers the shared tiles, issuing tile k+1's cp.async before the
//     tensor-core work on tile k, with one barrier per k tile instead of two.
//   seed 004 section 3 (hgemm_bcf_dbf).
//   SASS: LDGSTS, LDSM, LDSM.T, HMMA.16816.F32[.BF16], BAR.SYNC, STG.E (32-bit).
template <typename T, int BM = 128, int BN = 128, int BK = 32, int GROUP = 8>
__global__ void __launch_bounds__(256)
hgemm_bcf_dbf(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
              int M, int N, int K) {
    using S = hgemm_detail::Shape<BM, BN, BK, hgemm_detail::BCF_DBF>;
    __shared__ __align__(128) unsigned char smem[S::SMEM_BYTES];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::BCF_DBF>(A, B, C, M, N, K,
                                                                         smem);
}

// ---------------------------------------------------------------------------------------
// hgemm_bcf_dbf_rw<T, BM = 128, BN = 128, BK = 32, GROUP = 8>
//   flags: -lineinfo, -arch=sm_80 or sm_90a (NVRTC, CUDA 13.0). ptxas at the defaults, sm_90a:
//     121 registers, no spills, so two 256-thread blocks fit per SM (register-limited).
//   threads 256; grid dim3(ceil(N/BN), ceil(M/BM)); static shared 32768 B (two operand
//     stages; the BM x BN C tile, 32768 B at the defaults, reuses the same bytes)
//   shapes: K % 8 == 0 and N % 8 == 0; any M; edges zero-filled, C stored per 16-byte
//     chunk with row/column predication; A, B, C 16-byte aligned.
//   parent: hgemm_bcf_dbf.
//   how: stages the C tile through swizzled shared memory and writes it with 16-byte
//     coalesced stores (STS + LDS.128 + STG.E.128) instead of 4-byte fragment stores.
//   seed 004 section 4 (hgemm_bcf_dbf_rw).
//   SASS: LDGSTS, LDSM, LDSM.T, HMMA.16816.F32[.BF16], BAR.SYNC, STS, LDS.128, STG.E.128.
template <typename T, int BM = 128, int BN = 128, int BK = 32, int GROUP = 8>
__global__ void __launch_bounds__(256)
hgemm_bcf_dbf_rw(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K) {
    using S = hgemm_detail::Shape<BM, BN, BK, hgemm_detail::BCF_DBF_RW>;
    __shared__ __align__(128) unsigned char smem[S::SMEM_BYTES];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::BCF_DBF_RW>(A, B, C, M, N, K,
                                                                            smem);
}

// ---------------------------------------------------------------------------------------
// hgemm_ring<T, BM = 128, BN = 256, BK = 64, STAGES = 3, GROUP = 8>
//   flags: -lineinfo, -arch=sm_80 or sm_90a (NVRTC, CUDA 13.0). ptxas at the defaults,
//     sm_90a: see the KernelSpec's note; one 256-thread block per SM at 128x256.
//   threads 256 (8 warps as 2 x 4, each a BM/2 x BN/4 tile: 64x64 at the defaults);
//   grid dim3(ceil(N/BN), ceil(M/BM)); DYNAMIC shared memory
//     max(STAGES * (BM*BK + BK*BN) * 2, BM*BN*2) bytes (147456 at the defaults), so the
//     launcher raises cudaFuncAttributeMaxDynamicSharedMemorySize.
//   shapes: K % 8 == 0 and N % 8 == 0; any M; edges zero-filled, C stored per 16-byte
//     chunk with row/column predication; A, B, C 16-byte aligned.
//   parent: hgemm_bcf_dbf_rw.
//   how: the two fixed buffers become a STAGES-deep cp.async ring (wait_group STAGES-2, one
//     barrier per k tile), so a tile's copies have STAGES-1 tiles of tensor-core work to
//     land in, not one; ldmatrix fragments are double-buffered in registers across k16
//     steps and across the barrier (seed 002's register prefetch, on tensor-core
//     fragments), so the barrier no longer drains the tensor pipe; and the warp tile may
//     grow to 64x64 (BN = 256), which halves the ldmatrix per mma.sync of B. The parent
//     hides latency with a second resident block (its registers cap it there); a ring hides
//     it inside one block, so the tile can grow.
//   seed 004 section 3 (double buffering, generalised to a ring); seed 002 section 4.
//   SASS: LDGSTS, LDSM, LDSM.T, HMMA.16816.F32[.BF16], BAR.SYNC, STS, LDS.128, STG.E.128;
//     no HGMMA and no UTMALDG (sm_80 instructions only).
template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 3, int GROUP = 8>
__global__ void __launch_bounds__(256)
hgemm_ring(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
           int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::RING, STAGES>(A, B, C, M, N,
                                                                             K, smem);
}

// ---------------------------------------------------------------------------------------
// hgemm_ring_spread<T, BM = 128, BN = 256, BK = 64, STAGES = 3, GROUP = 8, SPREAD = 4>
//   flags, threads, grid, dynamic shared memory and shapes: as hgemm_ring.
//   parent: hgemm_ring.
//   how: the same ring, fragments and epilogue; only the copies change (hgemm_body's
//     RING_SPREAD branch says how). What a thread's chunks keep from tile to tile (row,
//     bounds) is worked out once, so a copy of a whole-K tile is an address and an
//     LDGSTS (the ring spent ~110 instructions a warp on its 12 copies, per k tile, each
//     re-checking M, N and K), and a tile's copies are issued in SPREAD shares, one
//     before each of the next tile's first SPREAD k16 steps, where the ring issued them
//     all at the barrier while its warp's mma.sync stream stopped.
//   seed 004 section 3 (the ring); seed 002 section 4 (register prefetch); the spread of
//     copies over the k steps is CUTLASS's multistage main loop's, written here.
//   SASS: as hgemm_ring.
template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 3, int GROUP = 8,
          int SPREAD = 4>
__global__ void __launch_bounds__(256)
hgemm_ring_spread(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                  int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    hgemm_detail::hgemm_body<T, BM, BN, BK, GROUP, hgemm_detail::RING_SPREAD, STAGES, SPREAD>(
        A, B, C, M, N, K, smem);
}
