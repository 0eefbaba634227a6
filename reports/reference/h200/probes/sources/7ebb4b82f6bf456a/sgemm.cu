// perfscope FP32 SGEMM ladder: C[M][N] = A[M][K] * B[K][N], row-major, float.
//
// What each stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); the headers here say how.
//
// Written for perfscope after the designs in seeds 000 (sections 2-3) and 002; no code
// is taken from them. Every stage is FFMA-only (no tf32, no tensor cores) and
// accumulates each output in one float across all of K, so its rounding error is that of
// a plain fp32 dot product.
//
// Common ABI of every kernel below:
//   template <typename T, int ...tile params with defaults...>
//   __global__ void NAME(const T* A, const T* B, T* C, int M, int N, int K)
//   T must be float. Block: 1-D, threadIdx.x only. Grid: dim3((N + BN - 1) / BN,
//   (M + BM - 1) / BM) with the BM/BN of that kernel. Shared memory: static only, no
//   dynamic shared memory and no launch attribute needed. Base pointers must be 16-byte
//   aligned (cudaMalloc and CuPy allocations are) for the stages that declare N % 4 or
//   K % 4 constraints.
//
// Compiled by NVRTC (no headers: no <cstdint>, no <cuda.h>) with -lineinfo for sm_80
// and sm_90a. Only sgemm_reg8x8_capped needs an extra flag (-maxrregcount=64).

template <typename U> struct ps_is_float { static constexpr bool value = false; };
template <> struct ps_is_float<float> { static constexpr bool value = true; };

// The vector paths reinterpret T as float4, so a T other than float would compile into
// wrong code rather than fail; stop it at instantiation instead.
#define PS_REQUIRE_FLOAT(T) \
    static_assert(ps_is_float<T>::value, "the sgemm ladder is instantiated with T = float only")

// Blocks per SM that the register-blocked stages ask ptxas for. With 8x8 outputs per
// thread, 128 registers (two 256-thread blocks per SM) hold the accumulators, fragments
// and addresses without spilling, and the second block hides the first one's barrier and
// load waits. Larger thread tiles (tuning instantiations) would spill under that cap, so
// they get the whole register file of one block.
#define PS_MIN_BLOCKS(TM, TN) ((TM) * (TN) <= 64 ? 2 : 1)

// ---------------------------------------------------------------------------------------
// sgemm_naive — one thread per output, straight loop over K.
//   Template: <T = float, BM = 8, BN = 32>; name expression sgemm_naive<float, 8, 32>.
//   Block: BM * BN = 256 threads, 1-D (thread t -> row t / BN, column t % BN, so a warp
//   walks one row of C and its B reads coalesce while its A read is a broadcast).
//   Grid: dim3((N + BN - 1) / BN, (M + BM - 1) / BM). Shared memory: none.
//   Shapes: any M, N, K >= 1. Flags: none beyond the common ones.
//   Parent: none (first rung). Seed 000 section 2.1: every output re-reads a row of A
//   and a column of B from global memory, so there is no on-chip reuse at all.
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 8, int BN = 32>
__global__ void __launch_bounds__(BM * BN)
sgemm_naive(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
            int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    const int row = blockIdx.y * BM + static_cast<int>(threadIdx.x) / BN;
    const int col = blockIdx.x * BN + static_cast<int>(threadIdx.x) % BN;
    if (row >= M || col >= N) return;

    const T* a = A + static_cast<long long>(row) * K;
    const T* b = B + col;
    T acc = T(0);
    for (int k = 0; k < K; ++k)
        acc += a[k] * b[static_cast<long long>(k) * N];
    C[static_cast<long long>(row) * N + col] = acc;
}

// ---------------------------------------------------------------------------------------
// sgemm_smem — square shared-memory tiles, still one output per thread.
//   Template: <T = float, TILE = 32>; name expression sgemm_smem<float, 32>.
//   Block: TILE * TILE = 1024 threads, 1-D (thread t -> row t / TILE, column t % TILE).
//   Grid: dim3((N + TILE - 1) / TILE, (M + TILE - 1) / TILE), i.e. BM = BN = TILE.
//   Shared memory: 2 * TILE * TILE * 4 = 8192 bytes static.
//   Shapes: any M, N, K >= 1 (tile edges are zero-filled). Flags: none extra.
//   Parent: sgemm_naive. Change: each A and B element is fetched from global memory once
//   per tile and then read TILE times from shared memory. Seed 000 section 2.1 (the cure
//   it names) and seed 002 section 2.
// ---------------------------------------------------------------------------------------
// Two 1024-thread blocks fill an SM's 2048 thread slots, which caps registers at 32; with
// the k loop fully unrolled ptxas for sm_80 then spills, hence unroll 16.
template <typename T, int TILE = 32>
__global__ void __launch_bounds__(TILE * TILE, 2)
sgemm_smem(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
           int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    __shared__ T As[TILE][TILE];
    __shared__ T Bs[TILE][TILE];

    const int tx = static_cast<int>(threadIdx.x) % TILE;
    const int ty = static_cast<int>(threadIdx.x) / TILE;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;

    T acc = T(0);
    for (int k0 = 0; k0 < K; k0 += TILE) {
        // Zero-filling out-of-range elements lets the inner loop run a full tile
        // unconditionally; the zeros add nothing to the sum.
        As[ty][tx] = (row < M && k0 + tx < K) ? A[static_cast<long long>(row) * K + k0 + tx]
                                              : T(0);
        Bs[ty][tx] = (k0 + ty < K && col < N) ? B[static_cast<long long>(k0 + ty) * N + col]
                                              : T(0);
        __syncthreads();
#pragma unroll 16
        for (int k = 0; k < TILE; ++k)
            acc += As[ty][k] * Bs[k][tx];   // As: warp-wide broadcast; Bs: 32 banks
        __syncthreads();
    }
    if (row < M && col < N)
        C[static_cast<long long>(row) * N + col] = acc;
}

