"""SASS opcode families: what a GEMM engineer asks of an instruction mix (ground floor).

An executed-opcode histogram (from ncu) or a static one (from a disassembled cubin) is
grouped into families named after the PTX feature that produces them, so a report can
say "HGMMA (wgmma) and UTMALDG (TMA)" instead of listing forty opcodes. The table is
data: one row per family, the base opcodes it holds, and what they mean.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OpcodeFamily:
    """One row of the family table: its key, its label, the base opcodes it holds and what they mean."""

    key: str
    label: str
    opcodes: tuple[str, ...] = ()
    # Prefix match for opcode groups whose members grow with each architecture
    # (UTC*MMA: UTCHMMA, UTCQMMA, UTCIMMA ...).
    pattern: str | None = None
    meaning: str = ""

    def matches(self, base: str) -> bool:
        """Whether a base opcode belongs to the family, by name or by pattern."""
        if base in self.opcodes:
            return True
        return self.pattern is not None and re.fullmatch(self.pattern, base) is not None


FAMILIES: tuple[OpcodeFamily, ...] = (
    OpcodeFamily("ldg", "global load LDG", ("LDG",), meaning="ld.global"),
    OpcodeFamily("stg", "global store STG", ("STG",), meaning="st.global"),
    # DEPBAR is left out on purpose: it waits on any scoreboard (tcgen05.alloc's too), so
    # counting it here would credit cp.async to kernels that never issue one.
    OpcodeFamily("ldgsts", "async copy LDGSTS", ("LDGSTS", "LDGDEPBAR"),
                 meaning="cp.async (Ampere) and its commit groups"),
    OpcodeFamily("tma", "TMA UTMALDG/UTMASTG/UBLKCP",
                 ("UTMALDG", "UTMASTG", "UTMAPF", "UTMACCTL", "UTMAREDG", "UBLKCP", "UBLKRED",
                  "UBLKPF"),
                 meaning="cp.async.bulk(.tensor): the Tensor Memory Accelerator"),
    OpcodeFamily("ldsm", "ldmatrix LDSM", ("LDSM",), meaning="ldmatrix"),
    OpcodeFamily("stsm", "stmatrix STSM", ("STSM",), meaning="stmatrix"),
    OpcodeFamily("shared", "shared LDS/STS", ("LDS", "STS", "ATOMS", "LDSU"),
                 meaning="ld.shared / st.shared"),
    OpcodeFamily("hmma", "mma.sync HMMA", ("HMMA", "IMMA", "DMMA", "BMMA"),
                 meaning="mma.sync: warp-level tensor-core MMA (Volta..Ada path)"),
    OpcodeFamily("gmma", "wgmma HGMMA/QGMMA", ("HGMMA", "QGMMA", "IGMMA", "BGMMA", "WARPGROUP"),
                 meaning="wgmma.mma_async: warpgroup MMA (sm_90a)"),
    OpcodeFamily("utcmma", "tcgen05 UTC*MMA/UTCBAR", ("UTCBAR", "UTCATOMSWS"),
                 pattern=r"UTC[A-Z]*MMA",
                 meaning="tcgen05.mma / commit / tmem alloc (sm_100a)"),
    OpcodeFamily("tmem", "tensor memory LDTM/STTM", ("LDTM", "STTM"),
                 meaning="tcgen05.ld / tcgen05.st"),
    OpcodeFamily("ffma", "FFMA", ("FFMA", "FFMA2"), meaning="fp32 fused multiply-add"),
    OpcodeFamily("local", "local LDL/STL", ("LDL", "STL"),
                 meaning="local memory: register spills or indexed arrays"),
    OpcodeFamily("barrier", "barriers BAR/SYNCS", ("BAR", "SYNCS", "WARPSYNC", "MEMBAR", "ARRIVES"),
                 meaning="bar.sync, mbarrier (SYNCS), fences"),
    OpcodeFamily("setmaxreg", "USETMAXREG", ("USETMAXREG",), meaning="setmaxnreg (sm_90a)"),
    # A per-thread value moved into a uniform register: what a wgmma/tcgen05 descriptor or a
    # TMA coordinate built in per-thread registers costs (hgemm_small_m's k loop did two per
    # HGMMA until its descriptors were built uniform; cuBLAS's nvjet kernels issue none).
    OpcodeFamily("r2ur", "to uniform R2UR", ("R2UR",),
                 meaning="a per-thread register moved into a uniform one (descriptors, "
                         "TMA coordinates built per thread)"),
)

FAMILY_BY_KEY: Mapping[str, OpcodeFamily] = {f.key: f for f in FAMILIES}

# Which kind of shared-memory traffic an opcode is: cp.async writes land in shared
# memory too, and their excess means something else than a bank conflict on a load.
SHARED_KIND: Mapping[str, str] = {"LDS": "load", "LDSM": "load", "LDSU": "load", "STS": "store",
                                  "STSM": "store", "LDGSTS": "async-copy", "ATOMS": "atomic"}
GLOBAL_KIND: Mapping[str, str] = {"LDG": "load", "STG": "store", "LDGSTS": "async-copy",
                                  "ATOMG": "atomic", "RED": "atomic"}


def base_opcode(opcode: str) -> str:
    """``LDG.E.128.CONSTANT`` -> ``LDG``; a SASS line's predicate guard is dropped too."""
    op = opcode.strip()
    if op.startswith("@"):
        op = op.split(None, 1)[1] if " " in op else ""
    head = op.split(".", 1)[0].split(None, 1)
    return head[0] if head else ""


def family_of(opcode: str) -> str | None:
    """The family key an opcode (with or without modifiers) belongs to, or None."""
    base = base_opcode(opcode)
    for fam in FAMILIES:
        if fam.matches(base):
            return fam.key
    return None


def group_families(histogram: Mapping[str, float] | Iterable[tuple[str, float]]) -> dict[str, float]:
    """Sum an opcode histogram into families; families with no instruction are left out."""
    items = histogram.items() if isinstance(histogram, Mapping) else histogram
    out: dict[str, float] = {}
    for opcode, count in items:
        key = family_of(opcode)
        if key is not None and count:
            out[key] = out.get(key, 0.0) + float(count)
    return out
