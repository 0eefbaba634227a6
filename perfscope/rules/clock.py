"""The clock a kernel runs at: a tensor-core GEMM that keeps its pipe busy runs at the power cap.

ncu leaves the clocks as found (perfscope profiles with ``--clock-control none``), so the SM
clock it measures over a kernel (cycles over duration) is the clock the kernel got. On the
H200 the GEMMs that keep the tensor pipe busy (cuBLAS, cuBLASLt, Triton, the Hopper stages)
run at 0.78-0.84 of the 1980 MHz maximum. The per-cycle figures say where their cycles go;
the clock says how much time those cycles take, and at the cap that is set by the energy the
work draws. Measured on the H200 (reports/reference/h200/power_probe.json): the persistent
Hopper stage at 4096^3 runs about the same cycles at 1798 MHz on all-zero inputs and at 1633
(bf16) or 1585 (fp16) MHz on random ones, taking 8-11% more time on those; a configuration
with 0.9% fewer cycles ran at a 1.1-1.5% lower clock and took 0.2-0.3% longer. The
instruction is not the limit: wgmma.m64n256k16 with no memory traffic issues 4096 FLOP per SM
cycle, the dense rating, at 1664 MHz (reports/reference/h200/wgmma_ceiling.json).
"""

from __future__ import annotations

from perfscope.metrics import M_SM_CLOCK, M_SM_CLOCK_MAX, M_TENSOR_PIPE
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

# -- thresholds --
# Below this share of the chip's maximum SM clock over the kernel, the clock was held down.
# On the H200 (reference run and external set, clocks as found): tensor GEMMs with the pipe
# 80-90% busy at 0.78-0.84; tensor kernels that keep it less busy (the mma.sync stages,
# decode GEMMs, a one-stage Triton kernel) at 0.88-0.92, where tensor work holds the clock
# near 1800 MHz even with power to spare (all-zero inputs reach the same 1798); FFMA kernels
# and elementwise passes at 0.98-1.00.
CLOCK_HELD_SHARE = 0.86
# A tensor pipe at least this busy (% of elapsed cycles) names the power limit as the cause;
# below it the fix text names the other causes a low clock has (heat, a profiler's lock).
# The held GEMMs above run their pipe 80-90% busy, the unheld tensor kernels 6-72%.
TENSOR_BUSY_CAUSE_PCT = 50.0


def _check_clock_held(inputs: Inputs) -> Hit | None:
    """Symptom: the SM clock over the kernel (ncu's cycles over its duration, clocks as
    found) is below 86% of the chip's maximum: on the H200, the tensor GEMMs that keep the
    pipe busy (0.78-0.84 of 1980 MHz), cuBLAS's among them.
    Why: the board holds its power under a limit by lowering the clock, so a kernel that
    draws the most power per cycle runs the fewest cycles per second. Its time is then its
    energy over the power limit rather than its cycles over a fixed clock: the other
    findings' estimates count cycles. At the cap a change pays in time as far as it spends
    less energy, or puts to work power the chip leaves unused (SMs idle through the last
    round: stream-K saved the 2-3% PS153 predicted at 8192^3, where the clock is capped
    lower still); a change that only trades cycles for the same energy buys less time than
    its cycles say, or none. (Under locked clocks, ncu's own default ``--clock-control
    base``, the clock reads low for that reason instead: perfscope profiles with ``none``
    and records it in the run manifest, and a manifest that says ``base`` leaves the rule
    not evaluated; a report with no manifest cannot say.)
    Fix: nothing to change in the kernel for the clock itself; judge a change by its time
    under ``perfscope bench`` (random inputs, clocks as found) rather than by its cycles,
    and compare kernels at the same clock conditions.
    Estimate: none: it is a condition of the machine, and what it costs depends on the
    energy of the data (the same kernel, about the same cycles, took 7.5-10% less time on zeros).
    Example:
        before: persistent stage, 4096^3 bf16, random inputs: 276,884 cycles at 1633 MHz, 174.9 us
        after:  the same kernel on all-zero inputs: 280,593 cycles at 1798 MHz, 161.7 us
    Source: seed 000 §5.1 (time the candidates, do not count their cycles); NCU Profiling
    Guide: Clock Control; benchmarks/power_probe.py, benchmarks/wgmma_ceiling.py."""
    m = inputs.manifest
    if m is not None and m.clock_control not in (None, "none"):
        raise NotCollected(f"the clock as found (the capture ran with --clock-control "
                           f"{m.clock_control}: ncu set the clock)")
    ident = inputs.profile.identity
    clock = need(ident.sm_clock_hz, M_SM_CLOCK)
    top = need(ident.sm_clock_max_hz, M_SM_CLOCK_MAX)
    share = clock / top
    if share >= CLOCK_HELD_SHARE:
        return None
    ev = [Evidence(f"SM clock over the kernel ({M_SM_CLOCK}, MHz)", round(clock / 1e6),
                   "-"),
          Evidence(f"the chip's maximum SM clock ({M_SM_CLOCK_MAX}, MHz)", round(top / 1e6), "-"),
          Evidence("clock over the kernel / maximum", round(share, 3), f"< {CLOCK_HELD_SHARE}")]
    busy = inputs.profile.metric(M_TENSOR_PIPE)
    if busy is not None:
        ev.append(Evidence(M_TENSOR_PIPE, round(busy, 1), "-"))
    cause = ("the tensor pipe busy, at the power limit"
             if busy is not None and busy >= TENSOR_BUSY_CAUSE_PCT
             else "the clock held down (power or heat, or clocks locked by the profiler)")
    return Hit(tuple(ev), None, (("mhz", f"{clock / 1e6:.0f}"), ("top", f"{top / 1e6:.0f}"),
                                 ("cause", cause)))


CLOCK_HELD = Rule(
    code="PS171", tag="clock-held", title="The SM clock runs well below its maximum (power cap)",
    severity="info",
    metrics=(M_SM_CLOCK, M_SM_CLOCK_MAX, M_TENSOR_PIPE),
    check=_check_clock_held,
    fix="The kernel ran at {mhz} MHz of the chip's {top} MHz ({cause}): its time is set by the "
        "energy it draws. A change pays as far as it spends less energy or puts idle SMs to "
        "work (the other findings' estimates count cycles); one that saves cycles for the same "
        "energy buys less time, or none (on the H200 a persistent-stage configuration with 0.9% "
        "fewer cycles ran at a 1.1-1.5% lower clock and took 0.2-0.3% longer). Judge changes by "
        "their time under perfscope bench (random inputs, clocks as found), not by cycles.",
    reference="NCU Profiling Guide: Clock Control; NVML: nvmlDeviceGetCurrentClocksEventReasons",
    thresholds=(("CLOCK_HELD_SHARE", CLOCK_HELD_SHARE),
                ("TENSOR_BUSY_CAUSE_PCT", TENSOR_BUSY_CAUSE_PCT)),
)

RULES = (CLOCK_HELD,)
