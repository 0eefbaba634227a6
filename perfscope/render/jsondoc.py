"""JSON: every document perfscope prints as JSON is made here, and only here.

Schemas, versioned by name (a field that changes bumps the version):

- ``perfscope.diagnose/2`` (``diagnose --json``, ``perfscope.to_json``)::

        {
          "schema": "perfscope.diagnose/2",
          "warnings": [str],            # one per report file cut short
          "machine_settings": [str],    # launch attributes equal on every launch: the machine's
          "failures": [str],            # what --fail-on found, one per kernel
          "kernels": [
            {
              "name": str, "demangled": str, "mangled": str, "source": str,
              "launch_index": int,      # the ID of FILE#ID
              "incomplete": str|null,   # why its report file is cut short
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
              "parked": [{address, opcode, file, line, samples, passes, warps_per_cta,
                          reasons: [[r, n]], addresses: [int]}],   # profile.Parked
              "ncu_rules": [{identifier, section, title, type, message (plain text),
                             speedup_pct, speedup_type, links: [[label, url]]}],
              "launch_id": "FILE#ID",           # these five when rules were evaluated
              "headroom": {fraction, bound, t_ns, t_min_ns, t_math_ns, t_bytes_ns, flops,
                           flops_source, bytes, bytes_source, dtype, dtype_source,
                           path_fraction, path, t_path_ns,     # path: mma.sync on Hopper
                           t_floor_ns}|null,   # memory-bound: fixed time + bytes at the copy rate
              "combined_gain": float|null, "reference_cap": float|null,
              "severity_notes": [str],
              "findings": [FINDING],
              "rules_not_evaluated": [{code, title, reason}],  # likewise
              "operand_reads": [{operand, rows, row_bytes, box_rows, box_row_bytes, layout,
                                 run_bytes}]|null   # the run's TMA boxes: own stages' planned,
                                                    # a program's as captured (--tensor-maps)
            }
          ]
        }

        TRAFFIC = {actual, ideal, excess, excess_pct,
                   by_opcode: [{opcode, kind, instructions, actual, ideal, excess, ratio}]}
        FINDING = {code, tag, title, severity, estimated_gain (fraction of kernel time|null),
                   evidence: [{metric, value, threshold}], fix, reference,
                   ncu_rule (str|null), ncu_speedup_pct (float|null),
                   raw_gain (the rule's own estimate before the caps), capped_by
                   ("headroom"|"headroom on PATH"|"reference gap"|"gap to the floor"|
                    "empty launch's time"|null),
                   bounded_gain (the estimate under the work's roofline, an empty launch's
                   time and, for memory-bound work, its floor, before the reference gap),
                   cost (what the symptom costs now where that is not what the fix saves,
                   e.g. PS153's idle share; null: the estimate)}

    Every value the report lacks is null.

- ``perfscope.diff/1`` (``diff --json``): ``a``/``b`` (label, report, name, demangled,
  manifest, hotspots), ``fields`` (every gateable number), ``time``/``sol``/``memory``/
  ``launch``/``loop`` rows ``{name, a, b, ratio}`` (``loop``: the main loops, empty unless
  both reports have per-instruction execution counts), ``stalls`` (each reason's share of
  the stall cycles with parked warps left out), ``parked`` (their share of each side's
  samples), ``families``, ``only_a``/``only_b``,
  ``new_findings``/``gone_findings`` (FINDING), ``verdict`` (each with its ``kind``),
  ``improved``, ``gap``, ``remaining``, ``structure`` (launch aspects A/B), ``warnings``,
  ``gate_failures``.
- ``perfscope.bench`` (``bench --json``): the bench file ``bench --out FILE``
  writes (``kind``, ``version``, ``environment``, ``manifests``: one run manifest each), so
  the printed document reads back as a bench file.
- ``perfscope.rules/1`` (``rules --json``): one row per rule.
- ``perfscope.sass/1`` (``sass --json``): one object per audited kernel.
- ``perfscope.kernels/1`` (``kernels --json``): one row per stage.
- ``perfscope.tune/1`` (``tune --json``, ``tune/results.json``): see ``tune_document``;
  ``TuneDocument.read`` / ``from_dict`` (perfscope.documents) read it back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from perfscope.documents import TUNE_SCHEMA
from perfscope.families import FAMILY_BY_KEY
from perfscope.manifest import BenchFile
from perfscope.profile import KernelProfile, Traffic
from perfscope.record import machine_notes

if TYPE_CHECKING:
    from perfscope.diff import DiffDocument, ProfileDiff, Row
    from perfscope.documents import AuditDocument, BenchSummary, KernelsTable, SassAudit, TuneDocument
    from perfscope.record import Diagnosed, DiagnoseDocument
    from perfscope.rules import RuleTable

DIAGNOSE_SCHEMA = "perfscope.diagnose/2"
DIFF_SCHEMA = "perfscope.diff/1"


def dumps(data: Any) -> str:
    """JSON text with NaN refused: a number perfscope did not measure is null, never NaN."""
    return json.dumps(data, indent=1, allow_nan=False, default=_refuse) + "\n"


def _refuse(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# ------------------------------------------------------------------------ diagnose


def _traffic(t: Traffic) -> dict[str, Any]:
    return {
        "actual": t.actual, "ideal": t.ideal, "excess": t.excess, "excess_pct": t.excess_pct,
        "by_opcode": [{**dataclasses.asdict(o), "excess": o.excess, "ratio": o.ratio}
                      for o in t.by_opcode],
    }


def kernel_dict(kp: KernelProfile) -> dict[str, Any]:
    """One launch's profile in the diagnose schema (findings aside)."""
    ident = dataclasses.asdict(kp.identity)
    stalls = kp.stalls
    mem = dataclasses.asdict(kp.memory)
    mem.pop("global_")
    mem["shared"] = _traffic(kp.memory.shared)
    mem["global"] = _traffic(kp.memory.global_)
    return {
        "name": kp.name, "demangled": ident.pop("demangled"), "mangled": ident.pop("mangled"),
        "source": ident.pop("source"), "launch_index": kp.identity.launch_index,
        "incomplete": kp.identity.incomplete, "duration_ns": kp.sol.duration_ns,
        "identity": {k: v for k, v in ident.items() if k not in ("name", "launch_index", "incomplete")},
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
        "parked": [{**dataclasses.asdict(p), "reasons": [list(r) for r in p.reasons],
                    "addresses": list(p.addresses)}
                   for p in kp.parked],
        "ncu_rules": [dataclasses.asdict(r) for r in kp.ncu_rules],
    }


