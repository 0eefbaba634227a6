"""What analysis knows of a stage and of its compile, as plain values (ground floor).

A report alone cannot say what a kernel was meant to be. For a ladder stage the loader
(:mod:`perfscope.diagnosis`) attaches a ``StageInfo`` built from the kernel registry and
the ``OperandRead`` of each operand its run loaded by TMA (from the tensor maps that run was
launched with), and the static audit attaches the compiler's ``ResourceUsage``; rules,
diffs and pages read these values and never import the registry or the compiler themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field


def at_defaults(params: Mapping[str, int], defaults: Mapping[str, int]) -> bool:
    """Whether a run's parameters are its stage's defaults. A parameter the record does not
    name counts as at its default: a template parameter added after the record was made
    (hopper.cu's DEFER) defaults to the kernel as it was, which tests/test_fused.py holds
    instruction for instruction against the committed source."""
    return all(k in defaults for k in params) and {**defaults, **params} == dict(defaults)


@dataclass(frozen=True)
class StageInfo:
    """One ladder stage as the analysis needs it: its place, its intent, its defaults."""

    name: str
    family: str                           # sgemm / hgemm / fused / blackwell / cublas
    dtypes: tuple[str, ...]
    change: str                           # what it changes against its parent, one sentence
    seed: str                             # the seed section it follows
    parent: str | None = None
    # The cuBLAS stage each dtype is held against (absent for the references themselves).
    references: Mapping[str, str] = field(default_factory=dict)
    # SASS opcode families the stage must use, and those it must not (the path it leaves).
    fingerprint: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    defaults: Mapping[str, int] = field(default_factory=dict)
    variant: bool = False
    archs: tuple[str, ...] = ()
    order: int = 0                        # position in the registry (ladder order)
    # Finding codes of the parent that this stage's change addresses (calibration).
    addresses: tuple[str, ...] = ()
    # Finding codes of the grandparent whose fix the parent's change began and this stage's
    # completes (calibration: a row from the grandparent, the parent's step shown, not counted).
    completes: tuple[str, ...] = ()
    notes: str = ""
    kept_default: str = ""                # why the defaults stay where a faster config exists
    # The change acts only where the tiles make at least this many rounds of the grid's
    # CTAs (0: everywhere); below it the stage runs its parent's path.
    min_rounds: float = 0.0

    def acts(self, tile_rounds: float | None) -> bool:
        """Whether the change acts at a launch whose tiles make `tile_rounds` rounds of its
        CTAs (unknown: assumed to act)."""
        return not self.min_rounds or tile_rounds is None or tile_rounds >= self.min_rounds

    @property
    def is_reference(self) -> bool:
        """Whether the stage is a cuBLAS reference."""
        return self.family == "cublas"

    @property
    def is_group(self) -> bool:
        """Whether the stage is a group of launches (cuBLAS, then an elementwise epilogue
        pass): its report holds every launch of the group, read as one side of a diff."""
        return self.is_reference and "ACT" in self.defaults

    def reference_for(self, dtype: str | None) -> str | None:
        """The cuBLAS stage this dtype is held against, None for none."""
        return self.references.get(dtype or "")

    def at_defaults(self, params: Mapping[str, int]) -> bool:
        """Whether ``params`` are this stage's defaults (module function at_defaults)."""
        return at_defaults(params, self.defaults)

    def params_note(self, params: Mapping[str, int]) -> str:
        """Parameters that differ from the defaults, as 'STAGES=3' (empty when none)."""
        return ", ".join(f"{k}={v}" for k, v in params.items() if self.defaults.get(k) != v)


@dataclass(frozen=True)
class ResourceUsage:
    """What ptxas reports for one entry function (bytes unless named otherwise)."""

    registers: int
    static_smem: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    barriers: int = 0
    cmem0: int = 0
    # ptxas's reason when it serialized the entry's wgmma pipeline (its "Potential
    # Performance Loss" info, C7515 and kin: every wgmma then waits for the one before); ""
    # when it did not.
    wgmma_serialized: str = ""

    @property
    def spills(self) -> bool:
        """Whether ptxas reported any spill store or load."""
        return self.spill_stores > 0 or self.spill_loads > 0

    def to_dict(self) -> dict[str, int | str]:
        """The usage as plain values, for the run manifest."""
        return asdict(self)


@dataclass(frozen=True)
class OperandRead:
    """How one run read an operand from global memory: TMA boxes over the matrix as it lay
    in memory (a packed weight's packed matrix), as its tensor map described them.

    Nsight Compute does not record a tensor map, so a report cannot say this; the loader
    plans it from the stage, its parameters and the shape (perfscope's own stages), or
    reads it from the maps `profile --tensor-maps` recorded (a program's kernels).
    """

    operand: str            # "A", "B" (the weight), or a program's "parameter 2 (bf16 ...)"
    rows: int               # rows of the matrix in memory
    row_bytes: int          # bytes from the start of one row to the next
    box_rows: int
    box_row_bytes: int      # bytes of one box row
    layout: str = "row-major"

    @property
    def bytes(self) -> int:
        """The matrix's bytes in memory (what one pass over it reads from DRAM)."""
        return self.rows * self.row_bytes

    @property
    def run_bytes(self) -> int:
        """Contiguous bytes one box reads in one piece: the whole box when a box row spans
        a matrix row, else one box row (the next lies row_bytes further on)."""
        if self.box_row_bytes >= self.row_bytes:
            return self.box_rows * self.row_bytes
        return self.box_row_bytes

    def describe(self) -> str:
        """'B: 64 x 128-byte boxes, rows 16384 bytes apart (row-major)'."""
        return (f"{self.operand}: {self.box_rows} x {self.box_row_bytes}-byte boxes, rows "
                f"{self.row_bytes} bytes apart ({self.layout})")
