"""The operands' layout: shapes and layouts that close a GEMM's fast path before it starts.

A library given rows it cannot address 16 bytes at a time, or 8-bit operands laid out
along N, does not fail: it runs a fallback kernel (cuBLAS's ``cutlass_75 ... align1`` at
4095^3, cuBLASLt's ``cutlass_80_wmma ... i8 ... nn`` for int8 with B row-major), several
times slower, and the counters then show the fallback's symptoms (narrow loads, mma.sync,
bank conflicts) whose fixes the caller cannot apply. What fixes them is the layout, and
the reference at the same shape and layout runs the same fallback, so these findings are
not held to the gap to it (perfscope.rules.engine).

The estimate is the gap to the work's practical tensor roof: its FLOPs at
TENSOR_PRACTICAL_SHARE of the dense peak of its math at the clock measured during the
kernel, the rate cuBLAS's aligned kernels reach (measured for 16-bit floats; assumed for
8-bit), bounded like every estimate by the headroom.
"""

from __future__ import annotations

from perfscope.hardware import ELEMENT_BYTES, TENSOR_PRACTICAL_SHARE, output_element_bytes
from perfscope.manifest import FP8_LAYOUT, LAYOUT, TN_LAYOUT
from perfscope.metrics import M_DURATION, OPCODE_METRICS
from perfscope.rules.bounds import headroom
from perfscope.rules.facts import family, need_opcodes, scalar_ldg_share
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

# -- thresholds --
# TMA's global strides, cp.async's 16-byte copies and LDG.128 all need 16-byte alignment.
ROW_ALIGN_BYTES = 16
# A fallback shows in its loads: this share of global loads or more no wider than 4 bytes.
NARROW_LOAD_SHARE = 0.5
# Below this gap to the practical roof the layout costs too little to name.
LAYOUT_GAP_MIN = 0.10


def _leading_dims(inputs: Inputs) -> dict[str, tuple[tuple[int, int], ...]] | None:
    """Per operand, the (leading dimension, bytes per element) its rows may have under the
    run manifest's layout: one candidate for a known layout, two (either major order) for
    a program's own; None without a manifest that knows the shape and element type."""
    m = inputs.manifest
    if m is None or not m.shape_known:
        return None
    elem = ELEMENT_BYTES.get(m.dtype or "")
    out = output_element_bytes(m.dtype)
    if elem is None or out is None:
        return None
    if m.layout == LAYOUT:
        return {"A": ((m.k, elem),), "B": ((m.n, elem),), "C": ((m.n, out),)}
    if m.layout in (FP8_LAYOUT, TN_LAYOUT):
        return {"A": ((m.k, elem),), "B": ((m.k, elem),), "C": ((m.n, out),)}
    return {"A": ((m.k, elem), (m.m, elem)), "B": ((m.n, elem), (m.k, elem)),
            "C": ((m.n, out), (m.m, out))}


def misaligned_rows(inputs: Inputs) -> list[Evidence] | None:
    """Evidence for each operand whose rows cannot start on 16-byte boundaries whichever
    of its possible layouts it has; an empty list when all can, None when the shape,
    element type or manifest is unknown."""
    dims = _leading_dims(inputs)
    if dims is None:
        return None
    out = []
    for name, candidates in dims.items():
        if all((ld * size) % ROW_ALIGN_BYTES for ld, size in candidates):
            ld, size = candidates[0]
            # "operand": in a diff, "A" and "B" also name the two kernels compared.
            out.append(Evidence(f"operand {name}'s rows: leading dimension {ld} x {size} bytes",
                                ld * size, f"not a multiple of {ROW_ALIGN_BYTES}"))
    return out


def _practical_gap(inputs: Inputs) -> tuple[float, list[Evidence]]:
    """1 - (the work's FLOPs at the practical tensor rate) / the duration, with evidence;
    NotCollected without the work's math roof."""
    p = inputs.profile
    room = need(headroom(inputs), "the kernel's roofline (its FLOPs and bytes)")
    t_math = need(room.t_math_ns, "the work's FLOPs at its math peak")
    kind = room.work.kind or "?"
    if not kind.startswith("tensor") and kind != "tf32":
        raise NotCollected("tensor-core work (the math this layout concerns)")
    t = need(p.sol.duration_ns, M_DURATION)
    t_practical = t_math / TENSOR_PRACTICAL_SHARE
    gap = max(0.0, 1 - t_practical / t)
    return gap, [
        Evidence(f"FLOPs at {TENSOR_PRACTICAL_SHARE} of the {kind} peak at the measured clock "
                 "(us)", round(t_practical / 1e3, 1), "what the aligned library kernels reach"),
        Evidence(f"kernel duration ({M_DURATION}, us)", round(t / 1e3, 1), "-"),
        Evidence("gap to that rate", round(gap, 3), f">= {LAYOUT_GAP_MIN}")]