// ---------------------------------------------------------------------------------------
// Register-blocked body shared by sgemm_reg4x4, sgemm_reg8x8 and sgemm_reg8x8_capped.
// Layout after seed 000 section 2.2: A and B tiles stored as they lie in memory
// (As[BM][BK], Bs[BK][BN]), scalar global loads, each thread owning a contiguous
// TM x TN block of C. Every shape is handled: out-of-range elements load as zero and
// out-of-range outputs are not stored.
// ---------------------------------------------------------------------------------------
template <typename T, int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void
ps_reg_tile_body(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                 int M, int N, int K)
{
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(BM % TM == 0 && BN % TN == 0, "thread tile must divide block tile");
    static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0,
                  "every thread loads the same number of tile elements");

    // 16-byte alignment lets the compiler fetch a thread's TN consecutive B values with
    // vector shared loads.
    __shared__ __align__(16) T As[BM * BK];
    __shared__ __align__(16) T Bs[BK * BN];

    const int tid = static_cast<int>(threadIdx.x);
    const int bm = blockIdx.y * BM;
    const int bn = blockIdx.x * BN;
    const int tr = tid / (BN / TN);
    const int tc = tid % (BN / TN);

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int it = 0; it < (BM * BK) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / BK, c = idx % BK;
            As[idx] = (bm + r < M && k0 + c < K)
                          ? A[static_cast<long long>(bm + r) * K + k0 + c] : T(0);
        }
#pragma unroll
        for (int it = 0; it < (BK * BN) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / BN, c = idx % BN;
            Bs[idx] = (k0 + r < K && bn + c < N)
                          ? B[static_cast<long long>(k0 + r) * N + bn + c] : T(0);
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            T a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[(tr * TM + i) * BK + kk];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk * BN + tc * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + tr * TM + i;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = bn + tc * TN + j;
            if (col < N) C[static_cast<long long>(row) * N + col] = acc[i][j];
        }
    }
}

// ---------------------------------------------------------------------------------------
// sgemm_reg4x4 — 64x64x16 block tile, 256 threads, 4x4 outputs per thread.
//   Template: <T = float, BM = 64, BN = 64, BK = 16, TM = 4, TN = 4>;
//   name expression sgemm_reg4x4<float, 64, 64, 16, 4, 4>.
//   Block: (BM / TM) * (BN / TN) = 256 threads, 1-D. Grid: dim3((N + BN - 1) / BN,
//   (M + BM - 1) / BM). Shared memory: (BM * BK + BK * BN) * 4 = 8192 bytes static.
//   Shapes: any M, N, K >= 1. Flags: none extra.
//   Parent: sgemm_smem. Change: each thread keeps a 4x4 block of C in registers, so one
//   shared load of A feeds 4 FMAs and one of B feeds 4 (16 FMAs per 8 loads instead of
//   1 per 2). Seed 000 sections 2.2 and 2.3.
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 64, int BN = 64, int BK = 16, int TM = 4, int TN = 4>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
sgemm_reg4x4(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
             int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    ps_reg_tile_body<T, BM, BN, BK, TM, TN>(A, B, C, M, N, K);
}

// ---------------------------------------------------------------------------------------
// sgemm_reg8x8 — 128x128x8 block tile, 256 threads, 8x8 outputs per thread.
//   Template: <T = float, BM = 128, BN = 128, BK = 8, TM = 8, TN = 8>;
//   name expression sgemm_reg8x8<float, 128, 128, 8, 8, 8>.
//   Block: (BM / TM) * (BN / TN) = 256 threads, 1-D. Grid: dim3((N + BN - 1) / BN,
//   (M + BM - 1) / BM). Shared memory: (BM * BK + BK * BN) * 4 = 8192 bytes static.
//   Shapes: any M, N, K >= 1. Flags: none extra (ptxas keeps it spill-free).
//   Parent: sgemm_reg4x4. Change: the register block grows to 8x8 (and the block tile
//   to 128x128), so 16 operand loads feed 64 FMAs and each block reuses every loaded
//   element twice as often. Seed 002 section 2.2 (the 8x8 thread tile).
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 128, int BN = 128, int BK = 8, int TM = 8, int TN = 8>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), PS_MIN_BLOCKS(TM, TN))
sgemm_reg8x8(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
             int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    ps_reg_tile_body<T, BM, BN, BK, TM, TN>(A, B, C, M, N, K);
}

