// perfscope fused-epilogue stages: bias, activation and residual applied to the fp32
// accumulators in registers, before C is rounded (or quantised) and stored (sm_90a; issue 19).
//
// What each stage changes against its parent is written once, in its KernelSpec
// (perfscope/kernels/registry.py; `perfscope kernels` prints it); the headers here say how.
//
// Seed 000 §7.1: cuBLAS computes the plain GEMM; a model then runs the bias, the
// activation and the residual add as separate passes over C, each reading and writing
// M x N elements in DRAM. Doing them in the GEMM's epilogue removes those passes, which
// is where a hand-written kernel can beat cuBLAS + elementwise. The second stage applies
// the same epilogue to decode shapes (M <= 256), where the GEMM is a stream of the weight
// B through DRAM and the measure is bandwidth, not FLOP/s.
//
// C[M][N] = act(A[M][K] * B[K][N] + bias[N]) (+ residual[M][N]), all row-major, T = __half
// or __nv_bfloat16, fp32 accumulation; the bias add, the activation (computed in fp32) and
// the residual add all happen in fp32 on the accumulators, and C is rounded to T once.
//   ACT = 0: none; 1: GELU, tanh form 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
//         2: SiLU x * sigmoid(x), computed as 0.5x(1 + tanh(x/2)). tanh is tanh.approx.f32
//         (one MUFU op; relative error about 2^-11, below bf16's and at fp16's rounding).
//   RESIDUAL = 1: + residual[m][n], read from global memory after the activation. The
//         residual may be C itself (C = act(A*B + bias) + C): each output tile reads its
//         residual into registers before the tile is written, and only that tile's CTA
//         ever writes those elements.
//
// ABI (both stages): hopper.cu's tensor-map ABI with two pointers appended,
//   (const __grid_constant__ TensorMap2D tmap_a, tmap_b, tmap_c, T* C, int M, int N, int K,
//    const T* bias, const T* residual)
// bias: N elements, or nullptr for none; residual: M x N (row stride N), or nullptr when
// RESIDUAL == 0. Both 16-byte aligned. The maps are those of hopper.cu (A box {64, BM},
// B box {64, BK}, C box {64, 64}, 128B swizzle, zero OOB fill); K % 8 == 0, N % 8 == 0.
// Ragged M and N: A and B are zero-filled by TMA, bias and residual reads are predicated
// on n < N and m < M, and the TMA store clips C.
//
// The Hopper building blocks (wgmma, the ring, the swizzled staging + TMA store) are
// hopper.cuh's; the operand layouts and the accumulator fragment are described in the
// header of hopper.cu: thread t (warp w = t%128/32, lane l) of a consumer warpgroup holds
// d[4j + q] = D[16w + l/4 + 8*(q/2)][8j + 2*(l%4) + (q%2)].
//
// hgemm_fused_bias_act
//   template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 3,
//             int GROUP = 8, int ACT = 1, int RESIDUAL = 0, int BOXES = BN / 64,
//             int STREAMK = 0, int DEFER = 0>
//   threads  384, 1-D: warpgroup 0 produces (one thread issues TMA), 1 and 2 consume
//   grid     dim3(min(tiles, multiprocessors)), persistent, grouped tile order
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 2 * min(BOXES, BN/64) * 8192 + 1024
//            bytes (as the parent); static 2 * STAGES mbarriers
//   options  The parent's tuning options, with its meaning (hopper.cuh): BOXES C staging
//            boxes per consumer, STREAMK 1 (stream-K of the last round) or 3 (the tail
//            split), DEFER 1 (the deferred store: the epilogue runs as each finished tile
//            is packed to T pairs, which go out a box per k tile of the next unit, under
//            its wgmmas; the bias pairs are then loaded after the unit's last wgmmas are
//            issued, not halfway, since the k loop may still hold the last tile's pairs).
//            The defaults compile to the SASS of the stage before the options existed.
//   parent   hgemm_tma_wgmma_persistent
//   how      The parent's TMA-store epilogue, preceded by bias + activation (+ residual)
//            on the fp32 accumulators. Halfway through each tile's k loop every consumer
//            thread loads its BN/8 bias pairs into registers (HeldBias: read between the
//            tiles instead, with the tensor pipe idle, they cost 2.2% at 4096^3), and with
//            RESIDUAL one warp of each consumer prefetches the tile's residual rows into L2
//            (cp.async.bulk.prefetch); the epilogue then loads its 2 x BN/8 residual pairs
//            (all issued before any is used, so their latency overlaps) and, with them
//            taking the registers, reads its bias pairs where it uses them.
//   seed     000 §7.1 (epilogue fusion: bias, activation, residual)
//
// hgemm_small_m
//   template <typename T, int BM = 64, int BN = 128, int BK = 64, int STAGES = 8,
//             int ACT = 1, int RESIDUAL = 0, int AROWS = BM, int MCAST = 1, int MPAIR = 1,
//             int GSPLIT = 1, int PACKED = 0>
//   threads  128 * (1 + CONS), CONS = 1 consumer warpgroup for BM = 64, else 2; each
//            consumer owns BM / CONS rows (MI = BM / 64 / CONS m64 fragments)
//   cluster  (P * S, 1, 1), a launch attribute; S = split count, P = MCAST * MPAIR (1 or
//            2: a pair of output tiles), S read as %cluster_nctarank / P
//   grid     dim3(ceil(N / BN) * S * MPAIR, ceil(M / BM / MPAIR), GSPLIT): CTA x = n * S + s
//            (with MPAIR = 2, x = (2n + m % 2) * S + s and y = m / 2) computes k tiles
//            [p*KT/P, (p+1)*KT/P) of output tile (m = y, n), p = z * S + s of P = S * GSPLIT
//            parts; with M <= BM there is one tile row, so B is read from DRAM exactly once
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 1024 bytes (the host's rings: 192 KB
//            at BM 128 / 256, and at BM 64 the measured 8 stages of BN 64 (128 KB) or 6 of
//            BN 128 (144 KB), fused_specs.SMALL_M_THIN_STAGES), + 16 KB past the ring for a
//            peer's pushed partial at BM = BN = 64 without a pair or a grid split (PUSH);
//            static 2 * STAGES mbarriers (+ 2 with PUSH). After the k loop the ring holds the
//            fp32 partials of the units a split does not own, then the C staging of those it
//            does
//   parent   hgemm_tma_wgmma_persistent
//   how      For decode shapes (M <= 256): thin tiles (M padded to BM by TMA zero fill;
//            wgmma m64), a deep ring (8 x 8 KB of B per SM at BM = 64, BN = 64), and split-K
//            over the S CTAs of a thread-block cluster so that ceil(N/BN) * S CTAs (about
//            all the SMs) each stream a disjoint slab of B. The fp32 partials are reduced
//            through distributed shared memory, the work spread over the splits: the tile's
//            units (64-row fragment x 64-column box) belong to split u % S; each CTA writes
//            the units it does not own to its own shared memory, a cluster barrier, each
//            owner adds the other splits' copies of its units in rank order
//            (ld.shared::cluster), a second cluster barrier lets the peers exit, and each
//            owner applies bias / activation / residual (which an idle warp of rank 0's
//            producer warpgroup prefetched into L2 at the start) to its units and stores them
//            by TMA. PUSH (the 64 x 64 tile, one unit, split in two: the host's choice at
//            N = 4096 for M <= 64): split 1 writes its partial straight into split 0's
//            region past the ring (st.async, 16 bytes per store, counted as complete_tx bytes
//            on split 0's barrier, armed before a cluster phase begun at the start and waited
//            for after the k loop), and split 0 waits on its own barrier: no cluster barrier
//            between the k loop and the epilogue, one (relaxed, for the CTAs' lifetime) after
//            it. Per-CTA probes put the old way's span from the last k tile to the epilogue at
//            1.28 us (benchmarks/small_m_probe.py); against it, in alternating rounds, bf16,
//            outputs bit-identical: 0.943-0.948 of the time at 16 and 64 x 4096^2,
//            0.976-0.982 at 16 and 64 x 4096 x 14336 (fused/probe-push.json). Before 2026-12-02 rank 0 read and finished the whole tile: at 256 x 8192^2
//            (BM 256, S 2) the spread reduction is 1.04-1.05x faster (0.998-0.999 of
//            cublas+gelu against 0.952-0.961), the 3-way split at 256 x 4096 x 14336 1.07x.
//            MPAIR = 2: the two CTAs of a pair of vertically adjacent tiles (the same N tile,
//            tile rows 2p and 2p + 1) share B: in turn, atom by atom, each loads a 64-column
//            atom of B for both (TMA .multicast::cluster) and its own A, so B crosses L2 and
//            DRAM once per pair as with one 256-row tile, but without that tile's split-K
//            reduction; each consumer warp frees a slot in both CTAs' empty barriers, and the
//            pair meets once more at the end, after its epilogues. Measured on the H200
//            (2026-12-02, bf16 and fp16, fused/small-m-pairs.json): 128 x 128 tiles paired
//            1.02-1.03x faster than the 256-row tile at 256 x 8192 x 8192, 1.06-1.08x at
//            256 x 8192 x 4096, 1.13-1.15x at 192 x 8192 x 8192; 128 x 64 tiles paired
//            1.03-1.06x faster than unpaired at 256 x 4096 x 14336, 1.01-1.03x at K = 8192
//            and 0.96-0.97x at K = 4096 (a run 80 minutes before: 1.02-1.04x, 1.00-1.06x,
//            0.97-0.99x), where the
//            pair's later first load (after the cluster barrier) and lock step weigh more.
//            Issuing the pair's own A loads before the cluster barrier made it slower
//            (1.03-1.05x the time at N = 8192: the first k tile's B then queued behind the
//            ring's A tiles).
//            GSPLIT > 1 (default 1; MI = 1 only): split-K across the grid's z instead of the
//            cluster, so a pair (MPAIR = 2) can also split without clusters of 4, which the
//            H200 holds too few of at once: the CTA of part z > 0 pushes each consumer's
//            64 x BN fp32 fragment through hopper.cuh's stream-K workspace (StreamK::write,
//            a slot per (x, y) and part) and skips the epilogue (it loads no bias and
//            prefetches no residual); part 0 adds the others'
//            (StreamK::add_partial, waiting on their flags) and finishes the tile. Part 0
//            waits for CTAs launched after it, so every CTA must be co-resident (the host
//            keeps the grid within the SMs) and launches of one module must not overlap.
//            Tile shape, chosen on the host (fused_specs.small_m_for): BN = 64 (wgmma n64;
//            8 stages at BM = 64 and at BM = 128) wherever the 64-column tiles fit one wave,
//            with BM = 64 up to M = 64 and BM = 128 above (two tile rows at M = 256, B read
//            by both, the second time mostly from L2; paired, MPAIR = 2, from 128 k tiles);
//            else BN = 128 and the one tile row of BM = 64 / 128 / 256, or above M = 128 two
//            paired rows of BM = 128 where both fit one wave (fused_specs.small_m_pairs).
//            BN = 256 (4 stages at BM = 64) still compiles; it was
//            the slowest width at every timed shape. At M = 256, 64-row tiles four deep
//            (m64n128 / m64n256 past PS114's m64n64 roof) measured 0.68-0.93 of cublas+gelu
//            against the host's 1.02-1.08: four tile rows read B four times, from DRAM
//            (fused/small-m-thin.json). AROWS < BM (16 or 32, for M <= AROWS
//            at BM = 64): A's TMA box holds only AROWS rows, and the tile's other rows are
//            zeroed once at the start, so no k tile spends TMA time zero-filling rows past M.
//            MCAST = 2 (default 1): clusters of 2 x S CTAs, the S splits of two adjacent N
//            tiles (cluster rank = pair * S + split; N tiles an even count). The two CTAs of
//            one split share every A tile: each loads every other one for both (TMA
//            .multicast::cluster), so A crosses L2 once per pair, and each consumer warp
//            frees a slot in both CTAs' empty barriers (lane 0, remote mbarrier arrives); a
//            cluster barrier after the barriers' init and the two at the end keep the pair
//            alive while the other still writes to it. Measured slower on the H200
//            (2026-12-01, the kernel before the spread reduction and MPAIR,
//            fused/small-m-multicast.json): 0.95-0.99 of MCAST = 1's speed
//            where the grid is the same (no split), 0.67-0.95 with split-K, whose 2S-CTA
//            clusters are fewer co-resident (at 256 x 8192^2 S falls from 2 to 1: 64 CTAs).
//            The pair runs in lock step (a slot is refilled only when both have read it),
//            which costs more than A's L2 traffic saves (`perfscope diff` of the two reports:
//            barrier stalls 38% of the pair's stall time against 1%).
//            Ramp and tail: a 15-40 us kernel pays for the time before its first load and
//            after its last tile (per-CTA %globaltimer probes on the H200, 2026-12-02: the
//            first load left 0.5 us after the CTA started, the epilogue took 0.5-1 us after
//            the last tile). So without a pair thread 0 issues the first ring of loads as
//            soon as the barriers exist, before the block barrier and the zeroing of A's
//            padding rows (other bytes of the slots); the owners' consumers load their bias
//            pairs into registers before the stream, so the epilogue does not wait for them
//            behind the stream's DRAM queue; the exit waits only for the TMA store's reads
//            of the staging (wait_group.read). Measured against the previous kernel in one
//            process (bf16, 8 shapes, M 16-256): 0.937-0.983 of its time, median 0.966, C
//            bit-identical; the time after the last tile fell from 1.0 to 0.5 us at
//            16 x 8192^2.
//   seed     000 §7.1 (fused epilogue, small-shape inference)
//
// hgemm_small_m_packed
//   template <typename T, ...hgemm_small_m's..., int PACKED = 1>: hgemm_small_m's kernel
//   ABI      hgemm_small_m's, with tmap_b over B packed into 64-column strips
//            (kernels/weights.py: strip t = B's columns 64t..64t+63 for all K rows, K
//            zero-padded to whole k tiles and N to whole strips, one strip after another;
//            the map is a matrix of 64 columns and ceil(N/64) * KT * 64 rows)
//   parent   hgemm_small_m
//   how      Only B's TMA coordinates change: atom j of k tile kt is the box at row
//            (n0 / 64 + j) * KT * 64 + kt * 64, column 0, instead of (n0 + 64 j, kt * 64)
//            of the row-major matrix. The box holds the same 64 x 64 elements with the
//            same 128B swizzle, so shared memory, the wgmmas and C are bit for bit
//            hgemm_small_m's; what changes is the memory a box reads: 8 KB in one piece
//            where the row-major box is 64 pieces of 128 bytes, 2N bytes apart, each CTA's
//            64 columns interleaved in every DRAM page with its neighbours'. A decode GEMM
//            is a stream of the weight, and its weight does not change between calls, so an
//            inference engine can pack it once when it loads the model: here
//            Prepared.weight, once per weight, before any launch is timed.
//            Why (H200, bf16, per-CTA %globaltimer probes in alternating rounds,
//            2026-12-04, reports/reference/h200/probes/): at 16 x 8192^2 hgemm_small_m's
//            stream phase took 30.7 us per CTA where fused_check's bulk read of the same
//            128 MiB in 16 KB pieces took 29.4 for the whole CTA, and the kernel with its
//            wgmmas removed ran in the same time (1.003x), so the loss was the stream's, not
//            the math's. Reading each k tile's B as one 8 KB piece (a cp.async.bulk probe of
//            the same bytes, unswizzled) took the stream phase to 29.2 us and the kernel
//            1.03-1.06x faster at 16 x 8192^2, 16 x 14336 x 4096 and 16 x 4096 x 14336
//            (1.008x at 64 x 8192^2). This stage, which reads real strips through a tensor
//            map, measured 1.002-1.042x hgemm_small_m at M <= 64 on the H200 (2026-12-05,
//            head to head at the host's tile: 1.010 at bf16 16 x 8192^2, 1.036-1.042 at
//            16 x 4096 x 14336), 0.99-1.00 at M = 256: less than the probe.
//   seed     000 §7.1 (small-shape inference: the weight stream)
//
// hgemm_small_m_streamk
//   template <typename T, int BM = 64, int BN = 64, int BK = 64, int STAGES = 8,
//             int ACT = 1, int RESIDUAL = 0, int AROWS = BM>
//   ABI      hgemm_small_m's
//   threads  256: warpgroup 0 produces (thread 0 issues TMA), warpgroup 1 consumes
//   grid     dim3(G): one CTA per SM, at most hopper.cuh's SK_MAX_CTAS (fewer where the
//            shape has under 4 units per CTA); all G co-resident, since a CTA may wait for
//            an earlier one's partial
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + BN / 64 * 8192 + 1024 bytes (the ring
//            and its own C staging: a tile may be stored while the ring streams the next);
//            static 2 * STAGES mbarriers; hopper.cuh's stream-K workspace (module data)
//   parent   hgemm_small_m
//   how      The work is U = tiles x KT units (one k tile of one 64 x BN output tile),
//            tile-major, and CTA c takes units [U c / G, U (c + 1) / G): every SM streams
//            the same number of B tiles (within one), whatever the tile count. hgemm_small_m
//            gives each tile (or each of its S cluster splits) one CTA, so N = 14336 (112
//            tiles of 128 columns) left 20 of 132 SMs idle, and N = 8192 (128 tiles of 64)
//            or N = 4096 (64 tiles, S = 2) left 4, with the split's reduction between two
//            cluster barriers after the stream (1.3-1.5 us). A range is a run of pieces:
//            maybe the end [a, KT) of its first tile, whole tiles, maybe the start [0, b) of
//            its last. They run in the order start, whole tiles, end: with the host's tile
//            width (hgemm_small_m's: tiles no more than the SMs) a range spans at most KT
//            units, b <= a, and its k tiles run in ascending order, so the whole grid reads
//            the same rows of B at about the same time, as hgemm_small_m's one CTA per tile
//            does. The piece with the tile's last k tile finishes it; it runs last in its
//            CTA, while the tile's other pieces, in earlier CTAs, run first in theirs (or are
//            their CTA's only piece) and push their fp32 partial early through hopper.cuh's
//            stream-K workspace (StreamK::write: at most one per CTA, so the slot is the
//            CTA's; the flag raised after a fence); the finisher adds them in CTA order
//            (StreamK::add_partial: a fixed sum, each flag cleared for the next launch) and
//            runs the epilogue: bias held since the piece began, activation, residual, TMA
//            store from its own staging. A global workspace rather than hgemm_small_m's
//            distributed shared memory: the cuts fall anywhere, so no cluster groups a
//            tile's pieces. Each piece's first wgmma overwrites the accumulators (scale-d
//            0): zeroed in registers between pieces, they made ptxas serialize the wgmmas
//            (C7515). The producer works out a tile's corner once per piece: with an integer
//            division per k tile in its loop (the one thread that issues every refill), the
//            stage took 1.18x hgemm_small_m's time at 16 x 8192^2 with a CTA per tile, the
//            same work; 1.03x without (which of the loop's latencies set the pace was not
//            measured). M <= 64 on the host: the kernel takes more tile rows, each streaming
//            B again (0.3-0.5 of hgemm_small_m's speed at M = 256).
//   measured H200, 2026-12-04 (fused/streamk-check.json.xz, fused/README.md): a declared
//            variant, 0.87-0.92 of hgemm_small_m's speed at the M <= 64 shapes with N or K
//            of 8192 or 14336, 0.82-0.84 at N = K = 4096; with one CTA per tile 0.97-1.01
//            (fused/streamk-grid-probe.json). The cut costs more than the idle SMs give
//            back: DRAM at 70% of peak against 80% (ncu, 16 x 8192^2, the same bytes).
//            Run in range order (each CTA from its own k tile a, the grid out of phase) a
//            first build measured 0.67 at 16 x 14336 x 4096 and 0.84 at 16 x 8192^2.
//   seed     000 §7.1 (small-shape inference); stream-K as in hopper.cuh's STREAMK option
//
// hgemm_fused_quant
//   template <typename T, int BM = 128, int BN = 256, int BK = 64, int STAGES = 4,
//             int GROUP = 8, int ACT = 1, int RESIDUAL = 0, int QUANT = 1>
//   ABI      hopper.cu's tensor-map ABI with four pointers appended and C one byte wide,
//            (tmap_a, tmap_b, tmap_c, unsigned char* C, int M, int N, int K, const T* bias,
//             const T* residual, const float* scale, float* amax); tmap_c (a uint8 map of
//            C) is passed for the common ABI and not used; N % 16 == 0 (C's rows 16-byte
//            aligned)
//   threads  384, as hgemm_fused_bias_act; grid the same persistent grid
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 1024 bytes (no C staging, so a fourth
//            ring slot fits); static 2 * STAGES mbarriers
//   parent   hgemm_fused_bias_act
//   how      The same bias / activation / residual on the fp32 accumulators (the bias
//            held in registers from halfway through the k loop for int8), then
//            QUANT = 1: fp8 e4m3 with one per-tensor scale (*scale, read on the device so a
//            previous step's amax can set it without a host round trip), and amax =
//            max |x| over the outputs before scaling, reduced per warp (redux) and max-ed
//            into *amax with one atomic per warp and tile, for the next step's scale;
//            QUANT = 2: int8 with one scale per row (scale[m]). activation.cuh's quant::two
//            does the rounding (one fp32 multiply, then cvt: e4m3 satfinite, or s32 clamped
//            to int8). C is written from registers in 8-byte words: two shuffles within
//            each quad give each lane eight consecutive columns, a warp one 32-byte sector
//            of each of its 8 rows per store.
//   seed     000 §7.1 (fused epilogue: quantisation with a scale)
//
// hgemm_fused_pingpong
//   template <typename T, int BM = 64, int BN = 256, int BK = 64, int STAGES = 4,
//             int GROUP = 16, int ACT = 1, int RESIDUAL = 0, int BOXES = 2>
//   threads  384, 1-D: warpgroup 0 produces (one thread issues TMA), 1 and 2 consume, each
//            owning whole BM x BN tiles (BM 64 or 128: one or two m64 fragments): the CTA's
//            tiles blockIdx.x + j * gridDim.x (grouped order) go to consumer j % 2
//   grid     dim3(min(tiles, multiprocessors)), persistent, tiles of BM x BN
//   smem     dynamic STAGES * (BM*BK + BK*BN) * 2 + 2 * BOXES * 64 * 64 * 2 + 1024 bytes;
//            static 2 * STAGES mbarriers and one order mbarrier per consumer
//   parent   hgemm_fused_bias_act
//   how      In the cooperative parent both consumers work on one tile, so the tensor pipe
//            waits for every tile's bias + activation + store (PS124: 0.061 of its time on
//            the H200 at 4096^3). Here consumer c starts tile j's k loop once the other has
//            issued its last wgmma of tile j - 1 (its order mbarrier, one phase per tile),
//            so the k loops run one after the other and each consumer's epilogue runs
//            under the other's wgmmas. The ring is filled in the CTA's tile order and each
//            slot is read by one consumer (its "empty" mbarrier counts that consumer's 128
//            threads); the order keeps every consumer within one fill of the slot it waits
//            on, so the parity waits stay unambiguous. The epilogue is the parent's
//            (fused::apply_epilogue), then hopper.cuh's swizzled staging in BOXES boxes of
//            64 x 64 per consumer and TMA stores. Cost: a 64-row tile moves 1.67x the A + B
//            bytes per FLOP of a 128 x 256 one from L2 (40 against 48 KB per k tile for half
//            the FLOPs); wgmma's shared-memory reads per FLOP are the same (one m64n256k16
//            per k16 step either way).
//   measured H200, 2026-12-01 (fused/fused_check.json.xz, bench-fused.json): slower than
//            the parent at every M = 4096 shape, 0.91-1.00 of cublas+gelu against the
//            parent's 1.00-1.05 (bf16 4096^3: 0.205 against 0.190 ms); as a plain GEMM
//            (ACT 0, no bias) 0.88-0.98 of cuBLAS where the cooperative kernel is 0.99-1.05.
//            PS124 predicted a saving of 0.061; measured -0.09. ncu (fused/
//            hgemm_fused_pingpong-*): the epilogue hides, but the consumers wait at the full
//            barrier (the hottest samples, at the k loop's mbarrier wait), L2 throughput
//            56% against 42%, tensor pipe 84.9% of the active cycles against 90.1%: a 64-row
//            tile's operands (1.67x the bytes per FLOP) do not arrive fast enough for one
//            warpgroup's wgmmas alone. The bytes are not the whole story: BM = BN = 128
//            (two m64n128 fragments per consumer, 1.33x the bytes per FLOP, STAGES 5) is
//            no faster (fused/bench-pingpong.json, bf16 against cublas+gelu: 0.976 and 0.931
//            at 4096^3 and 4096 x 8192^2, against 0.950 / 0.918 for 64 x 256 and 1.037 / 1.021
//            for the parent). Only one warpgroup issues wgmmas at a time, so every wait it
//            makes (a full barrier at the switch of tiles, wgmma_wait) idles the tensor
//            pipe, where the cooperative kernel's second warpgroup fills it. Kept as a
//            declared variant; `perfscope diff` of the two names the consumers' tiles.
//   seed     000 §7.1 (fused epilogue), §4 (warp specialisation)
//
// hgemm_small_m: why these numbers (H200: ~4.8 TB/s HBM3e, 132 SMs, ~600 ns idle DRAM
// latency, nearer 1 us under full load).
//   Bytes in flight. Little's law: 4.8 TB/s x ~1 us = ~4.8 MB must be in flight across the
//   chip, ~37 KB per SM when 128 SMs stream (N = 8192: 128 tiles of 64 columns). One k tile
//   of B is BK x BN x 2 = 8 KB at BN = 64 (16 KB at 128); at BM = 64 the host takes 8
//   stages (6): 64 KB (96 KB) of B in flight per SM, 1.7x (2.6x) the need, so the stream
//   keeps DRAM busy even where only 112 CTAs run (N = 14336, BN = 128, no split) or latency
//   runs above 1 us. The 192 KB ring's 12 stages (8) measured 0.7-4.5% slower (up to 2% at
//   BN = 128) on the H200: bytes queued beyond what DRAM drains only lengthen the queue.
//   At BM = 256 (4 stages, 64 KB of
//   B) the problem is compute-bound already (2 x 256 x 8192^2 FLOP ~ 35 us at the tensor
//   peak against ~28 us to stream 128 MiB).
//   Split count. S is chosen on the host as the largest S <= 8 (portable cluster size),
//   S <= KT / 4 (at least 4 k tiles per CTA to fill the ring) and tiles * S <= the
//   multiprocessors, for which all tiles' clusters are co-resident (the driver's
//   cuOccupancyMaxActiveClusters): one wave in which every CTA streams the same number of
//   bytes. No tail, no second wave.
//   Reduction. Distributed shared memory rather than a global fp32 workspace: the partials
//   (BM x BN x 4 bytes per CTA, 32 KB at BM = 64) never touch L2 or DRAM, nothing needs
//   zeroing before a launch, there is no counter to reset (a "last CTA reduces" counter left
//   non-zero by an aborted launch corrupts the next one), no second kernel and its launch
//   gap, and the sum is deterministic (always rank 0 + 1 + ... + S-1, whichever CTA
//   finishes first). Its cost: the cluster must be co-resident, which the host checks.
//   MMA waste. M = 16 padded to m64 does 4x the needed MMA work; at N = K = 8192 that is
//   ~9 us of tensor time per SM against ~28 us of streaming, fully overlapped by the ring.
//   (Swapping A and B so that M becomes wgmma's N dimension, n16, would remove the waste;
//   it needs an M-major A operand layout that no stage here uses yet.)
//
// Written for perfscope from the PTX ISA (wgmma, cp.async.bulk, mbarrier, barrier.cluster,
// mapa, ld.shared::cluster, tanh.approx); no code is taken from the seed articles, CUTLASS
// or other libraries.

#include "hopper.cuh"
#include "activation.cuh"

namespace hop {

// hopper.cuh's Wgmma in the n64 shape, for hgemm_small_m's narrow tiles (one 64-column B
// atom per k tile). Here rather than in hopper.cuh, which the committed Hopper reports were
// compiled with.
#define PS_WGMMA_SS_N64(CXX_T, PTX_T) \
template <> struct Wgmma<CXX_T, 64> { \
    static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long da, \
                                               unsigned long long db, int scale_d) { \
        asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_T "." PTX_T " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
        "}, %32, %33, p, 1, 1, 0, 1;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "l"(da), "l"(db), "r"(scale_d) : "memory"); \
    } \
};

PS_WGMMA_SS_N64(__half, "f16")
PS_WGMMA_SS_N64(__nv_bfloat16, "bf16")
#undef PS_WGMMA_SS_N64

}  // namespace hop

namespace fused {

using tma::smem_u32;

using act::ACT_GELU;
using act::ACT_NONE;
using act::ACT_SILU;
using act::activate;

// Two consecutive T (4 bytes, element n at the low half) -> two floats, exactly.
template <typename T> struct Pair;
template <> struct Pair<__half> {
    static __device__ __forceinline__ float2 unpack(unsigned u) {
        return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(u & 0xFFFFu))),
                           __half2float(__ushort_as_half(static_cast<unsigned short>(u >> 16))));
    }
};
template <> struct Pair<__nv_bfloat16> {
    static __device__ __forceinline__ float2 unpack(unsigned u) {
        return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
    }
};

__device__ __forceinline__ unsigned load_pair(const void* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// ----------------------------------------------------------------------- epilogue
// The bias pairs a consumer thread's 64 x N fragment (columns col0..) adds: pair j is
// bias[col0 + 8j + 2(l%4)] and the next, packed (0 past Ncols or without a bias).
template <typename T, int N>
__device__ __forceinline__ void load_bias_pairs(unsigned (&b)[N / 8], const T* bias, int col0,
                                                int Ncols) {
    const int l = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const int col = col0 + 8 * j + 2 * (l % 4);
        b[j] = (bias != nullptr && col < Ncols) ? load_pair(bias + col) : 0u;
    }
}

// One warpgroup's 64 x N accumulator fragment for C rows row0.., columns col0..:
// d = act(d + bias[n]) (+ residual[m][n]), in fp32; bias_pair(j) gives the two floats of
// load_bias_pairs' pair j (read where it is used, or held since). Elements outside M x Ncols
// read nothing (their values are clipped by the TMA store). With RESIDUAL, every residual
// pair the thread needs is loaded before the first is used, so the loads are in flight
// together.
template <typename T, int ACT, int RESIDUAL, int N, typename BiasPair>
__device__ __forceinline__ void apply_epilogue_with(float (&d)[N / 2], BiasPair&& bias_pair,
                                                    const T* residual, int row0, int col0, int M,
                                                    int Ncols) {
    static_assert(ACT == ACT_NONE || ACT == ACT_GELU || ACT == ACT_SILU, "ACT is 0, 1 or 2");
    static_assert(RESIDUAL == 0 || RESIDUAL == 1, "RESIDUAL is 0 or 1");
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    const int r = row0 + 16 * w + l / 4;
    unsigned res[RESIDUAL ? N / 4 : 1];
    if constexpr (RESIDUAL) {
        const bool lo = r < M, hi = r + 8 < M;
        const long long base = static_cast<long long>(r) * Ncols;
#pragma unroll
        for (int j = 0; j < N / 8; ++j) {
            const int col = col0 + 8 * j + 2 * (l % 4);
            res[2 * j] = (lo && col < Ncols) ? load_pair(residual + base + col) : 0u;
            res[2 * j + 1] = (hi && col < Ncols) ? load_pair(residual + base + 8LL * Ncols + col) : 0u;
        }
    }
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        const float2 b = bias_pair(j);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float x = activate<ACT>(d[4 * j + q] + (q % 2 ? b.y : b.x));
            if constexpr (RESIDUAL) {
                const float2 rr = Pair<T>::unpack(res[2 * j + q / 2]);
                x += q % 2 ? rr.y : rr.x;
            }
            d[4 * j + q] = x;
        }
    }
}