def _check_unaligned_rows(inputs: Inputs) -> Hit | None:
    """Symptom: the GEMM's shape puts some operand's rows on addresses that are not
    multiples of 16 bytes whatever its layout (a bf16 matrix with 4095 columns: 8,190
    bytes a row), the kernel reads its operands in loads of 4 bytes or less and no TMA,
    and it runs well below the tensor rate aligned kernels reach.
    Why: TMA's global strides, cp.async's 16-byte copies and 16-byte vector loads all need
    16-byte alignment, so a library or compiler given such rows falls back to code that
    loads 2 or 4 bytes a lane (Triton's tiled kernel at K = 4095: 2-byte LDGs staged through
    STS.U16, 245 TFLOP/s where it runs 748 at 4096^3; cuBLAS at 4095^3 on an H100
    runs cutlass_75_tensorop ... align1, mma.sync with 2-byte loads, at 153 TFLOP/s, where
    it runs about 785 at 4096^3). The narrow-load, latency and mma.sync findings beside this
    one are that fallback's symptoms, and the reference at the same shape runs a fallback
    too.
    Fix: pad the leading dimensions to a multiple of 16 bytes (8 bf16/fp16 elements, 4
    fp32): allocate the padded width and compute on a view (C = A[:, :K] @ B[:K, :N] with
    A and B stored 4096 wide), or pad K with zeros; then TMA/wgmma kernels apply.
    Estimate: 1 - (FLOPs at 0.75 of the dense tensor peak at the measured clock) / the
    kernel's time: the rate cuBLAS's aligned kernels reach; not held to the gap to the
    reference, which has the same rows.
    Example:
        before: a = torch.randn(4095, 4095); c = a @ b       # 8,190-byte rows
        after:  a = torch.randn(4095, 4096)[:, :4095]       # rows 8,192 bytes apart
    Source: CUDA C++ Programming Guide: Tensor Memory Accelerator (globalStrides multiples
    of 16 bytes), Device Memory Accesses (size and alignment requirement); cuBLAS
    documentation: tensor-core usage and pointer/leading-dimension alignment."""
    p = inputs.profile
    need_opcodes(p)
    bad = misaligned_rows(inputs)
    if bad is None:
        raise NotCollected("the GEMM's shape and element type (run manifest, --shape --dtype)")
    if not bad or p.opcodes.has("tma"):
        return None
    narrow = scalar_ldg_share(p)
    if narrow is None or narrow < NARROW_LOAD_SHARE:
        return None
    gap, ev = _practical_gap(inputs)
    if gap < LAYOUT_GAP_MIN:
        return None
    return Hit((*bad,
                Evidence("global loads of <= 4 bytes / all global loads", round(narrow, 3),
                         f">= {NARROW_LOAD_SHARE}"),
                Evidence("TMA instructions", 0, "none: its strides must be multiples of 16 bytes"),
                *ev), gap)


UNALIGNED_ROWS = Rule(
    code="PS107", tag="unaligned-rows",
    title="Rows not 16-byte aligned: no 16-byte loads, copies or TMA for them",
    severity="warning",
    metrics=(*OPCODE_METRICS, M_DURATION),
    check=_check_unaligned_rows,
    fix="Pad the leading dimensions to a multiple of 16 bytes (8 fp16/bf16 elements, 4 fp32): "
        "store A and B that wide and compute on views of the real width, or pad K with zeros. "
        "TMA, 16-byte cp.async and vector loads then apply, and the narrow loads, latency and "
        "mma.sync findings of this kernel go with the fallback that has them.",
    reference="CUDA C++ Programming Guide: Tensor Memory Accelerator (globalStrides), Device "
              "Memory Accesses (alignment)",
    thresholds=(("ROW_ALIGN_BYTES", ROW_ALIGN_BYTES), ("NARROW_LOAD_SHARE", NARROW_LOAD_SHARE),
                ("LAYOUT_GAP_MIN", LAYOUT_GAP_MIN), ("TENSOR_PRACTICAL_SHARE", TENSOR_PRACTICAL_SHARE)),
)