// ---------------------------------------------------------------------------------------
// sgemm_reg8x8_capped — variant, slow on purpose: sgemm_reg8x8's exact body under a
// register cap, so its 64 accumulators no longer fit and ptxas spills to local memory
// (seed 002 section 2.2's trap, made visible to the spill rules).
//   Template: <T = float, BM = 128, BN = 128, BK = 8, TM = 8, TN = 8>;
//   name expression sgemm_reg8x8_capped<float, 128, 128, 8, 8, 8>.
//   Block, grid, shared memory, shapes: as sgemm_reg8x8.
//   Required compile flag: -maxrregcount=64 (applies to the whole NVRTC module, so build
//   this kernel in its own module). A separate kernel name, rather than sgemm_reg8x8
//   under the flag, keeps the two apart in Nsight Compute reports. No __launch_bounds__
//   here: a launch bound would let ptxas pick its own limit instead of the flag's.
//   Parent: sgemm_reg8x8. Change: only the compile flag.
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 128, int BN = 128, int BK = 8, int TM = 8, int TN = 8>
__global__ void
sgemm_reg8x8_capped(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
                    int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    ps_reg_tile_body<T, BM, BN, BK, TM, TN>(A, B, C, M, N, K);
}

// ---------------------------------------------------------------------------------------
// sgemm_float4 — 128-bit global loads and stores, A transposed in shared memory.
//   Template: <T = float, BM = 128, BN = 128, BK = 8, TM = 8, TN = 8>;
//   name expression sgemm_float4<float, 128, 128, 8, 8, 8>.
//   Block: (BM / TM) * (BN / TN) = 256 threads, 1-D. Grid: dim3((N + BN - 1) / BN,
//   (M + BM - 1) / BM). Shared memory: (BK * BM + BK * BN) * 4 = 8192 bytes static.
//   Shapes: K % 4 == 0 and N % 4 == 0 (16-byte aligned rows of A, B and C); any M.
//   Ragged tiles are predicated at float4 granularity, which those constraints make exact.
//   Flags: none extra.
//   Parent: sgemm_reg8x8. Change: A, B and C move as float4 (LDG.128/STG.128), and A is
//   stored k-major (As[BK][BM]) so a thread reads its 8 A values as two LDS.128 like B.
//   Seed 002 section 3 (3.1 alignment, 3.2 transposed A).
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 128, int BN = 128, int BK = 8, int TM = 8, int TN = 8>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), PS_MIN_BLOCKS(TM, TN))
sgemm_float4(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
             int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    constexpr int THREADS = (BM / TM) * (BN / TN);
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "float4 granularity");
    static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0,
                  "every thread moves the same number of float4s");

    __shared__ __align__(16) T As[BK][BM];
    __shared__ __align__(16) T Bs[BK][BN];

    const int tid = static_cast<int>(threadIdx.x);
    const int bm = blockIdx.y * BM;
    const int bn = blockIdx.x * BN;
    const int tr = tid / (BN / TN);
    const int tc = tid % (BN / TN);
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int it = 0; it < (BM * BK / 4) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / (BK / 4), kq = (idx % (BK / 4)) * 4;
            // K % 4 == 0, so a float4 starting inside K lies wholly inside it.
            const float4 v = (bm + r < M && k0 + kq < K)
                ? *reinterpret_cast<const float4*>(A + static_cast<long long>(bm + r) * K + k0 + kq)
                : zero4;
            As[kq + 0][r] = v.x;
            As[kq + 1][r] = v.y;
            As[kq + 2][r] = v.z;
            As[kq + 3][r] = v.w;
        }
#pragma unroll
        for (int it = 0; it < (BK * BN / 4) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            const float4 v = (k0 + r < K && bn + c < N)
                ? *reinterpret_cast<const float4*>(B + static_cast<long long>(k0 + r) * N + bn + c)
                : zero4;
            *reinterpret_cast<float4*>(&Bs[r][c]) = v;
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            T a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; i += 4)
                *reinterpret_cast<float4*>(&a[i]) =
                    *reinterpret_cast<const float4*>(&As[kk][tr * TM + i]);
