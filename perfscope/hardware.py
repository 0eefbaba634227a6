"""The hardware facts estimates are bounded by, each with where it was measured (ground floor).

Peak math rates are per multiprocessor per clock, so a roofline moves with the SM clock
measured during the kernel (clocks are left as found and differ from kernel to kernel).
Ceilings that a datasheet does not give (mma.sync's, the DRAM rate a copy reaches) were
measured on the H200 this project uses; the committed results are named beside each.
"""

from __future__ import annotations

from collections.abc import Mapping

# Dense peak FLOP per SM per clock, by compute capability and the math the work needs:
# "tensor16" is fp16/bf16 inputs on tensor cores with fp32 accumulation (sm_90: 989.4
# TFLOP/s at 1.83 GHz on 132 SMs is 4096 per SM-clock), "fp32" the FFMA pipe (128 lanes x 2).
PEAK_FLOP_PER_SM_CLOCK: Mapping[str, Mapping[str, int]] = {
    "9.0": {"tensor16": 4096, "tensor8": 8192, "tf32": 2048, "fp32": 256, "fp64": 128},
    "8.0": {"tensor16": 2048, "tensor8": 4096, "tf32": 1024, "fp32": 128, "fp64": 64},
}

# mma.sync (HMMA m16n8k16) on sm_90, measured with no memory traffic: 652 TFLOP/s bf16 at
# 1.98 GHz on 132 SMs (benchmarks/hmma_ceiling.py, tests/fixtures/external/hmma_ceiling.json),
# i.e. 2496 FLOP per SM-clock: 61% of what wgmma reaches on the same tensor cores.
HMMA_FLOP_PER_SM_CLOCK: Mapping[str, int] = {"9.0": 2496}

# The share of the dense peak the best library kernels reach on the H200 at the chip's
# 1980 MHz maximum clock (cuBLAS bf16/fp16 at 4096^3: 0.72-0.73 of 4096 FLOP/SM-clock; per
# cycle of the clock they run at, about 1.6 GHz at the power cap, 0.90: PS171) and the tensor
# pipe's busy share they sustain (89-90% of elapsed cycles): "practical" ceilings, not the
# datasheet. wgmma itself issues the full 4096 FLOP per SM cycle with no memory traffic
# (benchmarks/wgmma_ceiling.py, reports/reference/h200/wgmma_ceiling.json).
TENSOR_PRACTICAL_SHARE = 0.75
TENSOR_PIPE_PRACTICAL = 0.90
# The same pipe per *active* SM cycle (busy % x elapsed / sm__cycles_active.avg), which
# leaves out the last round's idle SMs: cuBLAS's nvjet at 4096^3 (bf16, fp16; the
# reference run and the external set) 96.0-96.4%, the persistent stage 94.2-94.9%.
TENSOR_PIPE_ACTIVE_PRACTICAL = 0.96

# A device-to-device copy reaches 4.27 TB/s on the H200 (benchmarks/copy_bandwidth.py,
# tests/fixtures/external/copy_bandwidth.json) of the 4.81 TB/s peak ncu reports
# (dram__bytes_read.sum.pct_of_peak_sustained_elapsed): 0.89 of peak in practice.
DRAM_PRACTICAL_SHARE = 0.89

# The shortest a kernel that reads DRAM lasts under ncu (gpu__time_duration), by compute
# capability: a launch's fixed time (its start, one round trip to DRAM, its drain), which a
# kernel of its own pays however few bytes it moves. Measured by benchmarks/kernel_floor.py
# (reports/reference/h200/probes/kernel-floor-h200*, 2026-12-05): on the H200 an empty kernel
# lasts 1.54 us, reads of 16 KiB to 2 MiB 2.53-3.10 us, and the line through its reads of
# 64 MiB to 1 GiB crosses zero bytes at 4.41 us (the stream's ramp on top; by CUDA events
# 4.17 us at 4.48 TB/s); the committed captures' shortest such launches last 2.72-2.88 us.
# On an H100 (kernel-floor-h100*) 2.11 us empty, 3.04-3.36 us for 16 KiB to 1 MiB. The least
# is taken, what merging a launch away saves at least.
KERNEL_FIXED_NS: Mapping[str, float] = {"9.0": 2500.0}