// The epilogue with each bias pair read where it is used (from L2, where the stages
// prefetch it).
template <typename T, int ACT, int RESIDUAL, int N>
__device__ __forceinline__ void apply_epilogue(float (&d)[N / 2], const T* bias, const T* residual,
                                               int row0, int col0, int M, int Ncols) {
    const int l = threadIdx.x % 32;
    const bool has_bias = bias != nullptr;
    apply_epilogue_with<T, ACT, RESIDUAL, N>(d, [&](int j) {
        const int col = col0 + 8 * j + 2 * (l % 4);
        return (has_bias && col < Ncols) ? Pair<T>::unpack(load_pair(bias + col))
                                         : make_float2(0.f, 0.f);
    }, residual, row0, col0, M, Ncols);
}

// Asks L2 to fetch `bytes` (a multiple of 16) from `p` (16-byte aligned); no completion.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n"
                 :: "l"(reinterpret_cast<unsigned long long>(p)), "r"(bytes) : "memory");
}

// The lanes of one warp prefetch rows [row0, row_end) x columns [col0, col_end) of a
// row-major matrix with Ncols columns into L2, one bulk prefetch per row.
template <typename T>
__device__ __forceinline__ void prefetch_rows_l2(const T* base, int row0, int row_end, int col0,
                                                 int col_end, int Ncols, int lane) {
    if (col_end <= col0) return;
    const unsigned bytes = static_cast<unsigned>(col_end - col0) * 2u;
    for (int r = row0 + lane; r < row_end; r += 32)
        prefetch_l2(base + static_cast<long long>(r) * Ncols + col0, bytes);
}