#pragma unroll
            for (int j = 0; j < TN; j += 4)
                *reinterpret_cast<float4*>(&b[j]) =
                    *reinterpret_cast<const float4*>(&Bs[kk][tc * TN + j]);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = bm + tr * TM + i;
        if (row >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            const int col = bn + tc * TN + j;
            if (col < N)
                *reinterpret_cast<float4*>(C + static_cast<long long>(row) * N + col) =
                    make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Warp-tiled fragment layout shared by sgemm_warptile and sgemm_pipe.
//
// The block tile BM x BN is split into (BM / WM) x (BN / WN) warp tiles. Inside a warp,
// lane l sits at (ty, tx) = (l / (WN / TN), l % (WN / TN)) of a WTR x WTC lane grid, and
// its TM x TN outputs are (TM / 4) x (TN / 4) 4x4 pieces spaced WTR * 4 rows and WTC * 4
// columns apart. Why strided rather than contiguous: for one float4 fragment load, the
// lanes of a warp then touch consecutive 16-byte chunks (B: WTC distinct chunks, A: WTR
// distinct chunks, the rest broadcast), so every LDS.128 is one wavefront with no bank
// conflict, where sgemm_float4's contiguous 8x8 blocks put lanes 32 bytes apart.
// ---------------------------------------------------------------------------------------
//
// ps_fma_tile's JOUTER picks the order of the TM x TN FMAs: row by row (0: a[i] held in
// the operand reuse cache across a row of b) or column by column (1: b[j] held down a
// column of a). The products are the same, each accumulator summed in the same k order.
template <typename T, int TM, int TN, int JOUTER = 0>
__device__ __forceinline__ void
ps_fma_tile(T (&acc)[TM][TN], const T (&a)[TM], const T (&b)[TN])
{
    // Probe orders (probes/variants/fma-order.patch), each to move how many FFMAs read two
    // sources from one register bank after the operand reuse cache: 2 row by row with every
    // other row walked backwards (a row's last b[j] is kept for the next row's first), 3 in
    // 2 x 2 blocks walked in a ring, 4 in row pairs down each column.
    if constexpr (JOUTER == 2) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jj = 0; jj < TN; ++jj) {
                const int j = (i & 1) ? TN - 1 - jj : jj;
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
    } else if constexpr (JOUTER == 3) {
#pragma unroll
        for (int i = 0; i < TM; i += 2)
#pragma unroll
            for (int j = 0; j < TN; j += 2) {
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                acc[i][j + 1] = fmaf(a[i], b[j + 1], acc[i][j + 1]);
                acc[i + 1][j + 1] = fmaf(a[i + 1], b[j + 1], acc[i + 1][j + 1]);
                acc[i + 1][j] = fmaf(a[i + 1], b[j], acc[i + 1][j]);
            }
    } else if constexpr (JOUTER == 4) {
#pragma unroll
        for (int i = 0; i < TM; i += 2)
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                acc[i + 1][j] = fmaf(a[i + 1], b[j], acc[i + 1][j]);
            }
    } else if constexpr (JOUTER == 5) {
        // cuBLAS's SGEMM order: column pairs, each walked down the rows, so one a[i] feeds
        // two FFMAs in a row and the pair's b[j], b[j + 1] alternate.
#pragma unroll
        for (int j = 0; j < TN; j += 2)
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                acc[i][j + 1] = fmaf(a[i], b[j + 1], acc[i][j + 1]);
            }
    } else if constexpr (JOUTER == 6) {
        // Column quads walked down the rows.
#pragma unroll
        for (int j = 0; j < TN; j += 4)
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    acc[i][j + q] = fmaf(a[i], b[j + q], acc[i][j + q]);
    } else if constexpr (JOUTER == 7) {
        // Row by row, each row's columns evens first, then odds.
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jj = 0; jj < TN; ++jj) {
                const int j = jj < TN / 2 ? 2 * jj : 2 * (jj - TN / 2) + 1;
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
    } else if constexpr (JOUTER == 8) {
        // Row pairs, each pair's columns walked with the two rows alternating per column
        // pair: keeps loads in row order at a pair's granularity.
#pragma unroll
        for (int i = 0; i < TM; i += 2)
#pragma unroll
            for (int j = 0; j < TN; j += 2) {
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                acc[i][j + 1] = fmaf(a[i], b[j + 1], acc[i][j + 1]);
                acc[i + 1][j] = fmaf(a[i + 1], b[j], acc[i + 1][j]);
                acc[i + 1][j + 1] = fmaf(a[i + 1], b[j + 1], acc[i + 1][j + 1]);
            }
    } else if constexpr (JOUTER == 9) {
        // Row by row, every other row from its middle out (a rotation, not a reversal).
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jj = 0; jj < TN; ++jj) {
                const int j = (i & 1) ? (jj + TN / 2) % TN : jj;
                acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
    } else if constexpr (JOUTER) {
#pragma unroll
        for (int j = 0; j < TN; ++j)
#pragma unroll
            for (int i = 0; i < TM; ++i) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    } else {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// Loads one k-row of a thread's A and B fragments; as_row/bs_row point at this thread's
// first float4 in that k-row of the shared tiles.
template <typename T, int TM, int TN, int A_STEP, int B_STEP>
__device__ __forceinline__ void
ps_load_frags(T (&a)[TM], T (&b)[TN], const T* as_row, const T* bs_row)
{
#pragma unroll
    for (int i = 0; i < TM / 4; ++i)
        *reinterpret_cast<float4*>(&a[4 * i]) =
            *reinterpret_cast<const float4*>(as_row + i * A_STEP);
#pragma unroll
    for (int j = 0; j < TN / 4; ++j)
        *reinterpret_cast<float4*>(&b[4 * j]) =
            *reinterpret_cast<const float4*>(bs_row + j * B_STEP);
}

// Probe (JOUTER 10-14): the FMA tile with the next k step's fragments loaded by hand, one
// float4 after every TN FFMAs until all TM/4 + TN/4 are issued, in one of the orders above:
// 10 serpentine rows (JOUTER 2's), 11 row by row (the stage's), 12 row pairs down each
// column (4's), 13 2 x 2 rings (3's), 14 column pairs down the rows (5's, cuBLAS's).
__host__ __device__ constexpr int ps_spread_order(int jouter)
{
    return jouter == 10 ? 2 : jouter == 11 ? 0 : jouter == 12 ? 4 : jouter == 13 ? 3 : 5;
}
template <int ORDER, int TM, int TN>
__device__ __forceinline__ constexpr int ps_order_i(int f)
{
    if (ORDER == 4) return 2 * (f / (2 * TN)) + f % 2;
    if (ORDER == 3) return 2 * ((f / 4) / (TN / 2)) + ((f % 4) >= 2 ? 1 : 0);
    if (ORDER == 5) return (f % (2 * TM)) / 2;
    return f / TN;
}
template <int ORDER, int TM, int TN>
__device__ __forceinline__ constexpr int ps_order_j(int f)
{
    if (ORDER == 2) return ((f / TN) & 1) ? TN - 1 - f % TN : f % TN;
    if (ORDER == 4) return (f % (2 * TN)) / 2;
    if (ORDER == 3) return 2 * ((f / 4) % (TN / 2)) + ((f % 4) == 1 || (f % 4) == 2 ? 1 : 0);
    if (ORDER == 5) return 2 * (f / (2 * TM)) + f % 2;
    return f % TN;
}
template <typename T, int TM, int TN, int JOUTER, int A_STEP, int B_STEP>
__device__ __forceinline__ void
ps_fma_tile_spread(T (&acc)[TM][TN], const T (&a)[TM], const T (&b)[TN], T (&na)[TM],
                   T (&nb)[TN], const T* as_row, const T* bs_row)
{
    constexpr int ORDER = ps_spread_order(JOUTER);
#pragma unroll
    for (int f = 0; f < TM * TN; ++f) {
        const int i = ps_order_i<ORDER, TM, TN>(f), j = ps_order_j<ORDER, TM, TN>(f);
        acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        if (f % TN == TN - 1) {
            const int q = f / TN;
            if (q < TM / 4)
                *reinterpret_cast<float4*>(&na[4 * q]) =
                    *reinterpret_cast<const float4*>(as_row + q * A_STEP);
            else if (q < TM / 4 + TN / 4)
                *reinterpret_cast<float4*>(&nb[4 * (q - TM / 4)]) =
                    *reinterpret_cast<const float4*>(bs_row + (q - TM / 4) * B_STEP);
        }
    }
}

// Writes a thread's TM x TN outputs as float4s; N % 4 == 0 makes each float4 wholly in
// or wholly out of range.
template <typename T, int TM, int TN, int A_STEP, int B_STEP>
__device__ __forceinline__ void
ps_store_tile(T* __restrict__ C, const T (&acc)[TM][TN], int row0, int col0, int M, int N)
{
#pragma unroll
    for (int i = 0; i < TM / 4; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = row0 + i * A_STEP + r;
            if (row >= M) continue;
#pragma unroll
            for (int j = 0; j < TN / 4; ++j) {
                const int col = col0 + j * B_STEP;
                if (col < N)
                    *reinterpret_cast<float4*>(C + static_cast<long long>(row) * N + col) =
                        make_float4(acc[4 * i + r][4 * j], acc[4 * i + r][4 * j + 1],
                                    acc[4 * i + r][4 * j + 2], acc[4 * i + r][4 * j + 3]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// sgemm_warptile — warp-level tiling with conflict-free shared-memory traffic.
//   Template: <T = float, BM = 128, BN = 128, BK = 8, WM = 32, WN = 64, TM = 8, TN = 8>;
//   name expression sgemm_warptile<float, 128, 128, 8, 32, 64, 8, 8>.
//   Block: (BM / WM) * (BN / WN) * 32 = 256 threads (8 warps as 4 x 2), 1-D.
//   Grid: dim3((N + BN - 1) / BN, (M + BM - 1) / BM).
//   Shared memory: (BK * (BM + 4) + BK * BN) * 4 = 8320 bytes static.
//   Shapes: K % 4 == 0 and N % 4 == 0; any M. Flags: none extra.
//   Parent: sgemm_float4. Change: threads are mapped to warp tiles of strided 4x4
//   fragments and A's transposed tile is padded by 4 columns, so every shared load is
//   one conflict-free (or broadcast) wavefront and the transposing stores are
//   conflict-free too. Seed 002 section 7 (warp-level thread mapping, its next step)
//   and seed 000 section 3.3 (bank conflicts).
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 128, int BN = 128, int BK = 8, int WM = 32, int WN = 64,
          int TM = 8, int TN = 8>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, PS_MIN_BLOCKS(TM, TN))
sgemm_warptile(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
               int M, int N, int K)
{
    PS_REQUIRE_FLOAT(T);
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int WTC = WN / TN;           // lanes along N in a warp
    constexpr int WTR = WM / TM;           // lanes along M in a warp
    constexpr int AP = BM + 4;             // padded k-row of the transposed A tile
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % TM == 0 && WN % TN == 0, "tiling");
    static_assert(WTR * WTC == 32, "a warp tile must hold exactly 32 lanes");
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 4 == 0, "float4 granularity");
    static_assert((BM * BK / 4) % THREADS == 0 && (BK * BN / 4) % THREADS == 0,
                  "every thread moves the same number of float4s");

    __shared__ __align__(16) T As[BK][AP];
    __shared__ __align__(16) T Bs[BK][BN];

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32, warp = tid / 32;
    const int bm = blockIdx.y * BM;
    const int bn = blockIdx.x * BN;
    const int a_off = (warp / WARPS_N) * WM + (lane / WTC) * 4;   // first A column (m)
    const int b_off = (warp % WARPS_N) * WN + (lane % WTC) * 4;   // first B column (n)
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int it = 0; it < (BM * BK / 4) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / (BK / 4), kq = (idx % (BK / 4)) * 4;
            const float4 v = (bm + r < M && k0 + kq < K)
                ? *reinterpret_cast<const float4*>(A + static_cast<long long>(bm + r) * K + k0 + kq)
                : zero4;
            As[kq + 0][r] = v.x;
            As[kq + 1][r] = v.y;
            As[kq + 2][r] = v.z;
            As[kq + 3][r] = v.w;
        }
#pragma unroll
        for (int it = 0; it < (BK * BN / 4) / THREADS; ++it) {
            const int idx = tid + it * THREADS;
            const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
            const float4 v = (k0 + r < K && bn + c < N)
                ? *reinterpret_cast<const float4*>(B + static_cast<long long>(k0 + r) * N + bn + c)
                : zero4;
            *reinterpret_cast<float4*>(&Bs[r][c]) = v;
        }
        __syncthreads();

        // Two fragment register sets: the loads for k + 1 are issued before the FMAs of
        // k, so shared-load latency hides behind 64 independent FMAs.
        T a[2][TM], b[2][TN];
        ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[0], b[0], &As[0][a_off], &Bs[0][b_off]);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk + 1 < BK)
                ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[(kk + 1) % 2], b[(kk + 1) % 2],
                                                           &As[kk + 1][a_off],
                                                           &Bs[kk + 1][b_off]);
            ps_fma_tile<T, TM, TN>(acc, a[kk % 2], b[kk % 2]);
        }
        __syncthreads();
    }

    ps_store_tile<T, TM, TN, WTR * 4, WTC * 4>(C, acc, bm + a_off, bn + b_off, M, N);
}

