"""Launch structure: how a GEMM kernel is laid out on the GPU, read from its counters.

Two kernels on the same instruction path can still differ in how they use the machine,
and for kernels close to cuBLAS that is where the gap is. ``launch_shape`` reads one
kernel's structure from its report (and run manifest, when there is one):

- the grid: CTAs, waves per SM, and whether the CTAs are persistent (fewer CTAs than
  output tiles, so each walks several and overlaps one tile's epilogue with the next
  tile's loads);
- the tile per CTA (the manifest's BM x BN, else the grid over the shape) and the MMA
  instruction shape (HGMMA.64x256x16 ...);
- clusters and TMA multicast (UTMALDG .MULTICAST among the executed TMA loads);
- warp specialisation: warpgroups per CTA and register reallocation (USETMAXREG);
- the consumers' tiles: whether the consumer warpgroups share each tile (cooperative) or
  each owns whole tiles (ping-pong), from the tile, the MMA shape and the warpgroups;
- the epilogue: C written by TMA stores (UTMASTG) or by per-thread STG;
- the wgmma pipeline: how many wgmmas issue per wait (WARPGROUP.DEPBAR per HGMMA/QGMMA
  executed): one wait per wgmma is the serialized pipeline ptxas falls back to (its C7515
  info, PS144 of `perfscope sass`), several per wait keep the tensor pipe fed;
- the streamed operand's TMA boxes (where the loader planned the run's reads from its run
  manifest): whether each box is one contiguous piece or rows of short runs far apart.

``compare_structure`` sets two kernels side by side as ``Aspect`` rows, each with its
evidence, the finding tags it explains (a finding and the structure behind it are one
reason, not two) and, where the counters allow one, a modelled share of the slower
kernel's time. The diff spreads the cycle gap over them (perfscope.diff).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfscope.manifest import RunManifest
from perfscope.profile import KernelProfile
from perfscope.stage import OperandRead

# 32-bit registers per SM (sm_80 to sm_100): a CTA's accumulator tile must fit in them,
# so a CTA that owns more outputs than this walks several tiles (it is persistent).
REGISTER_FILE_WORDS = 65536
WARPGROUP = 128
# 32-bit registers a thread can hold (sm_70 onwards): a warpgroup whose tile needs more
# fp32 accumulators per thread than this cannot own that tile alone.
ACCUMULATOR_REGISTERS_MAX = 255
# A grid counts as one wave up to this many waves (ncu rounds waves per SM).
ONE_WAVE = 1.0 + 1e-6

GRID, TILE, CLUSTER, SPECIALISATION, CONSUMERS, EPILOGUE, PIPELINE, BOXES = (
    "grid", "tile", "cluster", "warp specialisation", "consumer tiles", "epilogue",
    "wgmma pipeline", "streamed operand's boxes")
# A kernel waits on (nearly) every wgmma alone from this many waits per wgmma on: the
# serialized build measured 1.00, every pipelined wgmma kernel on the H200 0.125-0.5
# (ours, cuBLAS, cuBLASLt's nvjet, Triton's 64x64), whose waits cover a k tile's 2-8 wgmmas.
SERIAL_WAITS_PER_MMA = 0.9
# Finding tags (perfscope.rules.model.TAGS) each aspect explains.
ABSORBS: dict[str, tuple[str, ...]] = {
    GRID: ("tail-effect", "small-grid", "epilogue-exposed"),
    TILE: ("small-tile", "no-data-reuse"),
    CLUSTER: ("l2-locality",),
    SPECIALISATION: ("latency-exposed",),
    CONSUMERS: ("epilogue-exposed",),
    EPILOGUE: ("store-inefficiency",),
    # A serialized pipeline idles the tensor pipe between wgmmas: the idle PS124 and PS120
    # read is its cost, not a second reason, and PS145 is this aspect read from one report.
    PIPELINE: ("epilogue-exposed", "latency-exposed", "mma-serialized"),
    BOXES: ("short-runs",),
}
# Aspects that only exist on the TMA/wgmma path: when one kernel lacks that path, they
# are part of the path's reason, not reasons of their own.
ON_PATH = (CLUSTER, SPECIALISATION, CONSUMERS, EPILOGUE, PIPELINE, BOXES)


@dataclass(frozen=True)
class LaunchShape:
    """One kernel's launch structure; None where the report does not say."""

    ctas: int | None
    waves: float | None
    persistent: bool | None
    tile: tuple[int, int] | None          # outputs per CTA tile, M x N
    tile_source: str                      # "run manifest", "grid", or ""
    mma: str | None                       # most executed MMA opcode with its shape
    cluster: tuple[int, int, int] | None  # None: no cluster launch
    multicast: float | None               # share of TMA loads that multicast
    warpgroups: int | None
    setmaxreg: bool
    tma_stores: float
    stg_stores: float
    stsm: float
    mma_waits: float | None = None        # WARPGROUP.DEPBAR per wgmma executed; None: no wgmma
    # The TMA reads of the operand with the most bytes (the weight of a decode GEMM), where
    # the loader planned the run's reads; None elsewhere.
    streamed: OperandRead | None = None
    # Output tiles of the launch (batch x ceil(M / tile M) x ceil(N / tile N)), where the
    # tile and the shape are known.
    tiles: int | None = None

    @property
    def whole_rounds(self) -> bool:
        """Whether a persistent grid gives every CTA as many tiles (no short last round)."""
        return bool(self.persistent and self.ctas and self.tiles and self.tiles % self.ctas == 0)

    @property
    def contiguous_boxes(self) -> bool | None:
        """Whether each box of the streamed operand is one contiguous piece of memory."""
        s = self.streamed
        return None if s is None else s.run_bytes == s.box_rows * s.box_row_bytes

    @property
    def serialized(self) -> bool | None:
        """Whether the kernel waits on each wgmma alone (None without wgmma)."""
        return None if self.mma_waits is None else self.mma_waits >= SERIAL_WAITS_PER_MMA

    @property
    def cluster_size(self) -> int:
        """CTAs per cluster, 1 for a launch without clusters."""
        return math.prod(self.cluster) if self.cluster else 1

    @property
    def specialised(self) -> bool:
        """Producer/consumer warpgroups: several warpgroups with register reallocation."""
        return self.setmaxreg and (self.warpgroups or 0) >= 2

    @property
    def consumers(self) -> int | None:
        """Consumer warpgroups of a producer/consumer CTA (all but the producer)."""
        return self.warpgroups - 1 if self.specialised and self.warpgroups else None

    @property
    def consumers_own_tiles(self) -> bool | None:
        """Whether each consumer warpgroup owns whole tiles (ping-pong) rather than a share
        of one (cooperative): a tile of one MMA fragment (64 x 256 with HGMMA.64x256) cannot
        be shared by two consumers, a tile of one fragment per consumer is. None where the
        tile, the MMA shape or the consumers are not known, or the tile is neither."""
        frag = mma_fragment(self.mma)
        if self.tile is None or frag is None or not self.consumers or self.consumers < 2:
            return None
        if self.tile == frag:
            return True
        # One fragment per consumer is a shared tile only when one warpgroup could not hold
        # the whole tile's accumulators (128 x 256 fp32: 256 registers a thread); a 128 x 128
        # tile may be either.
        if (self.tile == (frag[0] * self.consumers, frag[1])
                and math.prod(self.tile) // WARPGROUP > ACCUMULATOR_REGISTERS_MAX):
            return False
        return None

    @property
    def tail(self) -> float | None:
        """Share of the launch the last, partly filled wave leaves idle (0 for whole waves)."""
        if self.waves is None or self.waves <= ONE_WAVE:
            return None
        rounds = math.ceil(self.waves - 1e-9)
        return (rounds - self.waves) / rounds


def _count(kp: KernelProfile, base: str) -> float:
    return float(kp.opcodes.executed.get(base, 0.0))


def _tile(kp: KernelProfile, manifest: RunManifest | None, shape: tuple[int, int, int] | None
          ) -> tuple[tuple[int, int] | None, str]:
    params = manifest.params if manifest is not None else {}
    if "BM" in params and "BN" in params:
        return (int(params["BM"]), int(params["BN"])), "run manifest"
    grid = kp.identity.grid
    waves = kp.launch.waves_per_sm
    # A multi-wave 2-D grid over the output: one tile per CTA, x over N and y over M
    # (how perfscope's stages and most GEMMs launch; z over a batch's products). A 1-D grid
    # (Triton's, a persistent one) says how many tiles there are, not their shape.
    batch = manifest.batch if manifest is not None else 1
    if (shape and grid and grid[0] > 1 and grid[1] > 1 and grid[2] == batch and waves is not None
            and waves > ONE_WAVE):
        m, n, _ = shape
        return (math.ceil(m / grid[1]), math.ceil(n / grid[0])), "grid"
    return None, ""


def _persistent(ctas: int | None, waves: float | None, tile: tuple[int, int] | None,
                shape: tuple[int, int, int] | None, batch: int = 1) -> bool | None:
    if ctas is None or waves is None:
        return None
    if waves > ONE_WAVE:
        return False
    if shape is None:
        return None
    m, n, _ = shape
    if tile is not None:
        return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1]) > ctas
    return batch * m * n / ctas > REGISTER_FILE_WORDS


