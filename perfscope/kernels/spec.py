"""KernelSpec: one stage of a GEMM ladder as data, and the shapes and dtypes it takes.

A spec names the template in its .cu source and the template's integer parameters, so a
later ``perfscope tune`` can vary them; launch geometry (block, grid, dynamic shared
memory) is computed from those parameters, never hard-wired beside them.

Kernel ABI: row-major C[M][N] = A[M][K] · B[K][N]. The mma.sync and FP32 stages take
pointers, ``template <typename T, int ...> __global__ void name(const T* A, const T* B,
T* C, int M, int N, int K)`` (``abi="pointers"``); the TMA stages (hopper.cu,
blackwell.cu) take CUtensorMaps by value, ``name(TensorMap2D tmap_a, tmap_b, tmap_c, T* C,
int M, int N, int K)`` (``abi="tensormap"``, boxes from ``tma_boxes``). Both are
instantiated through an NVRTC name expression such as ``hgemm_bcf<__half, 128, 128, 32>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.kernels.weights import ROW_MAJOR

KERNEL_DIR = Path(__file__).resolve().parent

FAMILIES = ("sgemm", "hgemm", "blackwell", "cublas")
ABIS = ("pointers", "tensormap")

# How a stage that perfscope compiles and audits but has never executed is labelled,
# wherever it appears (registry, `perfscope sass`, README).
NEVER_RUN_LABEL = "compiled, never run"

# dtype name -> (C++ element type in the name expression, what users may type)
# fp8: e4m3 inputs (A, and B transposed as Bt, both K contiguous) with per-tensor scales, bf16 C
# (perfscope/kernels/fp8.py), the one dtype whose C is not of its inputs' type.
FP8 = "fp8"
DTYPES: Mapping[str, str] = {"fp32": "float", "fp16": "__half", "bf16": "__nv_bfloat16",
                             "fp8": "__nv_fp8_e4m3"}
DTYPE_ALIASES: Mapping[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp8": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8",
}

Params = Mapping[str, int]


def normalize_dtype(name: str) -> str:
    """The canonical dtype name for an alias ("half" -> "fp16"); an unknown one is refused."""
    key = DTYPE_ALIASES.get(name.strip().lower())
    if key is None:
        raise PerfscopeError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return key


@dataclass(frozen=True)
class Shape:
    """A GEMM problem size: C[M][N] = A[M][K] · B[K][N]; with ``batch`` B > 1, B such products
    in one launch (a strided batched GEMM: A[B][M][K] · B[B][K][N], as torch.bmm and
    attention's score and value products run), written BxMxNxK."""

    m: int
    n: int
    k: int
    batch: int = 1

    def __post_init__(self) -> None:
        for dim, value in (("M", self.m), ("N", self.n), ("K", self.k), ("the batch", self.batch)):
            if value <= 0:
                raise PerfscopeError(f"{dim} must be a positive size, got {value}")
        if max(self.m * self.k, self.k * self.n, self.m * self.n) >= 2**31:
            raise PerfscopeError(
                f"shape {self} has a matrix of 2^31 or more elements, beyond the kernels' "
                "32-bit indexing")

    @property
    def flops(self) -> int:
        """Floating-point operations of the product(s): one multiply and one add per
        B·M·N·K."""
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def lead(self) -> tuple[int, ...]:
        """The operands' leading (batch) dimension as an array shape prefix: () for one GEMM."""
        return (self.batch,) if self.batch > 1 else ()

    def dim(self, name: str) -> int:
        """The size of dimension "M", "N" or "K"."""
        return {"M": self.m, "N": self.n, "K": self.k}[name]

    def __str__(self) -> str:
        one = f"{self.m}x{self.n}x{self.k}"
        return f"{self.batch}x{one}" if self.batch > 1 else one


_SHAPE_RE = re.compile(r"^\s*(?:(-?\d+)\s*[xX×]\s*)?(-?\d+)\s*[xX×]\s*(-?\d+)\s*[xX×]\s*(-?\d+)\s*$")


def param_tag(params: Mapping[str, int] | None) -> str:
    """``{"STAGES": 4, "BK": 32}`` -> ``"@BK=32,STAGES=4"`` ("" for none): how a report stem
    and an audit name a configuration; parse_params reads its items back."""
    return "@" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) if params else ""


