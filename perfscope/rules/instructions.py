"""Instruction fingerprints: what a GEMM's SASS says about the path it took.

Nsight Compute judges one kernel at a time and cannot know that a Hopper GEMM built on
mma.sync and cp.async is on the wrong road while cuBLAS uses wgmma and TMA. These rules
read the executed opcode families (perfscope.families) and the chip, and name the
instruction and the compile target the fix needs.
"""

from __future__ import annotations

from perfscope.metrics import (
    CC_METRICS,
    M_OPCODES,
    OPCODE_METRICS,
)
from perfscope.rules.facts import (
    TENSOR_FAMILIES,
    arch_target,
    compute_capability,
    family,
    gap_to_reference,
    has_tensor_cores,
    need_opcodes,
)
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule

# -- thresholds --
# Chips where mma.sync (HMMA) is the legacy path: wgmma (sm_90) or tcgen05 (sm_100/103)
# is faster. On sm_80/86/89/120 mma.sync is the right instruction.
LEGACY_MMA_CHIPS = {(9, 0): "wgmma.mma_async (SASS HGMMA) on operands in shared memory",
                    (10, 0): "tcgen05.mma (SASS UTC*MMA) with the accumulator in tensor memory",
                    (10, 3): "tcgen05.mma (SASS UTC*MMA) with the accumulator in tensor memory"}
# TMA (cp.async.bulk.tensor) exists from sm_90 on.
TMA_MIN_MAJOR = 9
HALF_DTYPES = ("fp16", "bf16")

_FIX_PATH = {(9, 0): "wgmma.mma_async (HGMMA) fed by TMA", (10, 0): "tcgen05.mma (UTC*MMA)",
             (10, 3): "tcgen05.mma (UTC*MMA)"}


def _tensor_intended(inputs: Inputs) -> bool:
    stage = inputs.stage
    if stage is not None and any(k in TENSOR_FAMILIES for k in stage.fingerprint):
        return True
    dtype = inputs.dtype
    if dtype is None:
        raise NotCollected("the element type (run manifest or KernelSpec)")
    return dtype in HALF_DTYPES


def _check_no_tensor_cores(inputs: Inputs) -> Hit | None:
    """Symptom: an FP16/BF16 GEMM (by the manifest's dtype, or a spec that declares
    tensor-core instructions) executes FFMA and no HMMA/HGMMA/UTC*MMA at all.
    Why: dense FP16/BF16 tensor-core throughput is many times the FP32 FFMA peak on every
    chip since sm_70; FFMA math caps the kernel far below cuBLAS.
    Fix: mma.sync on sm_80-sm_89/sm_120, wgmma on sm_90a, tcgen05 on sm_100a/sm_103a.
    Estimate: the gap to cuBLAS measured in the run manifest, 1 - (stage TFLOP/s / cuBLAS
    TFLOP/s); None when the run was not timed.
    Source: seed 004 §1; seed 000 §4.1; PTX ISA: mma, wgmma, tcgen05."""
    p = inputs.profile
    need_opcodes(p)
    if not _tensor_intended(inputs) or has_tensor_cores(p) or not p.opcodes.has("ffma"):
        return None
    cc = compute_capability(p)
    path = _FIX_PATH.get(cc, "mma.sync.m16n8k16 with ldmatrix")
    gain, extra = gap_to_reference(inputs)
    return Hit((
        Evidence("FFMA instructions (sass__inst_executed_per_opcode)", family(p, "ffma"), "> 0"),
        Evidence("HMMA + HGMMA + UTC*MMA instructions", 0.0, "> 0 for FP16/BF16"),
        Evidence("element type", inputs.dtype or "declared by the stage", "fp16 or bf16"),
        *extra,
    ), gain, (("path", path), ("target", arch_target(cc))))


NO_TENSOR_CORES = Rule(
    code="PS140", tag="no-tensor-cores", title="FP16/BF16 math runs on FFMA, not tensor cores",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS),
    check=_check_no_tensor_cores,
    fix="Do the math on tensor cores with {path}, compiled for {target} "
        "(mma.sync works from sm_80; wgmma needs sm_90a, tcgen05 sm_100a/sm_103a).",
    reference="seed 004 §1; seed 000 §4.1; PTX ISA: Warp-level matrix instructions",
)


