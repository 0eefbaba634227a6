"""Exports of KernelProfiles: a long pandas DataFrame and a versioned JSON document.

JSON schema (``perfscope.diagnose/1``), written down here and in README.md::

    {
      "schema": "perfscope.diagnose/1",
      "kernels": [
        {
          "name": str, "demangled": str, "mangled": str, "source": str,
          "duration_ns": float|null,
          "identity": {grid, block, cluster, device, compute_capability, sm_count,
                       sm_clock_hz, cycles, mem_clock_hz, reader_version, range_index,
                       action_index},
          "sol": {duration_ns, sm_pct, memory_pct, dram_pct, l1tex_pct, l2_pct},
          "stalls": {"reasons": [{reason, cycles_per_issue, samples, share}],
                     selected_cycles_per_issue, total_samples, eligible_warps_per_cycle,
                     issue_active_pct},
          "memory": {"shared": TRAFFIC, "global": TRAFFIC, bank_conflicts_ld,
                     bank_conflicts_st, l1_hit_rate_pct, l2_hit_rate_pct,
                     local_load_requests, local_store_requests, local_load_bytes,
                     local_store_bytes, spill_instructions},
          "launch": {registers_per_thread, shared_static_bytes, shared_dynamic_bytes,
                     shared_driver_bytes, block_size, grid_size, cluster_size,
                     theoretical_occupancy_pct, achieved_occupancy_pct, occupancy_limiter,
                     occupancy_limits, waves_per_sm},
          "opcodes": {opcode: count}, "opcodes_with_modifiers": {opcode: count},
          "opcode_families": {family: count},
          "hotspots": [{address, sass, opcode, file, line, samples, reasons: [[r, n]]}],
          "ncu_rules": [{identifier, section, title, type, message, speedup_pct,
                         speedup_type}],
          "findings": [FINDING],            # present when rules were evaluated
          "rules_not_evaluated": [{code, title, reason}]   # likewise
        }
      ]
    }

    TRAFFIC = {actual, ideal, excess, excess_pct,
               by_opcode: [{opcode, kind, instructions, actual, ideal, excess, ratio}]}
    FINDING = {code, tag, title, severity, estimated_gain (fraction of kernel time|null),
               evidence: [{metric, value, threshold}], fix, reference,
               ncu_rule (str|null), ncu_speedup_pct (float|null)}

Every value the report lacks is null.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from perfscope.profile import KernelProfile, Traffic

SCHEMA = "perfscope.diagnose/1"


def _traffic(t: Traffic) -> dict[str, Any]:
    return {
        "actual": t.actual, "ideal": t.ideal, "excess": t.excess, "excess_pct": t.excess_pct,
        "by_opcode": [{**dataclasses.asdict(o), "excess": o.excess, "ratio": o.ratio}
                      for o in t.by_opcode],
    }


def kernel_dict(kp: KernelProfile) -> dict[str, Any]:
    ident = dataclasses.asdict(kp.identity)
    stalls = kp.stalls
    mem = dataclasses.asdict(kp.memory)
    mem.pop("global_")
    mem["shared"] = _traffic(kp.memory.shared)
    mem["global"] = _traffic(kp.memory.global_)
    return {
        "name": kp.name, "demangled": ident.pop("demangled"), "mangled": ident.pop("mangled"),
        "source": ident.pop("source"), "duration_ns": kp.sol.duration_ns,
        "identity": {k: v for k, v in ident.items() if k != "name"},
        "sol": dataclasses.asdict(kp.sol),
        "stalls": {
            "reasons": [{**dataclasses.asdict(s), "share": stalls.share(s.reason)}
                        for s in stalls.reasons],
            "selected_cycles_per_issue": stalls.selected_cycles_per_issue,
            "total_samples": stalls.total_samples,
            "eligible_warps_per_cycle": stalls.eligible_warps_per_cycle,
            "issue_active_pct": stalls.issue_active_pct,
        },
        "memory": mem,
        "launch": {**dataclasses.asdict(kp.launch),
                   "occupancy_limits": dict(kp.launch.occupancy_limits)},
        "opcodes": dict(kp.opcodes.executed),
        "opcodes_with_modifiers": dict(kp.opcodes.with_modifiers),
        "opcode_families": dict(kp.opcodes.families),
        "hotspots": [{**dataclasses.asdict(h), "reasons": [list(r) for r in h.reasons]}
                     for h in kp.hotspots],
        "ncu_rules": [dataclasses.asdict(r) for r in kp.ncu_rules],
    }


def to_json(profiles: Sequence[KernelProfile],
            findings: Sequence[Sequence[dict[str, Any]]] | None = None,
            not_evaluated: Sequence[Sequence[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The JSON document of the module docstring; findings and not_evaluated align with
    profiles."""
    kernels = []
    for i, kp in enumerate(profiles):
        d = kernel_dict(kp)
        if findings is not None:
            d["findings"] = list(findings[i])
        if not_evaluated is not None:
            d["rules_not_evaluated"] = list(not_evaluated[i])
        kernels.append(d)
    return {"schema": SCHEMA, "kernels": kernels}


def to_dataframe(profiles: Iterable[KernelProfile]):  # -> pandas.DataFrame
    """Every raw metric of every launch, long: kernel, launch, source, metric, value, unit.

    ``launch`` is the kernel's position in its report, so two launches of one kernel in
    one report stay apart.
    """
    import pandas as pd

    rows = []
    for kp in profiles:
        key = (kp.name, f"{kp.identity.range_index}:{kp.identity.action_index}", kp.identity.source)
        for metric, (value, unit) in kp.metrics.items():
            rows.append((*key, metric, value, unit))
    return pd.DataFrame(rows, columns=["kernel", "launch", "source", "metric", "value", "unit"])