// A persistent consumer's bias pairs for its current tile (load_bias_pairs' layout), loaded
// into registers at one k tile of the tile's loop (the policies' kt_prefetch, halfway) so
// that their latency passes under the wgmmas. Read where they are used, between two tiles
// with the tensor pipe idle, the loads cost 2.2% of a 4096^3 bias-only run against the
// plain stage on the H200, where adding a constant instead cost 0.5% (fused/README.md).
// HOLD = false (the residual epilogues, whose 64 residual pairs a thread loads at once
// leave no room for 32 more registers: ptxas spills) reads them where they are used.
template <typename T, int BN, bool HOLD>
struct HeldBias {
    mutable unsigned pairs[HOLD ? BN / 8 : 1];
    __device__ __forceinline__ void load(int kt, int kt_load, const T* bias, int n0, int N) const {
        if constexpr (HOLD) {
            if (kt == kt_load) load_bias_pairs<T, BN>(pairs, bias, n0, N);
        }
    }
    __device__ __forceinline__ float2 operator()(int j) const { return Pair<T>::unpack(pairs[j]); }
};

// The epilogue of a persistent policy: with the bias held (HeldBias), or read where used.
template <typename T, int ACT, int RESIDUAL, int N, bool HOLD>
__device__ __forceinline__ void apply_epilogue_held(float (&d)[N / 2], const HeldBias<T, N, HOLD>& held,
                                                    const T* bias, const T* residual, int row0,
                                                    int col0, int M, int Ncols) {
    if constexpr (HOLD)
        apply_epilogue_with<T, ACT, RESIDUAL, N>(d, held, residual, row0, col0, M, Ncols);
    else
        apply_epilogue<T, ACT, RESIDUAL, N>(d, bias, residual, row0, col0, M, Ncols);
}