def finding_dict(f: Any) -> dict[str, Any]:
    """One finding as JSON-ready values."""
    return {
        "code": f.code, "tag": f.tag, "title": f.title, "severity": f.severity,
        "estimated_gain": f.estimated_gain,
        "evidence": [{"metric": e.metric, "value": e.value, "threshold": e.threshold}
                     for e in f.evidence],
        "fix": f.fix, "reference": f.reference,
        "ncu_rule": f.ncu_rule, "ncu_speedup_pct": f.ncu_speedup_pct,
        "raw_gain": f.raw_gain, "capped_by": f.capped_by, "bounded_gain": f.bounded_gain,
        "cost": f.cost,
    }


def headroom_dict(h: Any) -> dict[str, Any] | None:
    """A kernel's headroom and the work and peaks it is bounded by, as JSON-ready values."""
    if h is None:
        return None
    w = h.work
    return {"fraction": h.fraction, "bound": h.bound, "t_ns": h.t_ns, "t_min_ns": h.t_min_ns,
            "t_math_ns": h.t_math_ns, "t_bytes_ns": h.t_bytes_ns, "flops": w.flops,
            "flops_source": w.flops_source, "bytes": w.bytes, "bytes_source": w.bytes_source,
            "dtype": w.dtype, "dtype_source": w.dtype_source,
            "path_fraction": h.path_fraction, "path": h.path, "t_path_ns": h.t_path_ns,
            "t_floor_ns": getattr(h, "t_floor_ns", None)}