def _check_legacy_mma(inputs: Inputs) -> Hit | None:
    """Symptom: the main loop's MMA is mma.sync (SASS HMMA) on sm_90, sm_100 or sm_103,
    where HMMA outnumbers HGMMA and UTC*MMA.
    Why: on Hopper wgmma (HGMMA) and on datacenter Blackwell tcgen05 (UTC*MMA) are the
    full-rate tensor-core paths; an HMMA ladder cannot reach cuBLAS's nvjet kernels there
    (seed 000 §4.1, §6.3 row 5). On sm_80/86/89/120 mma.sync is the right path and this
    rule is silent.
    Fix: wgmma with TMA on sm_90a; tcgen05 with tmem on sm_100a/sm_103a.
    Estimate: the gap to cuBLAS from the run manifest, 1 - (stage TFLOP/s / cuBLAS
    TFLOP/s); None when the run was not timed.
    Source: seed 000 §4.1, §5.2, §6.3 row 5; PTX ISA: wgmma.mma_async, tcgen05.mma."""
    p = inputs.profile
    need_opcodes(p)
    cc = compute_capability(p)
    hmma = family(p, "hmma")
    if cc not in LEGACY_MMA_CHIPS or not hmma or hmma <= family(p, "gmma") + family(p, "utcmma"):
        return None
    gain, extra = gap_to_reference(inputs)
    return Hit((
        Evidence("HMMA instructions (mma.sync)", hmma, "> HGMMA + UTC*MMA"),
        Evidence("compute capability", f"{cc[0]}.{cc[1]}", "9.0, 10.0 or 10.3"),
        *extra,
    ), gain, (("path", LEGACY_MMA_CHIPS[cc]), ("target", arch_target(cc))))


LEGACY_MMA = Rule(
    code="PS141", tag="legacy-mma", title="mma.sync (HMMA) on a chip whose fast path is wgmma/tcgen05",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS),
    check=_check_legacy_mma,
    fix="Move the main loop to {path}, with A/B tiles brought in by TMA and a warp-specialised "
        "producer/consumer pipeline on mbarriers; compile for {target} (the arch-specific "
        "target: plain sm_90/sm_100 has no wgmma/tcgen05).",
    reference="seed 000 §4.1, §5.2, §6.3 row 5; PTX ISA: wgmma.mma_async, tcgen05.mma",
)


def _check_no_tma(inputs: Inputs) -> Hit | None:
    """Symptom: a tensor-core kernel on a chip with TMA (sm_90+) loads its tiles through
    LDGSTS (cp.async) or LDG and executes no TMA instruction (or its KernelSpec declares
    TMA and none ran).
    Why: per-thread copies spend issue slots, registers and address math that TMA does
    from one thread with hardware swizzling; cuBLAS's Hopper kernels use UTMALDG
    (seed 000 §3.2, §5.2: "your kernel still uses plain LDG").
    Fix: cp.async.bulk.tensor through a CUtensorMap with 128B swizzle, on mbarriers.
    Estimate: the gap to cuBLAS from the run manifest (1 - ratio); None when not timed.
    Source: seed 000 §3.2, §5.2, §6.3 row 5; CUDA Programming Guide: Tensor Memory
    Accelerator; PTX ISA: cp.async.bulk.tensor."""
    p = inputs.profile
    need_opcodes(p)
    cc = compute_capability(p)
    if cc[0] < TMA_MIN_MAJOR or not has_tensor_cores(p) or p.opcodes.has("tma"):
        return None
    copies = family(p, "ldgsts") + family(p, "ldg")
    declared = inputs.stage is not None and "tma" in inputs.stage.fingerprint
    if not copies and not declared:
        return None
    gain, extra = gap_to_reference(inputs)
    return Hit((
        Evidence("LDGSTS + LDG instructions", copies, "> 0 with tensor-core math"),
        Evidence("TMA instructions (UTMALDG/UBLKCP)", 0.0, "> 0 on sm_90+"),
        Evidence("compute capability", f"{cc[0]}.{cc[1]}", f">= {TMA_MIN_MAJOR}.0"),
        *extra,
    ), gain, (("target", arch_target(cc)),))


NO_TMA = Rule(
    code="PS142", tag="no-tma", title="Tensor-core tiles loaded per thread on a chip with TMA",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS, M_OPCODES),
    check=_check_no_tma,
    fix="Load the A/B tiles with TMA: encode CUtensorMaps (cuTensorMapEncodeTiled, 128B "
        "swizzle), issue cp.async.bulk.tensor from one thread per stage and complete each stage "
        "on an mbarrier (expect_tx); compile for {target}.",
    reference="seed 000 §3.2, §5.2, §6.3 row 5; PTX ISA: cp.async.bulk.tensor",
)

RULES = (NO_TENSOR_CORES, LEGACY_MMA, NO_TMA)