def mma_fragment(mma: str | None) -> tuple[int, int] | None:
    """(M, N) of one warpgroup MMA instruction (HGMMA.64x256x16.F32.BF16: (64, 256)); None
    for the warp-level MMAs and an unknown shape."""
    if not mma or "GMMA" not in mma.split(".", 1)[0]:
        return None
    parts = mma.split(".")
    dims = parts[1].split("x") if len(parts) > 1 else []
    if len(dims) != 3 or not all(d.isdigit() for d in dims):
        return None
    return int(dims[0]), int(dims[1])


# The warpgroup MMA opcodes (wgmma): what the pipeline and descriptor measures count per.
WARPGROUP_MMA = ("HGMMA", "QGMMA", "IGMMA", "BGMMA")


def warpgroup_mmas(kp: KernelProfile) -> float:
    """Warpgroup MMA instructions executed (HGMMA, QGMMA, ...; 0 without them)."""
    return sum(n for op, n in kp.opcodes.with_modifiers.items() if op.startswith(WARPGROUP_MMA))


def _mma(kp: KernelProfile) -> str | None:
    for op in kp.opcodes.with_modifiers:       # most executed first
        if op.startswith((*WARPGROUP_MMA, "HMMA", "UTCHMMA", "UTCQMMA")):
            return op
    return None


