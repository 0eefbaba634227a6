// perfscope Hopper stages: TMA + wgmma, the FP16/BF16 ladder past mma.sync (sm_90a).
//
// What each stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); the headers here say how.
//
// C[M][N] = A[M][K] * B[K][N], all row-major (numpy `a @ b`), T = __half or
// __nv_bfloat16, fp32 accumulation in registers, C rounded to T. Three templates (the
// persistent one behind four stages) and a cluster variant; the ladder's earlier stages
// (hgemm.cu) stop at mma.sync, which cannot reach cuBLAS on Hopper: cuBLAS runs HGMMA fed by
// UTMALDG there (its SASS, seen through `perfscope diff hgemm_bcf_dbf_rw cublas`).
//
// ABI shared by all four (and by blackwell.cu): (const __grid_constant__ TensorMap2D
// tmap_a, tmap_b, tmap_c, T* C, int M, int N, int K). The host encodes the maps with
// cuTensorMapEncodeTiled and launches with cuLaunchKernelEx (perfscope/kernels/tensormap.py):
//   tmap_a: dims {K, M}, row stride K*2 bytes, box {64, BM}, 128B swizzle
//   tmap_b: dims {N, K}, row stride N*2 bytes, box {64, BK}, 128B swizzle
//   tmap_c: dims {N, M}, row stride N*2 bytes, box {64, 64}, 128B swizzle (TMA stores)
// with zero out-of-bounds fill, which pads ragged M/N/K edges of A and B with 0.
// Shapes: K % 8 == 0 and N % 8 == 0 (TMA global strides are multiples of 16 bytes).
//
// Shared-memory operand layouts, as the 128B-swizzled TMA boxes leave them (PTX ISA
// "Asynchronous Warpgroup Level Matrix Shared Memory Layout", canonical layouts):
//   A, K-major: row m of a tile is 128 bytes (64 elements) at m * 128, 8-row groups 1024
//      bytes apart (SBO); LBO is unused by swizzled K-major layouts (set to 16). The
//      next k16 step is 32 bytes along the row; the hardware applies the XOR.
//   B, N-major ("transposed", imm-trans-b = 1): each 64-column box holds BK k-rows of
//      128 bytes, 8-row groups 1024 bytes apart (SBO); the next 64 columns are the next
//      box, BK * 128 bytes on (LBO). The next k16 step is 16 rows = 2048 bytes on.
// Ring buffers start on 1024-byte boundaries (the swizzle pattern's period); the launch
// adds 1024 bytes of dynamic shared memory as slack to realign them.
//
// Accumulator fragment of wgmma m64nNk16 (f32): thread t of the warpgroup (warp w = t/32,
// lane l) holds d[4j + q] = D[16w + l/4 + 8*(q/2)][8j + 2*(l%4) + (q%2)], j < N/8.
//
// hgemm_tma_wgmma
//   template <typename T, int BM = 128, int BN = 128, int BK = 64, int STAGES = 4>
//   threads  128, 1-D: one warpgroup that is producer and consumer at once
//   grid     dim3((N + BN - 1) / BN, (M + BM - 1) / BM)
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 1024 bytes; static STAGES mbarriers
//   parent   hgemm_bcf_dbf_rw
//   how      Thread 0 keeps a STAGES-deep ring of 128B-swizzled TMA tiles in flight, each
//            completed by an mbarrier (expect_tx); the warpgroup issues BM/64 x 4
//            wgmma m64nBNk16 per 64-wide k tile straight from shared memory, waits for
//            them (wait_group 0) and a block barrier, then thread 0 refills the slot.
//            C goes from the accumulator fragment to global memory directly.
//   seed     000 §4 (Hopper: TMA + wgmma); 004 §5 (what cuBLAS runs)
//
// hgemm_tma_wgmma_ws
//   template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 4>
//   threads  384, 1-D: warpgroup 0 produces (one thread issues TMA), warpgroups 1 and 2
//            consume (64 rows of the 128 x BN tile each)
//   grid     dim3((N + BN - 1) / BN, (M + BM - 1) / BM)
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 1024 bytes; static 2 * STAGES mbarriers
//   parent   hgemm_tma_wgmma
//   how      Warp specialisation: the producer warpgroup gives up registers
//            (setmaxnreg.dec 40) and only waits on "empty" barriers and issues TMA; the two
//            consumer warpgroups take them (setmaxnreg.inc 232), keep one wgmma group in
//            flight (wait_group 1) and free each slot with an mbarrier arrive instead of
//            a block-wide barrier; tile 128 x 256 (m64n256k16), so each B tile feeds
//            twice the rows.
//   seed     000 §4 (warp specialisation)
//
// hgemm_tma_wgmma_persistent
//   template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 3,
//             int GROUP = 8, int BOXES = 4, int STREAMK = 0, int DEFER = 0>
//   threads  384, 1-D, roles as in hgemm_tma_wgmma_ws
//   grid     dim3(min(tiles, multiprocessors)): each CTA walks tiles blockIdx.x,
//            blockIdx.x + gridDim.x, ... in grouped order (GROUP tile rows at a time,
//            column by column), so CTAs running together share A and B tiles in L2, and
//            every other tile's k loop runs from the far end of K, so a round of tiles
//            begins on the k tiles the round before read last (hopper.cuh's k_order)
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 2 * min(BOXES, BN/64) * 64 * 64 * 2 + 1024
//            (the ring and min(BOXES, BN/64) swizzled 64 x 64 C staging boxes per consumer:
//            BOXES >= BN/64 stages the whole 64 x BN tile at once, fewer send it box by box
//            and leave room for a deeper ring); static 2 * STAGES mbarriers
//   parent   hgemm_tma_wgmma_ws
//   how      Persistent CTAs: the producer runs ahead into the next tile while the
//            consumers write this one, the ring's phases carry across tiles, and C leaves
//            through shared memory by TMA store (cp.async.bulk.tensor, bulk groups), so
//            the epilogue no longer issues 64 scattered 4-byte stores per thread.
//   seed     000 §4 (persistent kernels, TMA store epilogue)
//   tuning   Three options for `perfscope tune`, off by default. BOXES < BN/64 (above).
//            STREAMK (000 §5.1, §6.3: tail effects, stream-K): when the tiles are not a
//            whole number of rounds of CTAs (512 tiles on 132 CTAs: 3.88 rounds, the last
//            leaving 16 CTAs idle), the partial round is split by k iterations evenly over
//            all CTAs (STREAMK 1 always, 2 only from 8 rounds up); a tile cut between CTAs
//            is finished by the one holding its first k tiles, which adds the others' fp32
//            partials from the module's workspace (hop::sk_partials and hop::sk_flags: one
//            64 x BN partial and a flag per CTA and consumer, 20 MB at BN 256, zero at
//            load; hop::StreamK in hopper.cuh says how and what it costs) before its store.
//            STREAMK 3 (the tail split) keeps each tile of that round with its CTA for its
//            first k tiles and gives the rest to the CTAs the round leaves idle, so the k
//            order that shares A and B in L2 stays as in a whole round, where that pays for
//            the cut pieces' partials (measured on the H200, 2026-12-02, tune/: 1.012-1.023
//            of the unsplit kernel at 6144^3, 4096x14336x4096 and 8192^3; no split, and
//            0.997-0.998 of it, at 512 or 256 tiles on 132 CTAs).
//            DEFER 1 (the deferred store): between two tiles both consumers used to stage
//            and store C while the tensor pipe waited (0.86 us of a 4096^3 tile's 42.8,
//            tune/tail-split-probe.json.xz); now each consumer rounds its finished tile to
//            T pairs in 64 spare registers and sends one 64 x 64 box of it per k tile of its
//            next unit, after that k tile's wgmmas are issued and the slot before it freed.
//            Sending the whole tile after the next tile's first k tile instead held that
//            slot through the staging and measured 7-8% slower; the box per k tile gains most
//            with one staging box and a fourth ring slot (BOXES 1, STAGES 4). tune/ holds the
//            measurements.
//
// hgemm_tma_wgmma_streamk
//   template hgemm_tma_wgmma_persistent's, at STREAMK 2
//   threads, grid and smem as hgemm_tma_wgmma_persistent
//   parent   hgemm_tma_wgmma_persistent
//   how      Stream-K for the last round of tiles when there are at least 8 rounds (at
//            8192^3, 2048 tiles on 132 CTAs: 15.5 rounds, the last leaving 66 CTAs idle),
//            data-parallel below that, where splitting cost more than it saved on the
//            H200. It took raster groups of 16 tile rows until the k order (hopper.cuh's
//            k_order) made the default 8 as fast at 8192^3 (0.998-0.999, rounds 0.93-1.11)
//            and 1.002-1.004x faster at 4096^3, where this stage is the persistent one
//            (probes/streamk-group.jsonl).
//   seed     000 §5.1, §6.3 (tail effects, stream-K)
//
// hgemm_tma_wgmma_tuned
//   template hgemm_tma_wgmma_persistent's, at STAGES 4, GROUP 16, BOXES 1, DEFER 1
//   threads, grid and smem as hgemm_tma_wgmma_persistent
//   parent   hgemm_tma_wgmma_persistent
//   how      No new code: the configuration `perfscope tune` timed fastest at 4096^3
//            (a fourth ring slot, paid for by staging C one 64 x 64 box at a time, each
//            sent under the next tile's wgmmas).
//   seed     000 §4
//
// hgemm_tma_wgmma_balanced
//   template hgemm_tma_wgmma_persistent's, at hgemm_tma_wgmma_tuned's configuration
//   threads and smem as hgemm_tma_wgmma_persistent
//   grid     dim3(ceil(tiles / ceil(tiles / multiprocessors))): the fewest CTAs that take
//            the tiles in as many rounds as one per multiprocessor does, each CTA the same
//            number of tiles or one fewer (512 tiles: 128 CTAs of 4; 2048: 128 of 16)
//   parent   hgemm_tma_wgmma_tuned
//   how      No new code: the template strides its tiles by gridDim.x, so the grid alone
//            moves the idle SMs from the last round (16 of 132 at 4096^3) to the whole
//            launch (4), which at the power cap runs the busy ones at a higher clock.
//   seed     000 §5.1, §6.3 (tail effects)
//
// hgemm_tma_wgmma_cluster (a variant: measured slower than its parent on the H200)
//   template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 3,
//             int GROUP = 8, int BOXES = 4, int DEFER = 0>
//   threads  384, 1-D, roles as in hgemm_tma_wgmma_persistent
//   cluster  (2, 1, 1), a cuLaunchKernelEx launch attribute; %cluster_ctarank picks the row
//   grid     dim3(min(2 * pairs, 2 * co-resident clusters)), pairs = ceil(tiles_m / 2) *
//            tiles_n; each cluster walks pairs of vertically adjacent tiles in grouped order
//            (GROUP / 2 pair rows per group)
//   smem     as hgemm_tma_wgmma_persistent (ring plus BOXES staging boxes per consumer)
//   parent   hgemm_tma_wgmma_persistent
//   how      The persistent template's body (hop::persistent_gemm with CLUSTER = 2, its
//            BOXES and DEFER options, no stream-K) with the two CTAs of a cluster sharing
//            each B tile: each loads its own A and half of B's 64-column atoms with
//            cp.async.bulk.tensor .multicast::cluster into both CTAs; each slot's "empty"
//            mbarrier counts one arrive per consumer warp of both CTAs (mapa + remote
//            mbarrier.arrive), so neither CTA overwrites a slot its peer still reads;
//            cluster barriers after init and before exit. (Its own body until 2026-12-04,
//            which staged the whole tile and so held 3 ring slots at most: 0.965 of cuBLAS
//            at 4096^3 at best; on the template, at STAGES 4, GROUP 16, BOXES 1, DEFER 1,
//            1.007 / 1.008 (bf16 / fp16), 0.990 / 0.989 of the persistent stage at the same
//            configuration, which is 1.021 / 1.019 of cuBLAS: probes/ in the reference run.)
//   seed     000 §4 (clusters, TMA multicast)
//
// Written for perfscope from the PTX ISA (wgmma, cp.async.bulk.tensor, mbarrier,
// setmaxnreg); no code is taken from the seed articles, CUTLASS or other libraries.
// The device building blocks (namespace hop) live in hopper.cuh, shared with fused.cu.