// hgemm_fused_bias_act's epilogue policy for hop::persistent_gemm (the interface is
// described in hopper.cuh): at k tile kt_prefetch of each tile each consumer thread loads
// its bias pairs into registers (HeldBias) or, with RESIDUAL, warp 0 of each consumer
// sends that consumer's residual rows to L2 while the k loop still runs; then bias +
// activation (+ residual) on the fp32 accumulators, and the persistent stage's TMA store
// through BOXES staging boxes (the whole tile at BOXES >= BN/64). DEFER = 1 (the parent's
// deferred store): pack applies the epilogue and rounds the tile into 64 words, which
// persistent_gemm sends a box per k tile of the next unit, under its wgmmas.
template <typename T, int BN, int ACT, int RESIDUAL, int MAX_BOXES = BN / 64, int DEFER = 0>
struct BiasActEpilogue {
    static constexpr int BOXES = MAX_BOXES < BN / 64 ? MAX_BOXES : BN / 64;
    static constexpr unsigned STAGING_BYTES = BOXES * 64 * 64 * 2;
    static constexpr bool DEFERRED = DEFER != 0;
    struct Args {
        const T* bias;
        const T* residual;
    };
    const T* bias;
    const T* residual;
    int lane;
    bool prefetcher;   // warp 0 of this consumer
    HeldBias<T, BN, !RESIDUAL> held;

    __device__ __forceinline__ BiasActEpilogue(const Args& args, int tid)
        : bias(args.bias), residual(args.residual), lane(tid % 32),
          prefetcher((tid % 128) / 32 == 0) {}

    __device__ __forceinline__ void after_k_tile(int kt, int kt_prefetch, int row0, int n0, int M,
                                                 int N) const {
        if constexpr (!DEFER) held.load(kt, kt_prefetch, bias, n0, N);
        if constexpr (RESIDUAL) {
            if (prefetcher && kt == kt_prefetch)
                prefetch_rows_l2(residual, row0, min(row0 + 64, M), n0, min(n0 + BN, N), N, lane);
            __syncwarp();
        }
    }
    // DEFER: the k loop may still send the last tile's words, so 32 held bias registers
    // there would spill (ptxas: 44-172 spill stores at BN 256); they are loaded here, once
    // the words are sent, under the last k tile's wgmmas.
    __device__ __forceinline__ void before_last_wait(int, int n0, int, int N) const {
        if constexpr (DEFER) held.load(0, 0, bias, n0, N);
    }
    __device__ __forceinline__ void store(float (&acc)[BN / 2], unsigned staging,
                                          const TensorMap2D* tmap_c, int row0, int n0, int M, int N,
                                          unsigned bar_id) const {
        apply_epilogue_held<T, ACT, RESIDUAL, BN>(acc, held, bias, residual, row0, n0, M, N);
        hop::store_tile_staged<T, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);
    }
    // DEFER: the epilogue in fp32, then C rounded to pairs.
    __device__ __forceinline__ void pack(float (&acc)[BN / 2], unsigned (&words)[BN / 4], int row0,
                                         int n0, int M, int N) const {
        apply_epilogue_held<T, ACT, RESIDUAL, BN>(acc, held, bias, residual, row0, n0, M, N);
        hop::pack_tile<T, BN>(acc, words);
    }
    __device__ __forceinline__ void store_box(const unsigned (&words)[BN / 4], int box,
                                              unsigned staging, const TensorMap2D* tmap_c,
                                              int row0, int n0, unsigned bar_id) const {
        hop::store_words_box<BN, BOXES>(words, box, staging, tmap_c, row0, n0, bar_id);
    }
};

// hgemm_fused_quant's epilogue policy: bias + activation (+ residual) as BiasActEpilogue,
// then y = x * scale quantised to one byte (quant::two) and stored from registers, and
// amax = max |x| over the valid outputs (before the scale) max-ed into *amax. No C staging:
// C is a quarter of the bf16 tile's bytes, so each thread writes 8-byte words directly
// (two shuffles within each quad, so a warp's store covers one 32-byte sector of each of
// 8 rows).
template <typename T, int BN, int ACT, int RESIDUAL, int QUANT>
struct QuantEpilogue {
    static constexpr unsigned STAGING_BYTES = 0;
    static_assert(BN % 32 == 0, "groups of four 8-column blocks");
    struct Args {
        const T* bias;
        const T* residual;
        unsigned char* C;
        const float* scale;   // QUANT 1: one float; QUANT 2: M floats, one per row
        float* amax;          // nullptr: not computed; else max-ed into (the caller zeroes it)
    };
    Args a;
    float tensor_scale;
    // The bias is held (HeldBias) for int8 only: with fp8 outputs holding it, ptxas
    // serializes the wgmma pipeline (C7515: non-wgmma instructions defining accumulator
    // registers inside the pipeline stage; PS144 of `perfscope sass`), and the stage measured
    // 0.86-0.95 of cublas+gelu+fp8 at M = 4096 against 0.98-1.03 reading it where used
    // (fused/bench-fused-fp8-held.json against bench-fused.json, 2026-12-02).
    HeldBias<T, BN, !RESIDUAL && QUANT == quant::QUANT_INT8> held;

    __device__ __forceinline__ QuantEpilogue(const Args& args, int)
        : a(args), tensor_scale(QUANT == quant::QUANT_FP8 ? *args.scale : 0.f) {}

