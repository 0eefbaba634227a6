"""The tensor maps a TMA stage is launched with, planned as plain values (no GPU).

What ``cuTensorMapEncodeTiled`` is given for A, B and C but their addresses: dimensions,
row strides, boxes, element type and swizzle. :mod:`perfscope.kernels.tensormap` encodes
and launches with these plans; the analysis reads the same plans as ``OperandRead`` values
(how each operand's bytes leave DRAM: the contiguous run of one box row), so a rule can
judge a stream's access pattern from what the kernel was launched with, not from a copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from perfscope.errors import PerfscopeError
from perfscope.hardware import ELEMENT_BYTES
from perfscope.kernels.fused_specs import output_dtype
from perfscope.kernels.spec import FP8, KernelSpec, Shape, TmaBox
from perfscope.kernels.weights import ROW_MAJOR, STRIPS64, strips_shape
from perfscope.stage import OperandRead

# cuda.h's CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle,
# CUtensorMapL2promotion and CUtensorMapFloatOOBfill values: driver ABI, fixed since CUDA 12.0
# (tests/test_hopper.py holds them against cuda.bindings). Written out rather than read from
# cuda.bindings at import: its extension loaded before Nsight Compute's 2025.3 report reader
# crashes the reader's first string call on a GPU machine, and every profile imports this.
# CU_TENSOR_MAP_DATA_TYPE_*: FLOAT16 6, BFLOAT16 9; a quantised C is raw bytes (UINT8 0).
DATA_TYPE = {"fp16": 6, "bf16": 9, "fp8": 0, "int8": 0}
INTERLEAVE_NONE = 0
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
OOB_FILL_ZEROS = 0
# TMA limits (cuTensorMapEncodeTiled): box sides 1..256 elements; with 128B swizzle the
# inner box side is at most 128 bytes; global strides are multiples of 16 bytes.
MAX_BOX = 256
SWIZZLE_SPAN_BYTES = 128
STRIDE_ALIGN = 16


@dataclass(frozen=True)
class MapPlan:
    """Everything cuTensorMapEncodeTiled is given for one row-major 2-D matrix but its address."""

    operand: str           # "A", "B" or "C"
    dims: tuple[int, int]  # innermost first: (columns, rows)
    row_stride: int        # bytes
    box: tuple[int, int]   # innermost first: (box columns, box rows)
    data_type: int
    swizzle: int = SWIZZLE_128B
    l2_promotion: int = L2_PROMOTION_256B


def plan_map(operand: str, rows: int, cols: int, box: TmaBox, dtype: str) -> MapPlan:
    """The tensor map of a row-major rows x cols matrix of dtype, read in box tiles.

    Refuses in one sentence what the TMA unit cannot describe.
    """
    if dtype not in DATA_TYPE:
        raise PerfscopeError(f"tensor maps are built for fp16, bf16 and fp8 (and a one-byte C) "
                             f"here, not {dtype}")
    width = ELEMENT_BYTES[dtype]
    stride = cols * width
    if stride % STRIDE_ALIGN:
        raise PerfscopeError(
            f"{operand}'s rows are {stride} bytes apart, but TMA needs a multiple of "
            f"{STRIDE_ALIGN} bytes (a column count that is a multiple of "
            f"{STRIDE_ALIGN // width})")
    for side in (box.rows, box.cols):
        if not 1 <= side <= MAX_BOX:
            raise PerfscopeError(f"{operand}'s TMA box {box.rows}x{box.cols} has a side "
                                 f"outside 1..{MAX_BOX}")
    if box.cols * width > SWIZZLE_SPAN_BYTES:
        raise PerfscopeError(f"{operand}'s TMA box is {box.cols * width} bytes wide, "
                             f"more than the {SWIZZLE_SPAN_BYTES}-byte swizzle span")
    return MapPlan(operand, (cols, rows), stride, (box.cols, box.rows), DATA_TYPE[dtype])


def plan_maps(spec: KernelSpec, dtype: str, shape: Shape) -> tuple[MapPlan, MapPlan, MapPlan]:
    """The maps of A (M x K), B (K x N; fp8: Bt, N x K) and C (M x N) for a tensor-map
    stage (C in its own element type: one byte for a quantising stage, bf16 for fp8)."""
    boxes = spec.boxes()
    b_rows, b_cols = (shape.n, shape.k) if dtype == FP8 else (shape.k, shape.n)
    if spec.weight_layout == STRIPS64:
        # The strips one above another: a matrix of 64 columns (kernels/weights.py).
        strips, k_rows, b_cols = strips_shape(shape.k, shape.n)
        b_rows = strips * k_rows
    return (plan_map("A", shape.m, shape.k, boxes.a, dtype),
            plan_map("B", b_rows, b_cols, boxes.b, dtype),
            plan_map("C", shape.m, shape.n, boxes.c, output_dtype(spec, dtype)))


def operand_reads(spec: KernelSpec, dtype: str, shape: Shape) -> tuple[OperandRead, OperandRead]:
    """How a launch of a tensor-map stage reads A and B: its maps' matrices and boxes."""
    a, b = plan_maps(spec, dtype, shape)[:2]
    width = ELEMENT_BYTES[dtype]
    return tuple(OperandRead(plan.operand, plan.dims[1], plan.row_stride, plan.box[1],
                             plan.box[0] * width, layout)
                 for plan, layout in ((a, ROW_MAJOR), (b, spec.weight_layout)))


def operand_reads_of(spec: KernelSpec | None, params: Mapping[str, int], dtype: str | None,
                     shape: Shape) -> tuple[OperandRead, ...] | None:
    """operand_reads of a run at these parameters; None where the stage loads no operand by
    TMA, or where the run cannot be planned now (a parameter or dtype this tree's stage no
    longer has): the analysis then says the geometry is unknown, never guesses it."""
    if spec is None or spec.abi != "tensormap" or spec.tma_boxes is None or dtype is None:
        return None
    try:
        return operand_reads(spec.with_params(**params), dtype, shape)
    except (PerfscopeError, KeyError):
        return None