#include "hopper.cuh"

// ========================================================================== stage 1
template <typename T, int BM, int BN, int BK, int STAGES>
__global__ void __launch_bounds__(128, 1)
hgemm_tma_wgmma(const __grid_constant__ TensorMap2D tmap_a, const __grid_constant__ TensorMap2D tmap_b,
                const __grid_constant__ TensorMap2D tmap_c, T* __restrict__ C, int M, int N, int K) {
    using namespace hop;
    using S = Slot<BM, BN, BK>;
    static_assert(BM % 64 == 0 && BM <= 256, "BM/64 m64 wgmmas per k step; a TMA box is <= 256 rows");
    static_assert(BN == 128 || BN == 256, "wgmma m64nBNk16 with BN 128 or 256");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");
    constexpr int MI = BM / 64;

    __shared__ alignas(8) unsigned long long full[STAGES];
    extern __shared__ unsigned char dyn_smem[];
    const unsigned ring = align1024(smem_u32(dyn_smem));
    const unsigned full0 = smem_u32(&full[0]);
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int KT = (K + BK - 1) / BK;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) tma::mbar_init(full0 + 8 * s, 1);
        tma::mbar_init_fence();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
        for (int kt = 0; kt < KT && kt < STAGES; ++kt)
            S::load(ring + kt * S::BYTES, full0 + 8 * kt, &tmap_a, &tmap_b, m0, n0, kt);
    }
    __syncthreads();

    float acc[MI][BN / 2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[i][j] = 0.f;

    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        const unsigned slot = ring + s * S::BYTES;
        tma::mbar_wait(full0 + 8 * s, (kt / STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < BK / 16; ++k)
#pragma unroll
            for (int i = 0; i < MI; ++i)
                Wgmma<T, BN>::mma(acc[i], S::a_desc(slot, i, k), S::b_desc(slot, k), 1);
        wgmma_commit();
        wgmma_wait<0>();
        __syncthreads();   // every warp's wgmmas have read the slot
        if (tid == 0 && kt + STAGES < KT)
            S::load(slot, full0 + 8 * s, &tmap_a, &tmap_b, m0, n0, kt + STAGES);
    }

#pragma unroll
    for (int i = 0; i < MI; ++i) store_fragment<T, BN>(acc[i], C, m0 + 64 * i, n0, M, N);
}