    __device__ __forceinline__ void after_k_tile(int kt, int kt_prefetch, int, int n0, int,
                                                 int N) const {
        held.load(kt, kt_prefetch, a.bias, n0, N);
    }
    __device__ __forceinline__ void before_last_wait(int, int, int, int) const {}

    __device__ __forceinline__ void store(float (&acc)[BN / 2], unsigned, const TensorMap2D*,
                                          int row0, int n0, int M, int N, unsigned) const {
        apply_epilogue_held<T, ACT, RESIDUAL, BN>(acc, held, a.bias, a.residual, row0, n0, M, N);
        const int t = threadIdx.x % 128, w = t / 32, l = t % 32, p = l % 4;
        const int r = row0 + 16 * w + l / 4;
        const bool odd = p % 2;
        float s[2] = {tensor_scale, tensor_scale};
        if constexpr (QUANT == quant::QUANT_INT8) {
            s[0] = r < M ? a.scale[r] : 0.f;
            s[1] = r + 8 < M ? a.scale[r + 8] : 0.f;
        }
        unsigned big = 0;
        // One 4-byte word per 8-column block pair (j, j + 1): even lanes keep block j, odd
        // lanes block j + 1, each with its partner's byte pair; then lanes 0-1 of the quad
        // join pair (j0, j0 + 1)'s words into 8 bytes and lanes 2-3 pair (j0 + 2, j0 + 3)'s,
        // so a warp's store writes 32 contiguous bytes (one sector) of each of 8 rows.
        const auto pair_word = [&](int j, int h) {
            const float* x0 = &acc[4 * j + 2 * h];
            const float* x1 = &acc[4 * (j + 1) + 2 * h];
            const unsigned v0 = quant::two<QUANT>(x0[0] * s[h], x0[1] * s[h]);
            const unsigned v1 = quant::two<QUANT>(x1[0] * s[h], x1[1] * s[h]);
            const unsigned got = __shfl_xor_sync(0xFFFFFFFFu, odd ? v0 : v1, 1);
            return odd ? (got | (v1 << 16)) : (v0 | (got << 16));
        };
        const bool upper = p >= 2;
#pragma unroll
        for (int j0 = 0; j0 < BN / 8; j0 += 4) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {   // rows r and r + 8
                const int row = r + 8 * h;
                const unsigned wa = pair_word(j0, h), wb = pair_word(j0 + 2, h);
                const unsigned got = __shfl_xor_sync(0xFFFFFFFFu, upper ? wa : wb, 2);
                const uint2 bytes = upper ? make_uint2(got, wb) : make_uint2(wa, got);
                const int col = n0 + 8 * (j0 + 2 * upper + odd);
                if (row < M && col < N)
                    *reinterpret_cast<uint2*>(a.C + static_cast<long long>(row) * N + col) = bytes;
                if (a.amax != nullptr && row < M) {
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj) {
                        const float* x = &acc[4 * (j0 + jj) + 2 * h];
                        if (n0 + 8 * (j0 + jj) + 2 * p < N)
                            big = max(big, max(quant::abs_bits(x[0]), quant::abs_bits(x[1])));
                    }
                }
            }
        }
        if (a.amax != nullptr) {
            big = __reduce_max_sync(0xFFFFFFFFu, big);
            if (l == 0 && big != 0) atomicMax(reinterpret_cast<unsigned*>(a.amax), big);
        }
    }
};

// ------------------------------------------------------------------------ cluster
__device__ __forceinline__ unsigned cluster_size() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
    return n;
}
// Every thread of the cluster, in any warp state (not .aligned): shared-memory writes
// before it are visible to every CTA of the cluster after it.
__device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;\n" ::: "memory");
}
// The two halves of cluster_barrier, for a phase begun early and ended late. The arrive is
// relaxed: what it orders is only barrier initialisation, which fence.mbarrier_init
// releases (mbar_init_fence) before it.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
// A whole phase for lifetime only (no CTA leaves while a peer may still write to it): the
// data it would order travels by st.async, whose mbarrier completion orders it.
__device__ __forceinline__ void cluster_barrier_relaxed() {
    cluster_arrive_relaxed();
    cluster_wait();
}
// This CTA's shared address `addr` as seen in CTA `rank` of the cluster.
__device__ __forceinline__ unsigned peer_addr(unsigned addr, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    return remote;
}
// 16 bytes into a peer's shared memory (cluster address `remote`), counted as complete_tx
// bytes on the peer's mbarrier `remote_bar`: the peer waits on its own barrier, no barrier
// across the cluster.
__device__ __forceinline__ void st_async_v4(unsigned remote, float a, float b, float c, float d,
                                            unsigned remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], "
                 "{%1, %2, %3, %4}, [%5];\n"
                 :: "r"(remote), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4(unsigned addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void st_shared_v4(unsigned addr, float a, float b, float c, float d) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// 16 bytes at this CTA's shared address `addr`, as seen in CTA `rank` of the cluster.
__device__ __forceinline__ float4 ld_peer_v4(unsigned addr, unsigned rank) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(peer_addr(addr, rank))
                 : "memory");
    return v;
}
// Another split's 16-byte chunk j of a consumer thread's fragment, added into its own.
template <int N>
__device__ __forceinline__ void add_chunk(float (&acc)[N], int j, float4 v) {
    acc[4 * j] += v.x;
    acc[4 * j + 1] += v.y;
    acc[4 * j + 2] += v.z;
    acc[4 * j + 3] += v.w;
}

// One consumer warpgroup's 64 x 64 box (accumulator fragment of m64n64) -> the swizzled
// staging box at `staging` (8 KB, used by nothing else) -> TMA store of C rows row0..,
// columns col0... hop::store_tile_tma's layout for one box, without its wait for an
// earlier store's read: each box of hgemm_small_m's tile has staging of its own.
template <typename T>
__device__ __forceinline__ void store_box_tma(const float (&acc)[32], unsigned staging,
                                              const TensorMap2D* tmap_c, int row0, int col0,
                                              unsigned bar_id) {
    const int t = threadIdx.x % 128, w = t / 32, l = t % 32;
    const int r = 16 * w + l / 4;
    const unsigned base = staging + (l % 4) * 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const unsigned chunk = ((j ^ (r % 8)) * 16);
        const unsigned lo = tma::Pack<T>::two(acc[4 * j], acc[4 * j + 1]);
        const unsigned hi = tma::Pack<T>::two(acc[4 * j + 2], acc[4 * j + 3]);
        asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(base + r * 128 + chunk), "r"(lo) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(base + (r + 8) * 128 + chunk), "r"(hi)
                     : "memory");
    }
    tma::fence_proxy_async();   // st.shared before the TMA unit reads the box
    hop::named_sync(bar_id, 128);
    if (t == 0) {
        tma::store_2d(tmap_c, staging, col0, row0);
        tma::store_commit();
    }
}

}  // namespace fused

// ====================================================================== fused stage 1
// hgemm_tma_wgmma_persistent's body (hop::persistent_gemm, hopper.cuh) with the
// bias / activation / residual epilogue in place of the plain TMA store.
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int ACT, int RESIDUAL,
          int BOXES = BN / 64, int STREAMK = 0, int DEFER = 0>
__global__ void __launch_bounds__(384, 1)
hgemm_fused_bias_act(const __grid_constant__ TensorMap2D tmap_a,
                     const __grid_constant__ TensorMap2D tmap_b,
                     const __grid_constant__ TensorMap2D tmap_c, T* C, int M, int N, int K,
                     const T* bias, const T* residual) {
    using Epilogue = fused::BiasActEpilogue<T, BN, ACT, RESIDUAL, BOXES, DEFER>;
    hop::persistent_gemm<T, BM, BN, BK, STAGES, GROUP, Epilogue, STREAMK>(
        &tmap_a, &tmap_b, &tmap_c, M, N, K, {bias, residual});
}

// ====================================================================== fused stage 2
template <typename T, int BM, int BN, int BK, int STAGES, int ACT, int RESIDUAL, int AROWS,
          int MCAST, int MPAIR, int GSPLIT, int PACKED = 0>