def launch_shape(kp: KernelProfile, manifest: RunManifest | None,
                 reads: Sequence[OperandRead] | None = None) -> LaunchShape:
    """The structure of one launch (manifest: its run manifest, for the shape and tile;
    reads: how the run read its operands by TMA, where the loader knows)."""
    shape = (manifest.m, manifest.n, manifest.k) if manifest is not None and manifest.m > 0 \
        and manifest.n > 0 and manifest.k > 0 else None
    batch = manifest.batch if manifest is not None else 1
    tile, source = _tile(kp, manifest, shape)
    ctas = kp.launch.grid_size
    waves = kp.launch.waves_per_sm
    multicast = kp.opcodes.tma_multicast_share
    block = kp.identity.block
    threads = math.prod(block) if block else None
    fast = kp.opcodes.has("gmma") or kp.opcodes.has("tma")
    mmas = warpgroup_mmas(kp)
    waits = sum(n for op, n in kp.opcodes.with_modifiers.items()
                if op.startswith("WARPGROUP.DEPBAR"))
    tiles = (batch * math.ceil(shape[0] / tile[0]) * math.ceil(shape[1] / tile[1])
             if shape is not None and tile is not None else None)
    return LaunchShape(
        ctas=ctas, waves=waves, persistent=_persistent(ctas, waves, tile, shape, batch), tile=tile,
        tile_source=source, mma=_mma(kp), cluster=kp.identity.cluster, multicast=multicast,
        warpgroups=threads // WARPGROUP if threads and fast and threads % WARPGROUP == 0 else None,
        setmaxreg=_count(kp, "USETMAXREG") > 0, tma_stores=_count(kp, "UTMASTG"),
        stg_stores=_count(kp, "STG"), stsm=_count(kp, "STSM"),
        mma_waits=waits / mmas if mmas else None,
        streamed=max(reads, key=lambda r: r.bytes) if reads else None, tiles=tiles)


# ------------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Aspect:
    """One part of launch structure on both sides, and whether it differs."""

    name: str                 # GRID / TILE / CLUSTER / SPECIALISATION / EPILOGUE
    a: str
    b: str
    differs: bool
    evidence: str             # the counters the two texts are read from
    absorbs: tuple[str, ...]  # finding tags this aspect explains

    @property
    def on_path(self) -> bool:
        """Whether the aspect exists only on the TMA/wgmma path, so it is part of that path's reason."""
        return self.name in ON_PATH