def record_dict(r: Diagnosed) -> dict[str, Any]:
    """One record: its profile, findings and the rules it could not evaluate."""
    d = kernel_dict(r.profile)
    e = r.evaluation
    d["launch_id"] = r.launch_id
    d["untrusted"] = r.untrusted
    d["headroom"] = headroom_dict(e.headroom)
    d["combined_gain"] = e.combined_gain
    d["reference_cap"] = e.reference_cap
    d["severity_notes"] = list(e.notes)
    d["findings"] = [finding_dict(f) for f in e.findings]
    d["rules_not_evaluated"] = [dataclasses.asdict(n) for n in e.not_evaluated]
    d["operand_reads"] = None if r.reads is None else [
        {**dataclasses.asdict(o), "run_bytes": o.run_bytes} for o in r.reads]
    return d


def profiles_document(profiles: Sequence[KernelProfile]) -> dict[str, Any]:
    """The diagnose document of bare profiles (no rules evaluated): the Python API's."""
    return {"schema": DIAGNOSE_SCHEMA, "warnings": _incomplete(profiles),
            "kernels": [kernel_dict(kp) for kp in profiles]}


def _incomplete(profiles: Sequence[KernelProfile]) -> list[str]:
    return list(dict.fromkeys(kp.identity.incomplete for kp in profiles if kp.identity.incomplete))


def diagnose_document(records: Sequence[Diagnosed]) -> dict[str, Any]:
    """The diagnose document of records: every kernel with its findings, and the warnings."""
    return {"schema": DIAGNOSE_SCHEMA, "warnings": _incomplete([r.profile for r in records]),
            "machine_settings": list(machine_notes(records)),
            "kernels": [record_dict(r) for r in records]}


def _diagnose(doc: DiagnoseDocument) -> str:
    return dumps({**diagnose_document(doc.records), "failures": list(doc.failures)})


# ---------------------------------------------------------------------------- diff


def diff_document(diff: ProfileDiff, gate_failures: Sequence[str] = ()) -> dict[str, Any]:
    """The diff as JSON-ready data (schema perfscope.diff/1)."""
    def side(s: Diagnosed) -> dict[str, Any]:
        m = s.manifest
        return {"label": s.label, "report": str(s.path), "name": s.profile.name,
                "demangled": s.profile.identity.demangled,
                "manifest": None if m is None else {"stage": m.stage, "dtype": m.dtype,
                                                    "shape": m.shape},
                "hotspots": [dataclasses.asdict(h) for h in s.profile.hotspots[:5]]}

    def rows(rs: Sequence[Row]) -> list[dict[str, Any]]:
        return [{"name": r.name, "a": r.a, "b": r.b, "ratio": r.ratio} for r in rs]

    return {
        "schema": DIFF_SCHEMA, "a": side(diff.a), "b": side(diff.b),
        "fields": diff.fields(), "time": rows(diff.time), "sol": rows(diff.sol),
        "memory": rows(diff.memory), "launch": rows(diff.launch), "loop": rows(diff.loop),
        "stalls": [dataclasses.asdict(s) | {"delta": s.delta} for s in diff.stalls],
        "parked": {"a": diff.a.profile.parked_share, "b": diff.b.profile.parked_share},
        "unit": diff.unit, "families": [dataclasses.asdict(f) for f in diff.families],
        "only_a": list(diff.only_a), "only_b": list(diff.only_b),
        "new_findings": [finding_dict(f) for f in diff.new_findings],
        "gone_findings": [finding_dict(f) for f in diff.gone_findings],
        "verdict": [dataclasses.asdict(r) for r in diff.verdict],
        # improved: A takes fewer cycles, and the verdict says what it improved (shares of
        # B's time); remaining: A's own findings then; gap: the cycle gap the verdict spreads.
        "improved": diff.improved, "gap": diff.gap,
        "remaining": [dataclasses.asdict(r) for r in diff.remaining],
        "structure": [dataclasses.asdict(x) for x in diff.structure],
        "warnings": list(diff.warnings),
        # How much of the time ratio is the clock, where the SM clocks differ by 2% or more.
        "clock": diff.clock,
        "family_labels": {k: FAMILY_BY_KEY[k].label for k in FAMILY_BY_KEY},
        "gate_failures": list(gate_failures),
    }


def _diff(doc: DiffDocument) -> str:
    return dumps(diff_document(doc.diff, doc.gate_failures))


# -------------------------------------------------------------------------- tables