__global__ void __launch_bounds__(BM == 64 ? 256 : 384, 1)
hgemm_small_m(const __grid_constant__ TensorMap2D tmap_a, const __grid_constant__ TensorMap2D tmap_b,
              const __grid_constant__ TensorMap2D tmap_c, T* C, int M, int N, int K,
              const T* bias, const T* residual) {
    using namespace hop;
    constexpr int CONS = BM == 64 ? 1 : 2;           // consumer warpgroups
    constexpr int MI = BM / 64 / CONS;               // m64 fragments per consumer
    constexpr int CONSUMER_THREADS = 128 * CONS;
    constexpr unsigned CONSUMERS_BAR = 3;            // 1 and 2 are store_tile_tma's
    using S = Slot<BM, BN, BK>;
    static_assert(BM == 64 || BM == 128 || BM == 256, "a tile row of 64, 128 or 256 rows");
    static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma m64nBNk16 with BN 64, 128 or 256");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");
    static_assert(STAGES * S::BYTES >= BM * BN * 4,
                  "after the k loop the ring holds the fp32 partial tile");
    static_assert(AROWS == BM || (BM == 64 && (AROWS == 16 || AROWS == 32)),
                  "A's TMA box covers the tile row, or 16 / 32 of a 64-row one");
    static_assert(MCAST == 1 || MCAST == 2, "A from L2 once per CTA, or once per pair of N tiles");
    static_assert(MPAIR == 1 || MPAIR == 2, "B from L2 once per CTA, or once per pair of M tiles");
    static_assert(MCAST == 1 || MPAIR == 1, "a pair shares A (MCAST) or B (MPAIR), not both");
    static_assert(GSPLIT >= 1 && (GSPLIT == 1 || MI == 1),
                  "a grid split pushes one 64-row fragment per consumer (StreamK's slot)");
    static_assert(PACKED == 0 || PACKED == 1, "B row-major K x N, or in 64-column strips");
    constexpr unsigned PAIR = MCAST * MPAIR;         // CTAs sharing one operand's loads
    // In a pair a slot is refilled by both CTAs (the shared operand's boxes by one of them,
    // for both), so its "empty" barrier waits for lane 0 of every consumer warp of both.
    constexpr unsigned EMPTY_COUNT = PAIR == 1 ? CONSUMER_THREADS : 2 * CONSUMER_THREADS / 32;
    // A arrives in boxes of AROWS rows; the tile's other BM - AROWS rows stay zero.
    constexpr unsigned A_LOADED = AROWS * BK * 2;

    // PUSH: a 64 x 64 tile (one unit, owned by split 0) split in two over a cluster hands
    // its partial over by st.async into a region of split 0's shared memory past the ring,
    // counted on split 0's barrier `recv`, instead of through the ring and two cluster
    // barriers (benchmarks/small_m_probe.py: 1.28 us per CTA between the last k tile and the
    // epilogue that way at 16 x 4096 x 14336).
    constexpr bool PUSH = BM == 64 && BN == 64 && PAIR == 1 && GSPLIT == 1;
    constexpr unsigned PARTIAL_BYTES = CONSUMER_THREADS * (BN / 2) * 4;
    // PUSH adds two (one used): ptxas rounds the block's static shared memory to 16 bytes.
    __shared__ alignas(8) unsigned long long bars[2 * STAGES + (PUSH ? 2 : 0)];
    extern __shared__ unsigned char dyn_smem[];
    const unsigned ring = align1024(smem_u32(dyn_smem));
    const unsigned full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[STAGES]);
    const unsigned recv = smem_u32(&bars[PUSH ? 2 * STAGES : 0]);
    const unsigned partial_in = ring + STAGES * S::BYTES;   // PUSH: the peer's partial lands here
    const int tid = threadIdx.x, wg = tid / 128;
    // A cluster is PAIR x S consecutive CTAs along x: the S splits of one output tile, or of
    // two adjacent ones (MCAST: x = n tile * S + split; MPAIR: x = (n tile * 2 + m tile % 2)
    // * S + split, y = m tile / 2). Cluster rank = pair * S + split.
    const unsigned ctas = fused::cluster_size(), splits = ctas / PAIR;
    const unsigned cluster_rank = tma::cluster_rank();
    const unsigned rank = cluster_rank % splits, pair = cluster_rank / splits;
    const unsigned partner = (PAIR - 1 - pair) * splits + rank;   // same split, other tile
    const unsigned short both = static_cast<unsigned short>((1u << cluster_rank) | (1u << partner));
    const bool push = PUSH && splits == 2;
    const int n0 = (blockIdx.x / (splits * MPAIR)) * BN;
    const int m0 = (blockIdx.y * MPAIR + (MPAIR == 2 ? pair : 0u)) * BM;
    const int KT = (K + BK - 1) / BK;
    // k tiles [KT*p/P, KT*(p+1)/P) of part p = z * S + rank, P = S * GSPLIT: every part gets
    // floor or ceil of KT/P (KT*P < 2^31).
    const int parts = static_cast<int>(splits) * GSPLIT;
    const int part = static_cast<int>(rank) +
                     (GSPLIT > 1 ? static_cast<int>(blockIdx.z * splits) : 0);
    const int kt0 = KT * part / parts;
    const int nk = KT * (part + 1) / parts - kt0;
    // B's TMA coordinates of atom j (columns n0 + 64j) at k tile kt: (column, row) of the
    // row-major K x N matrix, or with PACKED of hgemm_small_m_packed's strips, a 64-column
    // matrix whose strip t (B's columns 64t..64t+63) is rows t*KT*BK.. (K zero-padded to
    // whole k tiles), so one box is 8 KB of contiguous memory and lands in shared memory
    // exactly as the row-major box does.
    const auto b_col = [&](int j) { return PACKED ? 0 : n0 + 64 * j; };
    const auto b_row = [&](int j, int kt) {
        return PACKED ? (n0 / 64 + j) * KT * BK + kt * BK : kt * BK;
    };
    // k tile i of this CTA's share into slot i % STAGES (thread 0 only). Slot s, round
    // r >= 1 waits for the consumers' (r-1)-th release of it.
    const auto issue = [&](int i) {
        const int s = i % STAGES;
        if (i >= STAGES) tma::mbar_wait(empty0 + 8 * s, ((i / STAGES) + 1) & 1);
        const unsigned slot = ring + s * S::BYTES, full = full0 + 8 * s;
        tma::mbar_expect_tx(full, A_LOADED + BK * BN * 2);
        if constexpr (MCAST == 1)
            tma::load_2d(slot, &tmap_a, full, (kt0 + i) * BK, m0);
        else if ((i & 1) == static_cast<int>(pair))   // the pair's CTAs take turns
            tma::load_2d_multicast(slot, &tmap_a, full, (kt0 + i) * BK, m0, both);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) {
            const unsigned atom = slot + S::A_BYTES + j * S::B_ATOM_BYTES;
            if constexpr (MPAIR == 1)
                tma::load_2d(atom, &tmap_b, full, b_col(j), b_row(j, kt0 + i));
            else if (((i + j) & 1) == static_cast<int>(pair))   // turns, atom by atom
                tma::load_2d_multicast(atom, &tmap_b, full, b_col(j), b_row(j, kt0 + i), both);
        }
    };
    // Without a pair the first ring's loads go out before the block's barrier (the A rows
    // zeroed below are not the rows TMA writes), as soon as the barriers exist.
    const int early = PAIR == 1 ? min(STAGES, nk) : 0;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full0 + 8 * s, 1);
            tma::mbar_init(empty0 + 8 * s, EMPTY_COUNT);
        }
        if (push) tma::mbar_init(recv, 1);
        tma::mbar_init_fence();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
        tma::prefetch_tmap(&tmap_c);
        for (int i = 0; i < early; ++i) issue(i);
        // Split 0 arms its barrier for the peer's partial now: the peer writes only after
        // the cluster phase begun below, so no byte can land before the count is armed.
        if (push && rank == 0) tma::mbar_expect_tx(recv, PARTIAL_BYTES);
    }
    if constexpr (AROWS < BM) {
        // Rows AROWS.. of every slot's A tile are zero once and for all: the wgmmas read
        // them (m64), no TMA ever writes them (so no zero fill of rows past M per k tile).
        constexpr int CHUNKS = (BM - AROWS) * 128 / 16;   // 16-byte chunks per slot
        for (int i = tid; i < STAGES * CHUNKS; i += blockDim.x)
            fused::st_shared_v4(ring + (i / CHUNKS) * S::BYTES + AROWS * 128 + (i % CHUNKS) * 16,
                                0.f, 0.f, 0.f, 0.f);
        tma::fence_proxy_async();   // the zeros before the async proxy (wgmma) reads them
    }
    __syncthreads();
    // The partner's multicasts land in this CTA's ring and complete on its barriers: both
    // CTAs' barriers are initialised before either issues one.
    if constexpr (PAIR == 2) fused::cluster_barrier();
    // PUSH: the phase that says split 0's `recv` exists, begun now and waited for only
    // after the k loop, long since complete by then.
    if (push) fused::cluster_arrive_relaxed();

    // setmaxnreg (a warp-aligned instruction) on both sides, at one consumer warpgroup too:
    // after it ptxas builds the k loop's wgmma descriptors in uniform registers, without it
    // (the 64-row tiles before) per thread, 4 R2UR and 5 more instructions per HGMMA.
    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0) {
            for (int i = early; i < nk; ++i) issue(i);
        } else if (RESIDUAL && tid / 32 == 1 && rank == 0 && (GSPLIT == 1 || blockIdx.z == 0)) {
            // The leader's epilogue reads this tile's residual rows: to L2 meanwhile (a grid
            // split's part z > 0 has no epilogue).
            fused::prefetch_rows_l2(residual, m0, min(m0 + BM, M), n0, min(n0 + BN, N), N,
                                    tid % 32);
        }
        if (push) {
            fused::cluster_wait();
            fused::cluster_barrier_relaxed();   // neither leaves while the other may write to it
        } else if (splits > 1) {
            fused::cluster_barrier();   // the peers' partials are written
            fused::cluster_barrier();   // the owners have read them (and no multicast is due)
        } else if (ctas > 1) {
            fused::cluster_barrier();   // a pair without a split: the partner is done with us
        }
    } else {
        setmaxnreg_inc<232>();
        const int c = wg - 1, ct = tid - 128;
        // Split reduction: unit u = f * NB + b of the tile (64-row fragment f = c * MI + mi,
        // 64-column box b) is added up, finished and stored by split u % S, so the S CTAs
        // share the distributed-shared-memory reads and the epilogue instead of one CTA
        // reading all S - 1 partials.
        constexpr int NB = BN / 64, UNITS = BM / 64 * NB;
        const auto owns = [&](int mi, int b) {
            return static_cast<unsigned>(((c * MI + mi) * NB + b)) % splits == rank;
        };
        // An owner's bias pairs, loaded before the stream and held in registers, so the
        // epilogue does not wait for them behind the stream's DRAM queue; a grid split's part
        // z > 0 only hands its partial on and loads none.
        unsigned bias_pairs[BN / 8];
        if (rank < static_cast<unsigned>(UNITS) && (GSPLIT == 1 || blockIdx.z == 0))
            fused::load_bias_pairs<T, BN>(bias_pairs, bias, n0, N);
        float acc[MI][BN / 2];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int j = 0; j < BN / 2; ++j) acc[mi][j] = 0.f;
        // The consumer's first fragment as a warp-uniform value (lane 0's: tid / 128 is
        // per-thread to the compiler), so the k loop's wgmma descriptors are built in
        // uniform registers.
        const int frag0 = __shfl_sync(0xFFFFFFFFu, c * MI, 0);
        for (int i = 0; i < nk; ++i) {
            const int s = i % STAGES;
            mma_k_tile<T, BM, BN, BK, MI>(acc, ring + s * S::BYTES, full0 + 8 * s,
                                          (i / STAGES) & 1, frag0);
            wgmma_wait<1>();   // the group before this one has read its slot: free it
            if (i > 0) {
                const unsigned empty = empty0 + 8 * ((i - 1) % STAGES);
                if constexpr (PAIR == 1) {
                    tma::mbar_arrive(empty);
                } else {
                    __syncwarp();   // every lane's wgmma wait is done
                    if (ct % 32 == 0) {
                        tma::mbar_arrive_cluster(empty, cluster_rank);
                        tma::mbar_arrive_cluster(empty, partner);
                    }
                }
            }
        }
        wgmma_wait<0>();
        // Every consumer's wgmmas are done with the ring (and every TMA load was waited
        // for), so the ring is free: partials in the peers, C staging in the leader. The
        // proxy fence orders the async proxy's use of it (TMA writes, wgmma reads) before
        // this thread's ordinary stores into it.
        named_sync(CONSUMERS_BAR, CONSUMER_THREADS);
        tma::fence_proxy_async();

        // Fragment-native partial layout: 16-byte chunk (mi, j) of consumer thread ct at
        // (chunk * CONSUMER_THREADS + ct) * 16, so a warp's accesses are 512 contiguous
        // bytes and the owner's thread ct reads exactly what the peer's thread ct wrote.
        // Each CTA writes the units it does not own; each owner adds, in rank order, every
        // other split's copy of its units to its own.
        if (push) {
            fused::cluster_wait();   // split 0's `recv` exists
            if (rank != 0) {
                const unsigned to = fused::peer_addr(partial_in, pair * splits),
                               bar = fused::peer_addr(recv, pair * splits);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
                    fused::st_async_v4(to + (j * CONSUMER_THREADS + ct) * 16, acc[0][4 * j],
                                       acc[0][4 * j + 1], acc[0][4 * j + 2], acc[0][4 * j + 3], bar);
            } else {
                tma::mbar_wait(recv, 0);
#pragma unroll
                for (int j = 0; j < BN / 8; ++j)
                    fused::add_chunk(acc[0], j,
                                     fused::ld_shared_v4(partial_in + (j * CONSUMER_THREADS + ct) * 16));
            }
        } else if (splits > 1) {
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    if (owns(mi, b)) continue;
#pragma unroll
                    for (int j = 8 * b; j < 8 * b + 8; ++j)
                        fused::st_shared_v4(ring + ((mi * (BN / 8) + j) * CONSUMER_THREADS + ct) * 16,
                                            acc[mi][4 * j], acc[mi][4 * j + 1], acc[mi][4 * j + 2],
                                            acc[mi][4 * j + 3]);
                }
            fused::cluster_barrier();
            for (unsigned peer = 0; peer < splits; ++peer) {
                if (peer == rank) continue;
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        if (!owns(mi, b)) continue;
#pragma unroll
                        for (int j = 8 * b; j < 8 * b + 8; ++j)
                            fused::add_chunk(acc[mi], j, fused::ld_peer_v4(
                                ring + ((mi * (BN / 8) + j) * CONSUMER_THREADS + ct) * 16,
                                pair * splits + peer));
                    }
            }
            fused::cluster_barrier();
        }
        if constexpr (GSPLIT > 1) {
            // A grid split (MI = 1): part z > 0 leaves its fragment in the stream-K workspace
            // (slot per (x, y) and part) and does not store; part 0 adds them and finishes.
            const hop::StreamK<BN, 1> sk(1, KT, 1);
            const int slot0 = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x) * (GSPLIT - 1);
            if (blockIdx.z != 0) {
                sk.write(acc[0], slot0 + static_cast<int>(blockIdx.z) - 1, c, 1 + c);
                if (splits == 1 && ctas > 1) fused::cluster_barrier();   // the pair, as below
                return;
            }
            for (int z = 1; z < GSPLIT; ++z) sk.add_partial(acc[0], slot0 + z - 1, c, 1 + c);
        }
        // The owned units: bias / activation / residual, then each 64 x 64 box staged at its
        // place in the (now free) ring and stored by TMA.
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            const int f = c * MI + mi;   // this fragment's 64-row block of the tile
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                if (!owns(mi, b)) continue;
                float(&box)[32] = *reinterpret_cast<float(*)[32]>(&acc[mi][32 * b]);
                fused::apply_epilogue_with<T, ACT, RESIDUAL, 64>(
                    box, [&](int j) { return fused::Pair<T>::unpack(bias_pairs[8 * b + j]); },
                    residual, m0 + 64 * f, n0 + 64 * b, M, N);
                fused::store_box_tma<T>(box, ring + (f * NB + b) * (64 * 64 * 2), &tmap_c,
                                        m0 + 64 * f, n0 + 64 * b, 1 + c);
            }
        }
        // Exit needs only the staging read; the stores' writes complete with the grid.
        if (tid % 128 == 0) tma::store_wait_read<0>();
        // A pair without a split meets only here, after its epilogue, not before it: neither
        // exits while the other may still multicast into it or arrive on its barriers.
        if (splits == 1 && ctas > 1) fused::cluster_barrier();
        if (push) fused::cluster_barrier_relaxed();   // as the producer warps above
    }
}