// ---------------------------------------------------------------------------------------
// cp.async helpers (sm_80+). Declared with inline PTX so no header is needed.
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned ps_smem_u32(const void* p)
{
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 4-byte copy, cached in L1 (.ca is the only cache mode 4-byte copies allow); src_bytes 0
// zero-fills the destination without touching global memory.
__device__ __forceinline__ void ps_cp_async4(unsigned dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// 16-byte copy that bypasses L1 (.cg): B rows are streamed once per block.
__device__ __forceinline__ void ps_cp_async16(unsigned dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void ps_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void ps_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// ---------------------------------------------------------------------------------------
// sgemm_pipe — sgemm_warptile fed by a STAGES-deep cp.async pipeline.
//   Template: <T = float, BM = 128, BN = 128, BK = 8, WM = 32, WN = 64, TM = 8, TN = 8,
//   STAGES = 3>, STAGES in {2, 3, 4}; name expressions
//   sgemm_pipe<float, 128, 128, 8, 32, 64, 8, 8, 2>, <..., 3>, <..., 4>.
//   Block: (BM / WM) * (BN / WN) * 32 = 256 threads (8 warps as 4 x 2), 1-D.
//   Grid: dim3((N + BN - 1) / BN, (M + BM - 1) / BM).
//   Shared memory: STAGES * (BK * (BM + 4) + BK * BN) * 4 bytes static
//   = 16640 (2 stages), 24960 (3), 33280 (4).
//   Shapes: N % 4 == 0; any M and any K (A is copied 4 bytes at a time). The launcher may
//   still declare K % 4 == 0 for uniformity with sgemm_warptile; it is not needed here.
//   Flags: none extra. Needs sm_80+ (cp.async).
//   Parent: sgemm_warptile. Change: global-to-shared copies become cp.async into STAGES
//   shared buffers, running up to STAGES - 1 k-tiles ahead of the FMAs, so loads overlap
//   compute, no registers stage the tiles, and one barrier per k-tile remains instead of
//   two. Seed 002 section 4 (multi-stage pipelining, 2/3/4 stages) and seed 000
//   sections 3.1-3.2 (cp.async).
//
// A is copied with 4-byte cp.async so that it can be transposed on the way into shared
// memory, which 16-byte copies cannot do (cuBLAS's sm80 FFMA kernel also copies 4 bytes
// at a time). B keeps 16-byte copies. With BK = 8, lane l of a warp copies the A element
// at k = l % 8 of row 4 * (group) + l / 8: 4 rows x 32 bytes per instruction in global
// memory (whole sectors) and, with the 4-float pad, 32 distinct banks in shared memory.
// ---------------------------------------------------------------------------------------
template <typename T, int BM, int BN, int BK, int STAGES>
struct PsPipeSmem {
    static constexpr int A_STAGE = BK * (BM + 4);     // floats per stage (A padded by 4)
    static constexpr int B_STAGE = BK * BN;
    static constexpr int FLOATS = STAGES * (A_STAGE + B_STAGE);
};

// The body of sgemm_pipe and sgemm_pipe_dyn: As and Bs are the STAGES shared buffers of A
// (A_STAGE floats each) and B (B_STAGE floats each), wherever the kernel declared them.
template <typename T, int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES,
          int JOUTER>
__device__ __forceinline__ void
ps_sgemm_pipe(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
              int M, int N, int K, T* __restrict__ As, T* __restrict__ Bs)
{
    PS_REQUIRE_FLOAT(T);
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = (BM / WM) * WARPS_N * 32;
    constexpr int WTC = WN / TN;
    constexpr int WTR = WM / TM;
    constexpr int AP = BM + 4;
    constexpr int A_ITERS = BM * BK / THREADS;        // 4-byte copies of A per thread
    constexpr int A_ROWS = THREADS / BK;               // rows of A covered per copy round
    constexpr int B_ITERS = BK * BN / 4 / THREADS;    // 16-byte copies of B per thread
    constexpr int A_STAGE = PsPipeSmem<T, BM, BN, BK, STAGES>::A_STAGE;
    constexpr int B_STAGE = PsPipeSmem<T, BM, BN, BK, STAGES>::B_STAGE;
    static_assert(STAGES >= 2, "a pipeline needs at least two stages");
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % TM == 0 && WN % TN == 0, "tiling");
    static_assert(WTR * WTC == 32, "a warp tile must hold exactly 32 lanes");
    static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % 2 == 0, "float4 fragments");
    static_assert(THREADS % BK == 0 && (BM * BK) % THREADS == 0, "A copy mapping");
    static_assert((BK * BN / 4) % THREADS == 0, "B copy mapping");
    static_assert(A_STAGE == BK * AP, "A's stage is padded by 4 floats per k row");

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32, warp = tid / 32;
    const int bm = blockIdx.y * BM;
    const int bn = blockIdx.x * BN;

    // Copy assignments, fixed for the whole kernel. Rows of A past M and columns of B past
    // N are redirected to row/column 0 (always a valid address) and copy 0 bytes, which
    // zero-fills; only the k index is checked per tile, and only on the last tile.
    const int ak = tid % BK;
    const int am = tid / BK;
    const T* a_src[A_ITERS];
    unsigned a_bytes[A_ITERS];
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int row = bm + am + i * A_ROWS;
        const bool ok = row < M;
        a_src[i] = A + static_cast<long long>(ok ? row : 0) * K + ak;
        a_bytes[i] = ok ? 4u : 0u;
    }
    const unsigned a_dst = ps_smem_u32(&As[ak * AP + am]);

    int bk[B_ITERS];
    const T* b_src[B_ITERS];
    unsigned b_bytes[B_ITERS];
    unsigned b_dst[B_ITERS];
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
        const int f = tid + i * THREADS;
        const int r = f / (BN / 4), c = (f % (BN / 4)) * 4;
        const bool ok = bn + c < N;
        bk[i] = r;
        b_src[i] = B + static_cast<long long>(r) * N + (ok ? bn + c : 0);
        b_bytes[i] = ok ? 16u : 0u;
        b_dst[i] = ps_smem_u32(&Bs[r * BN + c]);
    }

    // Issues the copies of k-tile `tile` into stage `stage`. check_k is only true for the
    // tile that crosses K (the call sites pass it as a constant, so each inlined copy is
    // specialised); there, copies past K read nothing and point at A/B themselves.
    auto issue = [&](int tile, int stage, bool check_k) {
        const int k0 = tile * BK;
        const unsigned a_stage = a_dst + stage * (A_STAGE * 4);
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const unsigned dst = a_stage + i * (A_ROWS * 4);
            if (check_k && k0 + ak >= K) ps_cp_async4(dst, A, 0u);
            else ps_cp_async4(dst, a_src[i] + k0, a_bytes[i]);
        }