def parse_params(items: Sequence[str]) -> dict[str, int]:
    """``["STAGES=4"]`` -> ``{"STAGES": 4}``; anything else is refused in a sentence."""
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = int(value)
        except ValueError:
            raise PerfscopeError(
                f"parameter {item!r} is not of the form NAME=INTEGER, e.g. STAGES=4") from None
    return out


def parse_shape(text: str) -> Shape:
    """``"1000x2000x500"`` -> Shape(1000, 2000, 500), ``"8x1024x1024x64"`` -> the batch of 8
    such GEMMs (the batch first, as in torch.bmm's operands); anything else is refused in a
    sentence."""
    m = _SHAPE_RE.match(text)
    if not m:
        raise PerfscopeError(
            f"shape {text!r} is not of the form MxNxK with three integers, e.g. 4096x4096x4096 "
            "(or BxMxNxK for a batch of B, e.g. 8x1024x1024x64)")
    batch, dims = m.group(1), (int(g) for g in m.groups()[1:])
    return Shape(*dims, batch=1 if batch is None else int(batch))


@dataclass(frozen=True)
class ShapeConstraint:
    """A dimension the kernel needs to be a multiple of something (alignment, no tails)."""

    dim: str  # "M", "N" or "K"
    multiple_of: int
    why: str  # the reason, finishing the sentence "... because ..."

    def check(self, stage: str, shape: Shape) -> None:
        """Refuse, in one sentence naming the reason, a shape this dimension does not divide."""
        value = shape.dim(self.dim)
        if value % self.multiple_of:
            raise PerfscopeError(
                f"{stage} needs {self.dim} to be a multiple of {self.multiple_of} because "
                f"{self.why}, but the shape {shape} has {self.dim}={value}")