// ========================================================================== stage 2
template <typename T, int BM, int BN, int BK, int STAGES>
__global__ void __launch_bounds__(384, 1)
hgemm_tma_wgmma_ws(const __grid_constant__ TensorMap2D tmap_a, const __grid_constant__ TensorMap2D tmap_b,
                   const __grid_constant__ TensorMap2D tmap_c, T* __restrict__ C, int M, int N, int K) {
    using namespace hop;
    static_assert(BM == 128, "two consumer warpgroups of 64 rows each");
    static_assert(BN == 128 || BN == 256, "wgmma m64nBNk16 with BN 128 or 256");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");

    __shared__ alignas(8) unsigned long long bars[2 * STAGES];
    extern __shared__ unsigned char dyn_smem[];
    const Ring<T, BM, BN, BK, STAGES> ring{align1024(smem_u32(dyn_smem)), smem_u32(&bars[0]),
                                           smem_u32(&bars[STAGES])};
    const int tid = threadIdx.x, wg = tid / 128;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int KT = (K + BK - 1) / BK;

    if (tid == 0) {
        ring.init();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0)
            for (int kt = 0; kt < KT; ++kt) ring.produce(kt, &tmap_a, &tmap_b, m0, n0, kt);
    } else {
        setmaxnreg_inc<232>();
        const int half = wg - 1;
        float acc[BN / 2];
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc[j] = 0.f;
        for (int kt = 0; kt < KT; ++kt) ring.consume(kt, kt > 0, acc, half);
        wgmma_wait<0>();
        store_fragment<T, BN>(acc, C, m0 + 64 * half, n0, M, N);
    }
}