# The shortest any launch lasts under ncu (gpu__time_duration): an empty kernel of one CTA,
# which reads nothing (benchmarks/kernel_floor.py, probes/kernel-floor-h200 and -h100: 1,536
# ns on the H200, 2,112 ns on an H100). No change inside a kernel takes it below this, so it
# bounds every estimate but one that removes the launch (PS173's). By device name where
# measured, else by compute capability, the least of its devices.
EMPTY_KERNEL_NS_BY_DEVICE: Mapping[str, float] = {"NVIDIA H200": 1536.0,
                                                  "NVIDIA H100 80GB HBM3": 2112.0}
EMPTY_KERNEL_NS: Mapping[str, float] = {"9.0": 1536.0}


def empty_kernel_ns(device: str | None, cc: str | None) -> float | None:
    """An empty launch's time under ncu on this device (EMPTY_KERNEL_NS_BY_DEVICE), else
    the least measured for its compute capability; None where neither is measured."""
    return EMPTY_KERNEL_NS_BY_DEVICE.get(device or "", EMPTY_KERNEL_NS.get(cc or ""))

# Shared memory serves 32 banks of 4 bytes per SM clock (sm_80 to sm_90; CUDA C++
# Programming Guide, "Shared Memory" of the compute capabilities): what wgmma reads its
# shared operands from and what TMA writes the tiles into, one budget.
SMEM_BYTES_PER_SM_CLOCK = 128

# The L2 -> SM crossbar's peak into L1TEX / shared memory, sectors per SM clock, by compute
# capability: what l1tex__m_xbar2l1tex_read_sectors' share of peak is a share of. Measured on
# the H200 (the committed reference run): that share x 4 x l1tex__cycles_elapsed.sum gives
# 50,331,648 sectors for hgemm_tma_wgmma_persistent at 4096^3, exactly its 512 tiles' TMA
# bytes ((128 + 256) x 4096 x 2 each), and 22,020,608 for hgemm_small_m's paired 128 x 64
# tiles at 256 x 4096 x 14336 (22,020,096 of tiles, multicast ones counted in both CTAs, and
# 512 of bias loads).
XBAR_TO_L1_SECTORS_PER_SM_CLOCK: Mapping[str, int] = {"9.0": 4}

# Element sizes in bytes.
ELEMENT_BYTES: Mapping[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1,
                                   "int32": 4}
# The C a GEMM of an element type writes, where it is not that type: perfscope's fp8 GEMMs
# (kernels/fp8.py) take e4m3 inputs and write bf16, as cuBLASLt's FP8 GEMM does by default;
# an int8 GEMM accumulates and writes int32 (torch._int_mm, cuBLASLt's CUDA_R_32I C).
OUTPUT_DTYPE: Mapping[str, str] = {"fp8": "bf16", "int8": "int32"}


def output_element_bytes(dtype: str | None) -> int | None:
    """The size of one element of C in a GEMM of this (input) element type."""
    return ELEMENT_BYTES.get(OUTPUT_DTYPE.get(dtype or "", dtype or ""))


def math_kind(dtype: str | None) -> str | None:
    """Which peak a GEMM in this element type is held to: its fastest dense path."""
    return {"fp16": "tensor16", "bf16": "tensor16", "fp8": "tensor8", "int8": "tensor8",
            "fp32": "fp32"}.get(dtype or "")


def peak_flops(cc: str | None, kind: str | None, sm_count: int | None,
               sm_clock_hz: float | None) -> float | None:
    """Peak FLOP/s at the measured clock, None when the chip or the clock is unknown."""
    per = PEAK_FLOP_PER_SM_CLOCK.get(cc or "", {}).get(kind or "")
    if per is None or not sm_count or not sm_clock_hz:
        return None
    return per * sm_count * sm_clock_hz


def hmma_share(cc: str | None) -> float | None:
    """mma.sync's measured rate as a share of the dense tensor peak, where measured."""
    hmma = HMMA_FLOP_PER_SM_CLOCK.get(cc or "")
    dense = PEAK_FLOP_PER_SM_CLOCK.get(cc or "", {}).get("tensor16")
    return hmma / dense if hmma and dense else None
