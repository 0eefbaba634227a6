"""Diagnosed: the one record every consumer of a profiled launch reads.

    Diagnosed(label, path, profile, manifest, evaluation, stage, dtype)

The loader (:mod:`perfscope.diagnosis`) builds it; diff, review, the exports and the
renderers read it. Nothing here touches a report file, the registry or the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from perfscope.manifest import RunManifest
from perfscope.profile import KernelProfile
from perfscope.rules import Evaluation
from perfscope.stage import StageInfo


@dataclass(frozen=True)
class Diagnosed:
    """One profiled launch: its profile, run manifest, stage, and the rules' evaluation."""

    label: str
    path: Path
    profile: KernelProfile
    manifest: RunManifest | None
    evaluation: Evaluation
    stage: StageInfo | None = None
    dtype: str | None = None

    @property
    def flops(self) -> int | None:
        m = self.manifest
        return 2 * m.m * m.n * m.k if m is not None else None

    @property
    def shape(self) -> tuple[int, int, int] | None:
        m = self.manifest
        return (m.m, m.n, m.k) if m is not None else None

    @property
    def launch_id(self) -> str:
        """``FILE#ID``: how a user names exactly this launch again."""
        return f"{self.path}#{self.profile.identity.launch_index}"


@dataclass(frozen=True)
class Catalogue:
    """The stages a report can come from, by name (the registry's, as plain values)."""

    stages: Mapping[str, StageInfo]

    def get(self, name: str | None) -> StageInfo | None:
        return self.stages.get(name) if name else None

    def names_longest_first(self) -> tuple[str, ...]:
        # "sgemm_reg8x8_capped" must win over its prefix "sgemm_reg8x8".
        return tuple(sorted(self.stages, key=len, reverse=True))


@dataclass(frozen=True)
class DiagnoseDocument:
    """What `perfscope diagnose` shows: the records, one panel each or one row each."""

    records: tuple[Diagnosed, ...]
    full: bool = True              # panels (True) or one summary row per kernel
    kind: str = "diagnose"