def _rules(doc: RuleTable) -> str:
    return dumps([{"code": r.code, "tag": r.tag, "severity": r.severity, "title": r.title,
                   "metrics": list(r.metrics), "fix": r.fix, "source": r.reference,
                   "nsight_compute": list(r.ncu), "thresholds": dict(r.thresholds),
                   "doc": r.doc} for r in doc.rules])


def audit_dict(a: SassAudit) -> dict[str, Any]:
    """One static audit as JSON-ready values."""
    r = a.resources
    return {
        "target": a.target, "kind": a.kind, "arch": a.arch, "kernel": a.kernel,
        "dtype": a.dtype, "label": a.label, "change": a.change,
        "disassembler": {"tool": a.tool.name, "path": str(a.tool.path), "origin": a.tool.origin},
        "compiler": a.compiler,
        "resources": r.to_dict() if r is not None else None,
        "cubin_resources": {"registers": a.sass.registers, "shared": a.sass.shared_bytes,
                            "stack": a.sass.stack_bytes, "local": a.sass.local_bytes},
        "dynamic_smem": a.dynamic_smem,
        "instructions": sum(a.sass.opcodes.values()),
        "families": {k: {"count": sum(v.values()), "opcodes": v} for k, v in a.families.items()},
        "fingerprint": [{"family": c.family, "forbidden": c.forbidden, "count": c.count, "ok": c.ok,
                         "opcodes": list(c.opcodes)} for c in a.fingerprint],
        "fingerprint_ok": a.fingerprint_ok,
        "findings": [finding_dict(f) for f in a.evaluation.findings],
        "not_evaluated": [dataclasses.asdict(n) for n in a.evaluation.not_evaluated],
        "silent": list(a.evaluation.silent),
        "notes": list(a.notes),
        **({"listing": {"total_samples": a.listing.total_samples, "note": a.listing.note,
                        "hot_share": a.listing.hot_share,
                        "ffma_dispatch": (dataclasses.asdict(a.listing.ffma_dispatch)
                                          if a.listing.ffma_dispatch is not None else None),
                        "rows": [dataclasses.asdict(r) for r in a.listing.rows]}}
           if a.listing is not None else {}),
    }


def _audit(doc: AuditDocument) -> str:
    return dumps([audit_dict(a) for a in doc.audits])


def _kernels(doc: KernelsTable) -> str:
    return dumps([dataclasses.asdict(row) for row in doc.rows])


def _bench(doc: BenchSummary) -> str:
    env = next((m.environment for m in doc.manifests if m.environment is not None), None)
    return dumps(dataclasses.asdict(BenchFile(manifests=doc.manifests, environment=env)))


def tune_document(doc: TuneDocument) -> dict[str, Any]:
    """``tune --json`` (schema perfscope.tune/1): a result per (stage, dtype, shape) with every
    trial, best first (ratio: the spread of the round ratios to cuBLAS, null when not timed),
    the pruned configurations with their reasons, the best-vs-worst ncu diff, the geometric
    means, the run's times and its environment. ``TuneDocument.from_dict`` reads it back to an
    equal document (the derived ``best``, ``compile_speedup`` and ``geomeans`` are recomputed)."""
    def result(r: Any) -> dict[str, Any]:
        d = dataclasses.asdict(r)
        d["pruned"] = [{"config": label, "reason": why} for label, why in r.pruned]
        d["best"] = dataclasses.asdict(r.best) if r.best is not None else None
        return d

    return {"schema": TUNE_SCHEMA, "store": doc.store, "command": doc.command,
            "environment": dict(doc.environment),
            "stats": {**dataclasses.asdict(doc.stats), "compile_speedup": doc.stats.compile_speedup},
            "geomeans": [{"stage": s, "dtype": d, "geomean": g, "shapes": n, "at_least_1": at}
                         for s, d, g, n, at in doc.geomeans()],
            "results": [result(r) for r in doc.results], "notes": list(doc.notes)}


def _tune(doc: TuneDocument) -> str:
    return dumps(tune_document(doc))


RENDERERS: dict[str, Callable[..., str]] = {
    "diagnose": _diagnose, "diff": _diff, "rules": _rules, "audit": _audit, "kernels": _kernels,
    "bench": _bench, "tune": _tune,
}