#pragma unroll
        for (int i = 0; i < B_ITERS; ++i) {
            const unsigned dst = b_dst[i] + stage * (B_STAGE * 4);
            if (check_k && k0 + bk[i] >= K) ps_cp_async16(dst, B, 0u);
            else ps_cp_async16(dst, b_src[i] + static_cast<long long>(k0) * N, b_bytes[i]);
        }
    };
    auto issue_tile = [&](int tile, int stage) {
        if ((tile + 1) * BK <= K) issue(tile, stage, false);
        else issue(tile, stage, true);
    };

    const int k_tiles = (K + BK - 1) / BK;

    // Fill every stage. Groups are committed even when empty so that "tile t landed" is
    // always "at most STAGES - 2 newer groups pending" in the loop below.
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        if (s < k_tiles) issue_tile(s, s);
        ps_cp_async_commit();
    }

    const int a_off = (warp / WARPS_N) * WM + (lane / WTC) * 4;
    const int b_off = (warp % WARPS_N) * WN + (lane % WTC) * 4;

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    T a[2][TM], b[2][TN];
    ps_cp_async_wait<STAGES - 1>();
    __syncthreads();
    ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[0], b[0], &As[a_off], &Bs[b_off]);

    int stage = 0;
    for (int t = 0; t < k_tiles; ++t) {
        const T* as = &As[stage * A_STAGE + a_off];
        const T* bs = &Bs[stage * B_STAGE + b_off];
        const int next_stage = stage + 1 == STAGES ? 0 : stage + 1;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk + 1 < BK) {
                if constexpr (JOUTER >= 10) {
                    ps_fma_tile_spread<T, TM, TN, JOUTER, WTR * 4, WTC * 4>(
                        acc, a[kk % 2], b[kk % 2], a[(kk + 1) % 2], b[(kk + 1) % 2],
                        as + (kk + 1) * AP, bs + (kk + 1) * BN);
                    continue;
                }
                ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[(kk + 1) % 2], b[(kk + 1) % 2],
                                                           as + (kk + 1) * AP,
                                                           bs + (kk + 1) * BN);
            } else {
                // Every fragment of this stage is in registers now. Once all threads pass
                // the barrier the stage may be refilled with tile t + STAGES, and tile
                // t + 1 (waited for just before) is visible to every thread. Fragment 0 of
                // tile t + 1 is loaded before the last FMAs of tile t to hide its latency.
                ps_cp_async_wait<STAGES - 2>();
                __syncthreads();
                if (t + STAGES < k_tiles) issue_tile(t + STAGES, stage);
                ps_cp_async_commit();
                if (t + 1 < k_tiles)
                    ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(
                        a[0], b[0], &As[next_stage * A_STAGE + a_off],
                        &Bs[next_stage * B_STAGE + b_off]);
            }
            ps_fma_tile<T, TM, TN, (JOUTER >= 10 ? ps_spread_order(JOUTER) : JOUTER)>(
                acc, a[kk % 2], b[kk % 2]);
        }
        stage = next_stage;
    }

    ps_store_tile<T, TM, TN, WTR * 4, WTC * 4>(C, acc, bm + a_off, bn + b_off, M, N);
}