// ========================================================================== stage 3
// The persistent body (hop::persistent_gemm, hopper.cuh) with the plain TMA-store epilogue;
// fused.cu's hgemm_fused_bias_act is the same body with the bias / activation / residual one.
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int BOXES, int STREAMK,
          int DEFER>
__global__ void __launch_bounds__((BM / 64 + 1) * 128, 1)
hgemm_tma_wgmma_persistent(const __grid_constant__ TensorMap2D tmap_a,
                           const __grid_constant__ TensorMap2D tmap_b,
                           const __grid_constant__ TensorMap2D tmap_c, T* __restrict__ C,
                           int M, int N, int K) {
    hop::persistent_gemm<T, BM, BN, BK, STAGES, GROUP, hop::StoreEpilogue<T, BN, BOXES, DEFER>,
                         STREAMK>(&tmap_a, &tmap_b, &tmap_c, M, N, K, {});
}

// ========================================================================== stage 4
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int BOXES, int DEFER>
__global__ void __launch_bounds__(384, 1)
hgemm_tma_wgmma_cluster(const __grid_constant__ TensorMap2D tmap_a,
                        const __grid_constant__ TensorMap2D tmap_b,
                        const __grid_constant__ TensorMap2D tmap_c, T* __restrict__ C,
                        int M, int N, int K) {
    hop::persistent_gemm<T, BM, BN, BK, STAGES, GROUP, hop::StoreEpilogue<T, BN, BOXES, DEFER>,
                         0, 2>(&tmap_a, &tmap_b, &tmap_c, M, N, K, {});
}