def tile_grid(bm: str = "BM", bn: str = "BN") -> Callable[[Params, Shape], tuple[int, int, int]]:
    """The plain launch grid (ceil(N/BN), ceil(M/BM)), tile sizes read from the parameters."""

    def grid(params: Params, shape: Shape) -> tuple[int, int, int]:
        return (-(-shape.n // params[bn]), -(-shape.m // params[bm]), 1)

    grid.__doc__ = f"(ceil(N/{bn}), ceil(M/{bm}), 1)"
    return grid


def no_smem(_params: Params) -> int:
    """No shared memory of this kind, whatever the parameters."""
    return 0


def ring_and_boxes_smem(p: Params) -> int:
    """The dynamic shared memory of hop::persistent_gemm's kernels (hopper.cu's persistent
    stages, fused.cu's hgemm_fused_bias_act): the ring, the 8 KB C staging boxes of each of the
    two consumers (BOXES, at most the BN/64 of the whole tile), and 1024 bytes of realignment."""
    return (p["STAGES"] * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * 2
            + 2 * min(p["BOXES"], p["BN"] // 64) * 64 * 64 * 2 + 1024)


@dataclass(frozen=True)
class TmaBox:
    """The box one TMA copy moves for an operand: rows x cols elements (cols innermost)."""

    rows: int
    cols: int


@dataclass(frozen=True)
class TmaBoxes:
    """The boxes of A, B and C a tensor-map stage's maps are encoded with."""

    a: TmaBox
    b: TmaBox
    c: TmaBox


@dataclass(frozen=True)
class SpaceRule:
    """A relation between template parameters the kernel needs (one of its static_asserts,
    or its design), for ``perfscope tune`` to prune configurations before compiling."""

    why: str  # the reason a pruned configuration is given, as a clause: "BM must split ..."
    holds: Callable[[Params], bool]


@dataclass(frozen=True)
class SearchSpace:
    """The values ``perfscope tune`` may give each template parameter of a stage.

    Every parameter of the stage is named, a fixed one with its single value, so a pinned
    ``--param`` is checked against the same table. ``held`` names parameters that choose
    what the kernel computes (a fused stage's epilogue), not how: a sweep keeps them at the
    stage's value, and ``--param`` may pin any of their declared values instead, but they are
    never searched (configurations of different epilogues compute different things). Limits
    that hold for every stage (shared memory, TMA boxes, threads, registers and spills) are
    not repeated here: the tuner derives them from the spec and from ptxas.
    """

    values: tuple[tuple[str, tuple[int, ...]], ...]
    rules: tuple[SpaceRule, ...] = ()
    held: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters, in the stage's order."""
        return tuple(name for name, _ in self.values)

    def choices(self, name: str) -> tuple[int, ...]:
        """The values name may take."""
        return dict(self.values)[name]

    @property
    def size(self) -> int:
        """Configurations before any rule or limit prunes them."""
        n = 1
        for _, vals in self.values:
            n *= len(vals)
        return n


@dataclass(frozen=True)
class KernelSpec:
    """One stage: where its code is, how to launch it, and where it sits in its ladder."""

    name: str
    family: str
    dtypes: tuple[str, ...]
    change: str
    seed: str
    parent: str | None = None
    source: str | None = None  # file in perfscope/kernels; None for cuBLAS references
    entry: str | None = None  # template name
    params: tuple[tuple[str, int], ...] = ()
    block: Callable[[Params], tuple[int, int, int]] | None = None
    grid: Callable[[Params, Shape], tuple[int, int, int]] | None = None
    dynamic_smem: Callable[[Params], int] = no_smem
    # Static shared memory the kernel's header comment declares (bytes); the compile test
    # holds it against ptxas, so the spec cannot drift from the source unnoticed.
    static_smem: Callable[[Params], int] = no_smem
    min_cc: int = 80
    variant: bool = False
    constraints: tuple[ShapeConstraint, ...] = ()
    # Takes a batch of GEMMs in one launch (Shape.batch > 1): the cuBLAS references, through
    # cublasGemmStridedBatchedEx on 3-D operands (launch._strided_batched); no ladder kernel
    # indexes a batch.
    batched: bool = False
    flags: tuple[str, ...] = ()
    # SASS opcode families (perfscope.families keys) the compiled kernel must use.
    fingerprint: tuple[str, ...] = ()
    # Compile targets the stage is built and statically audited for; the first is what
    # `perfscope sass STAGE` uses when no --arch is given.
    archs: tuple[str, ...] = ("sm_90a", "sm_80")
    # Compute capabilities whose instructions the stage needs exactly (tcgen05 exists on
    # 10.0 and 10.3, not on 12.x); empty: any capability from min_cc on.
    only_cc: tuple[int, ...] = ()
    # Compiled and audited, never executed (no such GPU has run it): kept out of bench,
    # profile "all" and the rule validation matrix, refused when named.
    never_run: bool = False
    # SASS opcode families the compiled kernel must NOT use (the path it replaces).
    absent: tuple[str, ...] = ()
    # How arguments are passed (ABIS); "tensormap" stages also declare their TMA boxes.
    abi: str = "pointers"
    tma_boxes: Callable[[Params], TmaBoxes] | None = None
    # Persistent kernel: the launch caps grid x (the tile count) at the multiprocessors
    # (for a cluster launch, at the co-resident clusters times the cluster size).
    persistent: bool = False
    # With persistent: launch the fewest CTAs that take the tiles in the same rounds
    # (tensormap.balanced_grid), every CTA an equal share, instead of one per multiprocessor.
    balanced: bool = False
    # CTAs per thread-block cluster, along x (a cuLaunchKernelEx launch attribute).
    cluster: int = 1
    # The values `perfscope tune` searches (None: the stage is not tunable).
    space: SearchSpace | None = field(default=None, compare=False)
    # Finding codes of the parent stage that this stage's change addresses: the rows of
    # the calibration table (predicted by the parent's estimates, measured by bench).
    addresses: tuple[str, ...] = ()
    notes: str = field(default="", compare=False)
    # Why the stage keeps its defaults where a configuration in its space is faster (a
    # ladder step that shows the problem its child fixes): the review page says this
    # instead of asking to change the default.
    kept_default: str = field(default="", compare=False)
    # The change acts only where the tiles make at least this many rounds of the persistent
    # grid's CTAs (0: everywhere): below it the stage runs its parent's path, and the
    # calibration shows its step there without counting it.
    min_rounds: float = 0.0
    # The layout B is handed to the kernel in (kernels/weights.py): "row-major" (K x N, the
    # matrix every reference reads) or "strips64" (hgemm_small_m_packed: 64-column strips,
    # packed once per weight by Prepared.weight before any launch is timed).
    weight_layout: str = ROW_MAJOR
    # The folder the source and its local headers are compiled from: perfscope's kernels, or
    # a patched copy of them (benchmarks/tail_split_probe.py adds timer probes to one).
    kernel_dir: Path = field(default=KERNEL_DIR, compare=False)

    @property
    def is_reference(self) -> bool:
        """Whether this is a cuBLAS reference rather than a stage of ours."""
        return self.family == "cublas"

    @property
    def label(self) -> str:
        """"compiled, never run" for stages no GPU has executed; "" otherwise."""
        return NEVER_RUN_LABEL if self.never_run else ""

    def check_arch(self, arch: str) -> None:
        """Refuse a compile target the stage's instructions do not exist on (one sentence)."""
        cc = int(arch[3:].rstrip("af"))
        if cc < self.min_cc:
            raise PerfscopeError(
                f"{self.name} needs compute capability {self.min_cc / 10:.1f} or newer, not {arch}")
        if self.only_cc and arch not in self.archs:
            raise PerfscopeError(
                f"{self.name} is built only for {', '.join(self.archs)} (its instructions exist "
                f"on no other target), not {arch}")

    @property
    def param_dict(self) -> dict[str, int]:
        """The template parameters as a fresh dict, in declaration order."""
        return dict(self.params)

    def with_params(self, **overrides: int) -> KernelSpec:
        """The same stage with some template parameters changed (names must exist)."""
        known = self.param_dict
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise PerfscopeError(
                f"{self.name} has no template parameter {', '.join(unknown)}; its parameters "
                f"are {', '.join(known) or 'none'}")
        known.update({k: int(v) for k, v in overrides.items()})
        return replace(self, params=tuple(known.items()))

    def name_expression(self, dtype: str) -> str:
        """The C++ name NVRTC instantiates, e.g. ``sgemm_smem<float, 32>``."""
        if self.entry is None:
            raise PerfscopeError(f"{self.name} is a library call and has no CUDA source")
        args = ", ".join([DTYPES[dtype], *(str(v) for _, v in self.params)])
        return f"{self.entry}<{args}>"

    def block_dims(self) -> tuple[int, int, int]:
        """The thread block's (x, y, z) at the stage's parameters."""
        if self.block is None:
            raise PerfscopeError(f"{self.name} is a library call and has no launch geometry")
        return self.block(self.param_dict)

    def block_threads(self) -> int:
        """Threads per block."""
        x, y, z = self.block_dims()
        return x * y * z

    def grid_dims(self, shape: Shape) -> tuple[int, int, int]:
        """The grid's (x, y, z) for a shape at the stage's parameters."""
        if self.grid is None:
            raise PerfscopeError(f"{self.name} is a library call and has no launch geometry")
        return self.grid(self.param_dict, shape)

    def boxes(self) -> TmaBoxes:
        """The TMA boxes of A, B and C at the stage's parameters (tensor-map stages only)."""
        if self.tma_boxes is None:
            raise PerfscopeError(f"{self.name} takes pointers, not tensor maps")
        return self.tma_boxes(self.param_dict)

    def dynamic_smem_bytes(self) -> int:
        """Dynamic shared memory the launch asks for, in bytes."""
        return self.dynamic_smem(self.param_dict)

    def static_smem_bytes(self) -> int:
        """Shared memory the kernel declares statically, in bytes."""
        return self.static_smem(self.param_dict)

    def check_dtype(self, dtype: str) -> None:
        """Refuse, in one sentence, a dtype the stage has no instantiation for."""
        if dtype not in self.dtypes:
            raise PerfscopeError(
                f"{self.name} does not support dtype {dtype}; it takes {', '.join(self.dtypes)}")

    def check_shape(self, shape: Shape) -> None:
        """Refuse, in one sentence, a shape one of the stage's constraints rules out."""
        if shape.batch > 1 and not self.batched:
            raise PerfscopeError(
                f"{self.name} runs one GEMM a launch, not a batch: the shape {shape} asks for "
                f"{shape.batch}; give MxNxK (batched shapes run on cublas_sgemm, cublas_hgemm "
                "and cublas_bgemm)")
        for c in self.constraints:
            c.check(self.name, shape)

    def source_path(self) -> Path:
        """The stage's CUDA source file (library calls have none)."""
        if self.source is None:
            raise PerfscopeError(f"{self.name} is a library call and has no CUDA source")
        return self.kernel_dir / self.source