def _grid_text(s: LaunchShape) -> str:
    if s.ctas is None or s.waves is None:
        return "not collected"
    waves = f"{s.waves:.2f} wave{'s' if abs(s.waves - 1) > 0.005 else ''} per SM"
    tail = "persistent: each CTA walks several tiles" if s.persistent else \
        ("one tile per CTA" if s.persistent is False else "")
    return f"{s.ctas:,} CTAs in {waves}" + (f" ({tail})" if tail else "")


def _tile_text(s: LaunchShape) -> str:
    tile = f"{s.tile[0]}x{s.tile[1]} per CTA ({s.tile_source})" if s.tile else "tile not known"
    return tile + (f", {s.mma}" if s.mma else "")


def _cluster_text(s: LaunchShape) -> str:
    if s.cluster is None:
        return "no clusters"
    dims = "x".join(map(str, s.cluster))
    cast = "" if s.multicast is None else f", {s.multicast:.0%} of TMA loads multicast"
    return f"{s.cluster_size}-CTA clusters ({dims}){cast}"


def _specialisation_text(s: LaunchShape) -> str:
    groups = "" if s.warpgroups is None else f"{s.warpgroups} warpgroup{'s' if s.warpgroups != 1 else ''}"
    if s.specialised:
        return f"{groups}, producer/consumer with setmaxnreg (USETMAXREG)"
    return ", ".join(p for p in (groups, "no setmaxnreg" if not s.setmaxreg else "setmaxnreg") if p)


def _consumers_text(s: LaunchShape) -> str:
    own = s.consumers_own_tiles
    if own is None or s.tile is None:
        return "not known"
    tile = f"{s.tile[0]}x{s.tile[1]}"
    if own:
        return f"each of {s.consumers} consumer warpgroups owns whole {tile} tiles (ping-pong)"
    return f"{s.consumers} consumer warpgroups share each {tile} tile (cooperative)"


def _epilogue_text(s: LaunchShape) -> str:
    if s.tma_stores:
        via = "stmatrix (STSM) into shared memory, then " if s.stsm else ""
        return f"{via}TMA stores (UTMASTG x{s.tma_stores:,.0f})"
    if s.stg_stores:
        return f"per-thread stores (STG x{s.stg_stores:,.0f})"
    return "no global stores executed"


def _pipeline_text(s: LaunchShape) -> str:
    if s.mma_waits is None:
        return "no wgmma"
    if s.serialized:
        # One wait per wgmma is also what a pipelined k step of a single wgmma (BK 16)
        # executes; the counts cannot tell the two apart, so the text says both.
        return (f"{s.mma_waits:.2f} waits (WARPGROUP.DEPBAR) per wgmma: each wgmma waited on "
                "alone (a serialized pipeline, or one wgmma per k step)")
    return f"{1 / s.mma_waits:.1f} wgmmas per wait (WARPGROUP.DEPBAR): several in flight"


def _boxes_text(s: LaunchShape) -> str:
    r = s.streamed
    if r is None:
        return "not known"
    piece = ("each box one contiguous piece" if s.contiguous_boxes
             else f"{r.box_rows} pieces of {r.run_bytes:,} B per box")
    return (f"reads {r.operand} in {r.box_rows} x {r.box_row_bytes} B boxes, rows "
            f"{r.row_bytes:,} B apart ({r.layout}): {piece}")