template <typename T, int BM = 128, int BN = 128, int BK = 8, int WM = 32, int WN = 64,
          int TM = 8, int TN = 8, int STAGES = 3>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, PS_MIN_BLOCKS(TM, TN))
sgemm_pipe(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
           int M, int N, int K)
{
    using S = PsPipeSmem<T, BM, BN, BK, STAGES>;
    __shared__ __align__(16) T As[STAGES * S::A_STAGE];
    __shared__ __align__(16) T Bs[STAGES * S::B_STAGE];
    ps_sgemm_pipe<T, BM, BN, BK, WM, WN, TM, TN, STAGES, 0>(A, B, C, M, N, K, As, Bs);
}

// ---------------------------------------------------------------------------------------
// sgemm_pipe_dyn — sgemm_pipe with its shared buffers in dynamic shared memory.
//   Template: as sgemm_pipe, then JOUTER (ps_fma_tile's FMA order); default the tile
//   sgemm_tile128x256 takes: <float, 128, 256, 16, 64, 64, 8, 16, 2, 0>. Block: (BM / WM) * (BN / WN) * 32 = 256 threads (8 warps as 2 x 4).
//   Grid: as sgemm_pipe. Shared memory: STAGES * (BK * (BM + 4) + BK * BN) * 4 bytes
//   dynamic (49,664 at the default: over the 48 KB a kernel may declare statically, so the
//   launch opts in), none static.
//   Shapes and flags: as sgemm_pipe.
//   Parent: sgemm_pipe at sgemm_tile8x16's configuration. Change: the buffers are declared
//   extern and sized at launch. At sgemm_tile8x16's configuration (sgemm_dyn, a declared
//   variant: 0.995x sgemm_tile8x16 in the H200's reference bench) that alone
//   takes the S2UR of SR_CgaCtaId out of the main loop's head, which ptxas emits every k
//   tile to find static buffers' shared window and which drew the most dispatch-stall
//   samples of any instruction in sgemm_tile8x16's H200 report (1,105). And the tiles and
//   depths whose buffers pass 48 KB (a 128 x 256 CTA tile at BK 16, 3 or 4 stages of
//   128 x 128) can be built: the exhaustive tune of sgemm_pipe lost every one of them to
//   ptxas. The default takes cuBLAS's CTA
//   tile on the H200 (`perfscope diff sgemm_tile8x16 cublas_sgemm`: 128 x 256 per CTA of 8
//   warps, one CTA per SM): each CTA reuses each A tile over twice the columns. Seed 002
//   section 4 (larger block tiles), seed 000 section 5.1 (tune the tile).
//   JOUTER = 1 (sgemm_fma_order) issues the FMAs column by column. At sgemm_dyn's
//   configuration ptxas then writes 131 of the main loop's 2,048 FFMAs to another register
//   than their addend (accumulators rotated between registers) instead of 548, and the loop
//   holds 381 other instructions instead of 407. In sgemm_tile8x16's H200 report the rotated
//   FFMAs sit at the k-tile boundary, where 59% of its dispatch stalls fall (22 and 36
//   samples per million executed in the loop's first and last 500 instructions, 9.4 in
//   between; cuBLAS's SGEMM executes no rotated FFMA in its loop); rotation itself is not
//   the cause (Triton's and our register-tiled FP32 kernels rotate as many with no more
//   stalls), so this is a smaller loop to time, not a cure. Seed 002 section 4, seed 000
//   section 5.1.
//   STAGES = 4 at the default tile (sgemm_stages4, parent sgemm_tile128x256) keeps three k
//   tiles in flight behind the one being computed instead of one: 99,328 bytes of buffers,
//   still one CTA per SM (the 255 registers of 256 threads set that). The exhaustive tune
//   of this kernel at 4096^3 on the H200 ranked it first of 642 configurations (with its
//   32 x 128 warp-tile twin): the deeper ring hides the global latency one CTA per SM
//   cannot hide with other warps. Seed 002 section 4 (pipelining), seed 000 section 5.1.
// ---------------------------------------------------------------------------------------
template <typename T, int BM = 128, int BN = 256, int BK = 16, int WM = 64, int WN = 64,
          int TM = 8, int TN = 16, int STAGES = 2, int JOUTER = 0>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32, PS_MIN_BLOCKS(TM, TN))
sgemm_pipe_dyn(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
               int M, int N, int K)
{
    extern __shared__ __align__(16) unsigned char ps_pipe_smem[];
    T* As = reinterpret_cast<T*>(ps_pipe_smem);
    T* Bs = As + STAGES * PsPipeSmem<T, BM, BN, BK, STAGES>::A_STAGE;
    ps_sgemm_pipe<T, BM, BN, BK, WM, WN, TM, TN, STAGES, JOUTER>(A, B, C, M, N, K, As, Bs);
}