// ====================================================================== fused stage 3
// hgemm_fused_bias_act with the output quantised to fp8 e4m3 or int8 (QuantEpilogue).
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int ACT, int RESIDUAL,
          int QUANT>
__global__ void __launch_bounds__(384, 1)
hgemm_fused_quant(const __grid_constant__ TensorMap2D tmap_a,
                  const __grid_constant__ TensorMap2D tmap_b,
                  const __grid_constant__ TensorMap2D tmap_c, unsigned char* C, int M, int N, int K,
                  const T* bias, const T* residual, const float* scale, float* amax) {
    using Epilogue = fused::QuantEpilogue<T, BN, ACT, RESIDUAL, QUANT>;
    hop::persistent_gemm<T, BM, BN, BK, STAGES, GROUP, Epilogue>(
        &tmap_a, &tmap_b, &tmap_c, M, N, K, {bias, residual, C, scale, amax});
}

// ====================================================================== fused stage 4
// hgemm_fused_pingpong (the header above says how and why): hgemm_fused_bias_act's
// epilogue with the two consumer warpgroups taking turns on 64-row tiles.
template <typename T, int BM, int BN, int BK, int STAGES, int GROUP, int ACT, int RESIDUAL,
          int BOXES>
__global__ void __launch_bounds__(384, 1)
hgemm_fused_pingpong(const __grid_constant__ TensorMap2D tmap_a,
                     const __grid_constant__ TensorMap2D tmap_b,
                     const __grid_constant__ TensorMap2D tmap_c, T* C, int M, int N, int K,
                     const T* bias, const T* residual) {
    using namespace hop;
    using S = Slot<BM, BN, BK>;
    static_assert(BM == 64 || BM == 128, "each consumer warpgroup owns whole tiles of one or two "
                                         "m64 fragments");
    constexpr int MI = BM / 64;   // m64 fragments per tile, all the consumer's
    static_assert(BN == 128 || BN == 256, "wgmma m64nBNk16 with BN 128 or 256");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");
    static_assert(BOXES >= 1 && BOXES <= BN / 64, "between one staging box and the whole tile");
    constexpr unsigned STAGING_BYTES = BOXES * 64 * 64 * 2;

    __shared__ alignas(8) unsigned long long bars[2 * STAGES];
    __shared__ alignas(8) unsigned long long order[2];   // consumer c's k loops issued
    extern __shared__ unsigned char dyn_smem[];
    const unsigned ring = align1024(smem_u32(dyn_smem));
    const unsigned full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[STAGES]);
    const unsigned staging0 = ring + STAGES * S::BYTES;
    const int tid = threadIdx.x, wg = tid / 128;
    const int KT = (K + BK - 1) / BK;
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int tiles = tiles_m * tiles_n;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full0 + 8 * s, 1);
            tma::mbar_init(empty0 + 8 * s, 128);   // the one consumer warpgroup that reads it
        }
        tma::mbar_init(smem_u32(&order[0]), 1);
        tma::mbar_init(smem_u32(&order[1]), 1);
        tma::mbar_init_fence();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
        tma::prefetch_tmap(&tmap_c);
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0) {
            int it = 0;   // k tiles loaded, across the CTA's tiles
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int tm, tn;
                grouped_tile(tile, tiles_m, tiles_n, GROUP, tm, tn);
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES;
                    if (it >= STAGES) tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) + 1) & 1);
                    S::load(ring + s * S::BYTES, full0 + 8 * s, &tmap_a, &tmap_b, tm * BM, tn * BN, kt);
                }
            }
        }
    } else {
        setmaxnreg_inc<232>();
        // The consumer index as lane 0's (warp-uniform; tid / 128 is per thread to the
        // compiler), so the tile, k-tile and slot indices and the descriptors are uniform.
        const int c = __shfl_sync(0xFFFFFFFFu, wg - 1, 0), t = tid - 128 * wg;
        const unsigned staging = staging0 + c * STAGING_BYTES;
        const unsigned mine = smem_u32(&order[c]), theirs = smem_u32(&order[1 - c]);
        const bool prefetcher = t / 32 == 0;
        for (int j = c; blockIdx.x + j * gridDim.x < tiles; j += 2) {
            const int tile = blockIdx.x + j * gridDim.x;
            int tm, tn;
            grouped_tile(tile, tiles_m, tiles_n, GROUP, tm, tn);
            const int row0 = tm * BM, n0 = tn * BN;
            // Tile j - 1 is the other consumer's ((j - 1) / 2)-th: wait until its k loop is
            // issued (its phase of the other's order barrier completes).
            if (j > 0) tma::mbar_wait(theirs, ((j - 1) / 2) & 1);
            float acc[MI][BN / 2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int q = 0; q < BN / 2; ++q) acc[mi][q] = 0.f;
            const int it0 = j * KT;
            for (int kt = 0; kt < KT; ++kt) {
                const int it = it0 + kt, s = it % STAGES;
                mma_k_tile<T, BM, BN, BK, MI>(acc, ring + s * S::BYTES, full0 + 8 * s,
                                              (it / STAGES) & 1, 0);
                if (kt == KT - 1 && t == 0) tma::mbar_arrive(mine);   // the other may start
                wgmma_wait<1>();
                if (kt > 0) tma::mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
                if constexpr (RESIDUAL) {
                    if (prefetcher && kt == KT / 2)
                        fused::prefetch_rows_l2(residual, row0, min(row0 + BM, M), n0,
                                                min(n0 + BN, N), N, t % 32);
                    __syncwarp();
                }
            }
            wgmma_wait<0>();
            tma::mbar_arrive(empty0 + 8 * ((it0 + KT - 1) % STAGES));
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                // One fragment at a time through the consumer's staging boxes (each store
                // waits until the previous one has read them).
                fused::apply_epilogue<T, ACT, RESIDUAL, BN>(acc[mi], bias, residual, row0 + 64 * mi,
                                                            n0, M, N);
                store_tile_staged<T, BN, BOXES>(acc[mi], staging, &tmap_c, row0 + 64 * mi, n0, 1 + c);
            }
        }
        if (t == 0) tma::store_wait_all();
    }
}

