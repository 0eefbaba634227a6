"""Small-M GEMMs judged by bandwidth: the panels of the fused page, read from a fused check.

A decode-shaped GEMM (M of 16-256 rows against an N x K weight) streams the weight through
DRAM; its speed is the bandwidth its compulsory bytes (each operand read once, C written
once, the epilogue's bias and residual) reach, against the device-to-device copy bandwidth
measured in the same run, not TFLOP/s. ``benchmarks/fused_check.py`` times every candidate
(the fused stages, cuBLAS + an elementwise pass, torch, cuBLASLt's GELU_BIAS) per shape and
records both, and (from 2026-12-01) a read of the same weight timed the same way (the
faster of plain 16-byte loads and bulk copies): the practical ceiling at that size, launch
and ramp included, which a 1 GiB copy is not for a 32 MiB weight read in tens of
microseconds. This module turns its JSON (schema
perfscope.fused_check/1, plain or .xz) into one panel per (dtype, shape) with M <=
SMALL_M_MAX, for the fused page to draw.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path

from perfscope.errors import PerfscopeError

SCHEMA = "perfscope.fused_check/1"
# Its name beside the fused reports (benchmarks/fused_check.py's output, xz-compressed).
FUSED_CHECK = "fused_check.json.xz"
# The shapes drawn: the small-M set (M of 16, 64 and 256).
SMALL_M_MAX = 256
# Issue 19's bar for M <= 64: this share of the measured copy bandwidth.
TARGET_SHARE = 0.90
# The unfused reference a fused stage is held against (cuBLAS, then an elementwise pass).
UNFUSED = "cublas+elementwise"


@dataclass(frozen=True)
class BandwidthPoint:
    """One candidate at one shape: its compulsory bytes over its median time."""

    label: str
    kind: str                 # "fused" (perfscope's stages) or "baseline"
    gbps: float | None        # None when it was wrong or not timed
    share_of_copy: float | None
    verdict: str
    share_of_stream: float | None = None   # of the same-size read; None in older checks
    # The layout the candidate took B in (kernels/weights.py): "row-major", as every
    # reference, or "strips64", packed once outside the timing (a changed input contract).
    weight: str = "row-major"

    @property
    def packed(self) -> bool:
        """Whether the candidate took its weight in a layout of its own, not row-major."""
        return self.weight != "row-major"


@dataclass(frozen=True)
class BandwidthPanel:
    """Every candidate of one (dtype, M x N x K) against the copy bandwidth of the run."""

    dtype: str
    m: int
    n: int
    k: int
    epilogue: str
    copy_gbps: float | None   # None only from row_panel without a copy measured
    compulsory_bytes: float
    points: tuple[BandwidthPoint, ...]
    stream_gbps: float | None = None   # the weight read alone at this size (None: not timed)

    @property
    def title(self) -> str:
        """``bf16 64x8192x8192 bias+gelu``."""
        return f"{self.dtype} {self.m}x{self.n}x{self.k} {self.epilogue}"

    @property
    def best_fused(self) -> BandwidthPoint | None:
        """perfscope's fastest candidate here that reads B as the references do (row-major),
        if one was right and timed."""
        return self._best(packed=False)

    @property
    def best_packed(self) -> BandwidthPoint | None:
        """perfscope's fastest candidate that takes B packed in a layout of its own
        (hgemm_small_m_packed), shown apart: its input contract is not the references'."""
        return self._best(packed=True)

    def _best(self, packed: bool) -> BandwidthPoint | None:
        timed = [p for p in self.points
                 if p.kind == "fused" and p.gbps is not None and p.packed == packed]
        return max(timed, key=lambda p: p.gbps) if timed else None

    def stream_bound(self, label: str = UNFUSED) -> float | None:
        """The speedup over candidate `label` of a kernel whose compulsory bytes move at the
        same-size read's rate: a practical bound for a kernel timed this way (the read pays
        the launch and the ramp on the weight's bytes alone; a kernel that moves more can
        spread them a little thinner); None without the read, or the candidate right and
        timed."""
        rival = next((p for p in self.points if p.label == label and p.gbps is not None), None)
        if rival is None or not self.stream_gbps:
            return None
        return self.stream_gbps / rival.gbps


def _load(path: Path) -> dict:
    try:
        if path.suffix == ".xz":
            with lzma.open(path) as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
        doc = json.loads(raw)
    except (OSError, lzma.LZMAError, ValueError) as exc:
        raise PerfscopeError(f"cannot read the fused check {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise PerfscopeError(f"{path} is not a fused check (schema {SCHEMA})")
    return doc


def row_panel(row: dict, copy_gbps: float | None) -> BandwidthPanel:
    """One shape's timing row of a fused check (its "timing" list) as a panel; with no copy
    bandwidth measured, no share of it (copy_gbps and share_of_copy None)."""
    stream = (row.get("stream") or {}).get("gbps")
    points = []
    for label, c in (row.get("candidates") or {}).items():
        ok = c.get("verdict") == "OK" and c.get("compulsory_gbps") is not None
        gbps = float(c["compulsory_gbps"]) if ok else None
        points.append(BandwidthPoint(label, c.get("kind", "baseline"), gbps,
                                     gbps / copy_gbps if gbps is not None and copy_gbps else None,
                                     c.get("verdict", "not timed"),
                                     gbps / stream if gbps is not None and stream else None,
                                     c.get("weight", "row-major")))
    return BandwidthPanel(row["dtype"], row["m"], row["n"], row["k"], row.get("epilogue", ""),
                          float(copy_gbps) if copy_gbps else None,
                          float(row.get("compulsory_bytes") or 0.0), tuple(points),
                          float(stream) if stream else None)


def read_panels(path: str | Path) -> tuple[BandwidthPanel, ...]:
    """The small-M panels of a fused check, in its order; none when it timed no small M."""
    doc = _load(Path(path))
    copy = (doc.get("copy_bandwidth") or {}).get("gbps")
    if not copy:
        raise PerfscopeError(f"{path} holds no copy bandwidth to judge small-M shapes against")
    return tuple(row_panel(row, copy) for row in doc.get("timing") or []
                 if row.get("m", SMALL_M_MAX + 1) <= SMALL_M_MAX)