def compare_structure(a: LaunchShape, b: LaunchShape) -> tuple[Aspect, ...]:
    """The aspects of A and B's launch structure, in a fixed order."""
    out = [Aspect(GRID, _grid_text(a), _grid_text(b),
                  a.persistent is not None and b.persistent is not None and a.persistent != b.persistent,
                  "launch__grid_size, launch__waves_per_multiprocessor, the run manifest's shape",
                  ABSORBS[GRID])]
    consumers_differ = (a.consumers_own_tiles is not None and b.consumers_own_tiles is not None
                        and a.consumers_own_tiles != b.consumers_own_tiles)
    # Tiles that differ because one side's consumers own them are that aspect's reason.
    tiles_differ = (a.tile is not None and b.tile is not None and a.tile != b.tile
                    and not consumers_differ)
    out.append(Aspect(TILE, _tile_text(a), _tile_text(b), tiles_differ,
                      "the run manifest's BM x BN (else the grid over the shape), "
                      "sass__inst_executed_per_opcode_with_modifier_all", ABSORBS[TILE]))
    uses_fast = any(s.warpgroups is not None or s.tma_stores or s.multicast is not None for s in (a, b))
    if uses_fast or a.cluster or b.cluster:
        out.append(Aspect(CLUSTER, _cluster_text(a), _cluster_text(b),
                          a.cluster_size != b.cluster_size or bool(a.multicast) != bool(b.multicast),
                          "launch__cluster_dim_x/y/z, UTMALDG .MULTICAST executed", ABSORBS[CLUSTER]))
    if uses_fast:
        out.append(Aspect(SPECIALISATION, _specialisation_text(a), _specialisation_text(b),
                          a.specialised != b.specialised,
                          "launch__block_dim (warpgroups of 128 threads), USETMAXREG executed",
                          ABSORBS[SPECIALISATION]))
    if a.consumers_own_tiles is not None or b.consumers_own_tiles is not None:
        out.append(Aspect(CONSUMERS, _consumers_text(a), _consumers_text(b),
                          consumers_differ,
                          "the tile (run manifest), the MMA's shape (HGMMA.MxNxK executed), "
                          "launch__block_dim and USETMAXREG", ABSORBS[CONSUMERS]))
    if a.tma_stores or b.tma_stores or a.stg_stores or b.stg_stores:
        out.append(Aspect(EPILOGUE, _epilogue_text(a), _epilogue_text(b),
                          bool(a.tma_stores) != bool(b.tma_stores),
                          "UTMASTG, STSM and STG executed", ABSORBS[EPILOGUE]))
    # Shown only where one side is serialized: every pipelined pair would otherwise carry a
    # row that says nothing.
    if a.serialized is not None and b.serialized is not None and a.serialized != b.serialized:
        out.append(Aspect(PIPELINE, _pipeline_text(a), _pipeline_text(b), True,
                          "WARPGROUP.DEPBAR and HGMMA/QGMMA executed", ABSORBS[PIPELINE]))
    # Shown where both sides' boxes are known (perfscope's own stages) and they differ.
    if (a.contiguous_boxes is not None and b.contiguous_boxes is not None
            and a.contiguous_boxes != b.contiguous_boxes):
        out.append(Aspect(BOXES, _boxes_text(a), _boxes_text(b), True,
                          "the tensor maps of each run's stage, planned from its run manifest",
                          ABSORBS[BOXES]))
    return tuple(out)


def has_feature(name: str, s: LaunchShape) -> bool | None:
    """Whether a launch has the aspect's feature (the thing its usual fix adds): a
    persistent grid, the larger tile, multicast in clusters, producer/consumer warpgroups,
    consumers that own their tiles (ping-pong), TMA stores, contiguous boxes; None where the
    report does not say. TILE has no feature of its own (see larger_tile)."""
    # CLUSTER's feature is the multicast its fix adds: clusters that share nothing by TMA
    # (a split-K reduction in distributed shared memory) do not have it.
    return {GRID: s.persistent, CLUSTER: s.cluster_size > 1 and bool(s.multicast),
            SPECIALISATION: s.specialised,
            CONSUMERS: s.consumers_own_tiles, EPILOGUE: bool(s.tma_stores),
            PIPELINE: None if s.serialized is None else not s.serialized,
            BOXES: s.contiguous_boxes}.get(name)


def larger_tile(slow: LaunchShape, fast: LaunchShape) -> bool | None:
    """Whether the slower launch's tile holds more outputs than the faster one's."""
    if slow.tile is None or fast.tile is None:
        return None
    return math.prod(slow.tile) > math.prod(fast.tile)


def slow_side_has_it(name: str, slow: LaunchShape, fast: LaunchShape) -> bool:
    """Whether the slower launch already has what the aspect's usual fix would add and the
    faster one does without it: then "do what the faster kernel does" means dropping it."""
    if name == TILE:
        return bool(larger_tile(slow, fast))
    return has_feature(name, slow) is True and has_feature(name, fast) is False


def modelled_share(aspect: Aspect, slow: LaunchShape, fast: LaunchShape) -> float | None:
    """The share of the slower kernel's time an aspect's difference costs, where the
    counters give one: a multi-wave grid against a persistent one idles the SMs its last
    wave leaves empty. None where no counter measures it."""
    if aspect.name == GRID and aspect.differs and not slow.persistent and fast.persistent:
        return slow.tail
    return None