// ====================================================================== fused stage 5
// hgemm_small_m_streamk (the header's "hgemm_small_m_streamk" says how and why): the 64-row
// tile's stream of B spread evenly over every CTA of a one-wave grid, k tile by k tile, with
// the cut tiles' fp32 partials pushed through hopper.cuh's stream-K workspace.
template <typename T, int BM, int BN, int BK, int STAGES, int ACT, int RESIDUAL, int AROWS>
__global__ void __launch_bounds__(256, 1)
hgemm_small_m_streamk(const __grid_constant__ TensorMap2D tmap_a,
                      const __grid_constant__ TensorMap2D tmap_b,
                      const __grid_constant__ TensorMap2D tmap_c, T* C, int M, int N, int K,
                      const T* bias, const T* residual) {
    using namespace hop;
    using S = Slot<BM, BN, BK>;
    static_assert(BM == 64, "one consumer warpgroup, one m64 fragment");
    static_assert(BN == 64 || BN == 128, "wgmma m64nBNk16 with BN 64 or 128");
    static_assert(STAGES >= 2, "one slot would serialise every copy with every wgmma");
    static_assert(AROWS == 16 || AROWS == 32 || AROWS == 64, "A's TMA box rows");
    constexpr unsigned CONSUMER_BAR = 3;
    constexpr unsigned A_LOADED = AROWS * BK * 2;

    __shared__ alignas(8) unsigned long long bars[2 * STAGES];
    extern __shared__ unsigned char dyn_smem[];
    const unsigned ring = align1024(smem_u32(dyn_smem));
    const unsigned staging = ring + STAGES * S::BYTES;   // BN / 64 boxes of 64 x 64
    const unsigned full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[STAGES]);
    const int tid = threadIdx.x, wg = tid / 128;
    const int KT = (K + BK - 1) / BK;
    const int tiles_m = (M + BM - 1) / BM;
    // Units are (tile, k tile), tile-major; tile t is (m tile t % tiles_m, n tile
    // t / tiles_m), so the tile rows that share a slab of B run on neighbouring CTAs.
    const long long units = static_cast<long long>(tiles_m) * ((N + BN - 1) / BN) * KT;
    const int ctas = gridDim.x, cta = blockIdx.x;
    const auto first_unit = [&](int c) { return static_cast<int>(units * c / ctas); };
    const int u0 = first_unit(cta), u1 = first_unit(cta + 1);
    // hopper.cuh's stream-K workspace (module data: a partial and a flag per CTA, slot
    // 2 * cta as consumer 0); only its write and add_partial are used (no tiles to split).
    const StreamK<BN, 1> sk(0, KT, ctas);

    // The range's pieces, in the order they run: the start [0, b) of its last tile t1 (when
    // the range ends inside it), the whole tiles, then the end [a, KT) of its first tile t0
    // (when it starts inside it); a range inside one tile is one piece. Where the range is
    // at most KT units (the host's tile width makes the tiles at most the CTAs) its k tiles
    // then run in ascending order, 0.. b - 1 and a.. KT - 1 (b <= a), so every CTA reads the
    // same rows of B at about the same time, as one CTA per tile does; in the range's own
    // order a CTA would start at k tile a and the grid would read B's rows out of phase
    // (a first build so, its wgmmas serialized too: 0.67 of hgemm_small_m's speed at
    // 16 x 14336 x 4096 on the H200). The host gives every CTA at least 4 units.
    const int t0 = u0 / KT, a = u0 % KT, t1 = (u1 - 1) / KT, b = (u1 - 1) % KT + 1;
    const bool one = t0 == t1, head = !one && b < KT, tail = !one && a > 0;
    const int whole0 = a > 0 ? t0 + 1 : t0, whole1 = b < KT ? t1 : t1 + 1;   // [whole0, whole1)
    const int pieces = one ? 1 : head + (whole1 - whole0) + tail;
    struct Piece { int tile, k0, k1; };
    const auto piece = [&](int q) -> Piece {
        if (one) return {t0, a, b};
        if (head && q == 0) return {t1, 0, b};
        q -= head;
        if (q < whole1 - whole0) return {whole0 + q, 0, KT};
        return {t0, a, KT};
    };

    // The range's i-th k tile (in running order) into slot i % STAGES (thread 0 only), for
    // the tile whose first row and column are m0, n0.
    const auto issue = [&](int i, int m0, int n0, int kt) {
        const int s = i % STAGES;
        if (i >= STAGES) tma::mbar_wait(empty0 + 8 * s, ((i / STAGES) + 1) & 1);
        const unsigned slot = ring + s * S::BYTES, full = full0 + 8 * s;
        tma::mbar_expect_tx(full, A_LOADED + BK * BN * 2);
        tma::load_2d(slot, &tmap_a, full, kt * BK, m0);
#pragma unroll
        for (int j = 0; j < BN / 64; ++j)
            tma::load_2d(slot + S::A_BYTES + j * S::B_ATOM_BYTES, &tmap_b, full, n0 + 64 * j,
                         kt * BK);
    };
    // Thread 0 walks the pieces twice, through the first ring before the block's barrier
    // and the rest after it, at the same place in the same order. A tile's corner is worked
    // out once per piece: this thread issues every refill of the ring, and with an integer
    // division per k tile in its loop a first build measured 0.84 of hgemm_small_m's speed
    // at 16 x 8192^2 with a CTA per tile, the same work.
    const auto issue_range = [&](int from, int to) {
        int i = 0;
        for (int q = 0; q < pieces && i < to; ++q) {
            const Piece pc = piece(q);
            const int m0 = (pc.tile % tiles_m) * BM, n0 = (pc.tile / tiles_m) * BN;
            for (int kt = pc.k0; kt < pc.k1 && i < to; ++kt, ++i)
                if (i >= from) issue(i, m0, n0, kt);
        }
    };
    const int early = min(STAGES, u1 - u0);
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            tma::mbar_init(full0 + 8 * s, 1);
            tma::mbar_init(empty0 + 8 * s, 128);
        }
        tma::mbar_init_fence();
        tma::prefetch_tmap(&tmap_a);
        tma::prefetch_tmap(&tmap_b);
        tma::prefetch_tmap(&tmap_c);
        issue_range(0, early);
    }
    if constexpr (AROWS < BM) {
        // As hgemm_small_m: A's rows AROWS.. of every slot are zero once and for all.
        constexpr int CHUNKS = (BM - AROWS) * 128 / 16;
        for (int i = tid; i < STAGES * CHUNKS; i += blockDim.x)
            fused::st_shared_v4(ring + (i / CHUNKS) * S::BYTES + AROWS * 128 + (i % CHUNKS) * 16,
                                0.f, 0.f, 0.f, 0.f);
        tma::fence_proxy_async();
    }
    __syncthreads();

    // setmaxnreg on both sides for the uniform wgmma descriptors, as in hgemm_small_m.
    if (wg == 0) {
        setmaxnreg_dec<40>();
        if (tid == 0) issue_range(early, u1 - u0);
        return;
    }
    setmaxnreg_inc<232>();
    const int ct = tid - 128;
    unsigned bias_pairs[BN / 8];
    bool staged = false;   // a TMA store may still be reading the staging
    int i = 0;             // k tiles consumed: slot i % STAGES, its round i / STAGES
    for (int q = 0; q < pieces; ++q) {
        const Piece pc = piece(q);
        const int m0 = (pc.tile % tiles_m) * BM, n0 = (pc.tile / tiles_m) * BN;
        // The piece with the tile's last k tile finishes it: it runs last in its CTA's
        // range, while the tile's other pieces (in earlier CTAs) run first in theirs or are
        // their CTA's only piece, so their partials are waiting or about to be.
        const bool finisher = pc.k1 == KT;
        if (finisher) fused::load_bias_pairs<T, BN>(bias_pairs, bias, n0, N);
        float acc[1][BN / 2];
        for (int kt = pc.k0; kt < pc.k1; ++kt, ++i) {
            const int s = i % STAGES;
            const unsigned slot = ring + s * S::BYTES;
            tma::mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < BK / 16; ++k)   // the piece's first step overwrites acc
                Wgmma<T, BN>::mma(acc[0], S::a_desc(slot, 0, k), S::b_desc(slot, k),
                                  kt > pc.k0 || k > 0);
            wgmma_commit();
            wgmma_wait<1>();   // the group before has read its slot: free that one
            if (kt > pc.k0) tma::mbar_arrive(empty0 + 8 * ((i - 1) % STAGES));
        }
        wgmma_wait<0>();
        tma::mbar_arrive(empty0 + 8 * ((i - 1) % STAGES));
        if (!finisher) {
            // At most one piece of a range ends before its tile's last k tile, so the
            // CTA's workspace slot is its own.
            sk.write(acc[0], cta, 0, CONSUMER_BAR);
            continue;
        }
        // The earlier CTAs whose ranges end inside this tile hold its other pieces: add
        // them in CTA order (a fixed sum), and clear each flag for the next launch.
        const int tile_start = pc.tile * KT;
        if (pc.k0 > 0) {
            int p0 = cta - 1;
            while (p0 > 0 && first_unit(p0) > tile_start) --p0;
            for (int p = p0; p < cta; ++p)
                if (first_unit(p + 1) != first_unit(p))   // an empty range wrote nothing
                    sk.add_partial(acc[0], p, 0, CONSUMER_BAR);
        }
        if (staged) {
            if (ct == 0) tma::store_wait_read<0>();   // the previous tile's store has read it
            named_sync(CONSUMER_BAR, 128);
        }
#pragma unroll
        for (int bx = 0; bx < BN / 64; ++bx) {
            float(&box)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][32 * bx]);
            fused::apply_epilogue_with<T, ACT, RESIDUAL, 64>(
                box, [&](int j) { return fused::Pair<T>::unpack(bias_pairs[8 * bx + j]); },
                residual, m0, n0 + 64 * bx, M, N);
            fused::store_box_tma<T>(box, staging + bx * (64 * 64 * 2), &tmap_c, m0, n0 + 64 * bx, 1);
        }
        staged = true;
    }
    if (ct == 0) tma::store_wait_read<0>();
}