def _check_operand_layout(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM on 8-bit operands (int8, fp8) whose B is laid out along N (the
    run manifest's row-major layout, B[K][N]) runs no warpgroup MMA (IGMMA/QGMMA), and well
    below the tensor rate.
    Why: wgmma takes 8-bit (and TF32) operands from shared memory K-major only (its
    transpose bits are for 16-bit types), and CUTLASS's and cuBLASLt's Hopper 8-bit kernels
    are TN only (A and B both K-major); given B[K][N] cuBLASLt runs an sm_80 WMMA kernel
    that transposes bytes through shared memory (torch._int_mm at 4096^3 on an H100:
    cutlass_80_wmma_tensorop_i161616gemm_s8 ... nn, 67M byte-wide shared loads, 128 TOPS,
    6% of the int8 peak). Its bank conflicts and mma.sync are that fallback's.
    Fix: store B K-major (transposed, N x K) once, as a weight usually can be, and pass its
    transpose view (torch._int_mm(a, bt.t()) with bt = b.t().contiguous()): the TN layout
    the 8-bit kernels take (there cuBLASLt ran an sm_80 IMMA m16n8k32 kernel at 849 TOPS,
    0.161 ms against 1.091: tests/fixtures/external/layout-fix-h100.json, torch_int8_tn).
    Estimate: 1 - (FLOPs at 0.75 of the 8-bit tensor peak at the measured clock) / the
    kernel's time (the share measured for 16-bit cuBLAS, assumed here); not held to the
    gap to the reference, which has the same layout.
    Example:
        before: c = torch._int_mm(a, w)            # w: K x N, N contiguous
        after:  c = torch._int_mm(a, wt.t())       # wt = w.t().contiguous(), made once
    Source: PTX ISA: wgmma.mma_async (matrix layouts: transpose only for .f16/.bf16);
    CUTLASS: functionality.md (sm_90a s8 and tf32 kernels: T x N layouts); cuBLASLt:
    cublasLtMatmul (8-bit kernels want A transposed and B not, "TN")."""
    p = inputs.profile
    need_opcodes(p)
    m = inputs.need_manifest()
    if ELEMENT_BYTES.get(m.dtype or "") != 1:
        return None
    if m.layout != LAYOUT:
        if m.layout in (FP8_LAYOUT, TN_LAYOUT):
            return None
        raise NotCollected("the operands' layout (a program's own: --shape says no layout)")
    fast = sum(n for op, n in p.opcodes.with_modifiers.items()
               if op.split(".")[0] in ("IGMMA", "QGMMA"))
    if fast:
        return None
    gap, ev = _practical_gap(inputs)
    if gap < LAYOUT_GAP_MIN:
        return None
    legacy = family(p, "hmma")
    return Hit((Evidence("element type (run manifest)", m.dtype, "8-bit"),
                Evidence("layout (run manifest)", m.layout, "B[K][N]: N-major"),
                Evidence("IGMMA/QGMMA instructions", 0, "none: the warpgroup path not taken"),
                Evidence("mma.sync (IMMA/HMMA) instructions", legacy, "-"),
                *ev), gap)


OPERAND_LAYOUT = Rule(
    code="PS108", tag="operand-layout",
    title="8-bit operands laid out along N: the fast path cannot read them",
    severity="warning",
    metrics=(*OPCODE_METRICS, M_DURATION),
    check=_check_operand_layout,
    fix="Give the 8-bit GEMM both operands K-major (the TN layout): store B transposed (N x K) "
        "once and pass its transpose view, so the library's tensor-core 8-bit kernels apply; "
        "the bank conflicts and mma.sync of this kernel go with the fallback that has them.",
    reference="PTX ISA: wgmma.mma_async (K-major operands for 8-bit types); cuBLASLt: "
              "cublasLtMatmul (TN for 8-bit kernels)",
    thresholds=(("LAYOUT_GAP_MIN", LAYOUT_GAP_MIN), ("TENSOR_PRACTICAL_SHARE", TENSOR_PRACTICAL_SHARE)),
)

RULES = (UNALIGNED_ROWS, OPERAND_LAYOUT)
