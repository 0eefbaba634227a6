"""A stage's configurations: the product of its declared values, pruned in two passes.

Before compiling, a configuration must satisfy its space's rules (the template's
static_asserts) and the limits every kernel has on the target: shared memory per block,
48 KiB of static shared memory, 1024 threads, TMA boxes of at most 256 elements per
dimension with a 128-byte inner row under the 128B swizzle. After compiling, ptxas has the
last word: a configuration that spills, that needs more registers than a block can hold,
or whose real static shared memory (ptxas's figure, not the spec's formula) breaks the
budget is pruned too. Every pruned configuration keeps its reason, in one clause.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perfscope.errors import PerfscopeError
from perfscope.hardware import ELEMENT_BYTES
from perfscope.kernels import REGISTRY, get_spec
from perfscope.kernels.spec import KernelSpec
from perfscope.stage import ResourceUsage

# Shared memory one block may opt into, by compute capability (CUDA programming guide,
# "Technical Specifications per Compute Capability"): 227 KiB on Hopper and Blackwell
# datacenter parts, 163 KiB on A100, 99 KiB on the consumer parts.
SMEM_PER_BLOCK: Mapping[int, int] = {
    75: 65536, 80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448,
    100: 232448, 103: 232448, 110: 232448, 120: 101376, 121: 101376,
}
STATIC_SMEM_LIMIT = 48 * 1024
MAX_THREADS = 1024
REGISTERS_PER_BLOCK = 65536
TMA_BOX_LIMIT = 256
# Every tensor map perfscope encodes uses the 128B swizzle, whose box row is at most 128 B.
SWIZZLE_ROW_BYTES = 128


@dataclass(frozen=True)
class Config:
    """One assignment of a stage's template parameters, in the stage's parameter order."""

    values: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, spec: KernelSpec, params: Mapping[str, int]) -> Config:
        """The stage's defaults with params laid over them."""
        merged = {**spec.param_dict, **params}
        return cls(tuple((name, int(merged[name])) for name, _ in spec.params))

    @classmethod
    def from_key(cls, spec: KernelSpec, key: str) -> Config:
        """The configuration a store key names."""
        return cls.of(spec, json.loads(key))

    @property
    def params(self) -> dict[str, int]:
        """The parameters as a dict."""
        return dict(self.values)

    @property
    def key(self) -> str:
        """The canonical text the store keys on: JSON with sorted names."""
        return json.dumps(dict(sorted(self.values)), separators=(",", ":"))

    @property
    def text(self) -> str:
        """Every parameter, as 'BM=128 BN=256 ...'."""
        return " ".join(f"{k}={v}" for k, v in self.values)

    def changed(self, defaults: Mapping[str, int]) -> dict[str, int]:
        """The parameters that differ from defaults."""
        return {k: v for k, v in self.values if defaults.get(k) != v}

    def label(self, defaults: Mapping[str, int]) -> str:
        """The parameters that differ from the stage's defaults ("default" when none)."""
        diff = self.changed(defaults)
        return " ".join(f"{k}={v}" for k, v in diff.items()) if diff else "default"


@dataclass(frozen=True)
class Limits:
    """What one target allows a block."""

    arch: str
    smem_per_block: int
    static_smem: int = STATIC_SMEM_LIMIT
    threads: int = MAX_THREADS
    registers: int = REGISTERS_PER_BLOCK


def arch_cc(arch: str) -> int:
    """The compute capability of a target: 90 for sm_90a."""
    return int(arch[3:].rstrip("af"))


def limits_for(arch: str, smem_per_block: int | None = None) -> Limits:
    """The limits of a compile target; smem_per_block as a GPU reported it, when known."""
    if smem_per_block is None:
        smem_per_block = SMEM_PER_BLOCK.get(arch_cc(arch), 49152)
    return Limits(arch=arch, smem_per_block=smem_per_block)


def tunable_names() -> tuple[str, ...]:
    """The stages that declare a search space."""
    return tuple(s.name for s in REGISTRY if s.space is not None)


def tunable_spec(name: str) -> KernelSpec:
    """The stage called name, refused in one sentence when it declares no search space."""
    spec = get_spec(name)
    if spec.space is None:
        raise PerfscopeError(f"{name} declares no search space; the stages perfscope can tune "
                             f"are {', '.join(tunable_names())}")
    return spec


def check_pins(spec: KernelSpec, pins: Mapping[str, int]) -> None:
    """Refuse a pinned parameter the stage lacks, or a value its space does not declare."""
    assert spec.space is not None
    for name, value in pins.items():
        if name not in spec.space.names:
            raise PerfscopeError(f"{spec.name} has no template parameter {name}; its parameters "
                                 f"are {', '.join(spec.space.names)}")
        allowed = spec.space.choices(name)
        if value not in allowed:
            raise PerfscopeError(f"{name}={value} is not in {spec.name}'s search space; {name} "
                                 f"takes {', '.join(str(v) for v in allowed)}")


def configurations(spec: KernelSpec, pins: Mapping[str, int] | None = None) -> tuple[Config, ...]:
    """Every configuration of the declared values, pinned parameters fixed and held ones at
    the stage's value unless pinned (not pruned)."""
    space = spec.space
    if space is None:
        raise PerfscopeError(f"{spec.name} declares no search space")
    pins = dict(pins or {})
    check_pins(spec, pins)
    defaults = spec.param_dict
    axes = [(name, (pins[name],) if name in pins
             else (defaults[name],) if name in space.held else vals)
            for name, vals in space.values]
    names = [name for name, _ in axes]
    return tuple(Config.of(spec, dict(zip(names, combo, strict=True)))
                 for combo in itertools.product(*(vals for _, vals in axes)))


def static_prune(spec: KernelSpec, config: Config, dtype: str, limits: Limits) -> str | None:
    """Why config cannot work before compiling it, in one clause; None when it may."""
    assert spec.space is not None
    p = config.params
    for rule in spec.space.rules:
        if not rule.holds(p):
            return rule.why
    s = spec.with_params(**p)
    threads = s.block_threads()
    if threads > limits.threads:
        return f"{threads} threads per block exceed the {limits.threads} a block may have"
    static = s.static_smem_bytes()
    if static > limits.static_smem:
        return (f"{static} bytes of static shared memory exceed the {limits.static_smem} a "
                "kernel may declare")
    smem = s.dynamic_smem_bytes() + static
    if smem > limits.smem_per_block:
        return (f"{smem} bytes of shared memory exceed the {limits.smem_per_block} a block may "
                f"opt into on {limits.arch}")
    if s.tma_boxes is not None:
        elem = ELEMENT_BYTES[dtype]
        for operand, box in zip("ABC", _boxes(s), strict=True):
            if max(box.rows, box.cols) > TMA_BOX_LIMIT:
                return (f"the TMA box of {operand} ({box.rows} x {box.cols}) exceeds "
                        f"{TMA_BOX_LIMIT} elements in a dimension")
            if box.cols * elem > SWIZZLE_ROW_BYTES:
                return (f"the TMA box of {operand} has {box.cols * elem}-byte rows, more than the "
                        f"{SWIZZLE_ROW_BYTES} the 128B swizzle takes")
    return None


def _boxes(spec: KernelSpec) -> Sequence:
    b = spec.boxes()
    return (b.a, b.b, b.c)


# How compiled_prune's reason for a spilling configuration begins (the tune's note counts them).
SPILL_REASON = "ptxas spills registers to local memory"


def compiled_prune(spec: KernelSpec, config: Config, usage: ResourceUsage,
                   limits: Limits, keep_spills: bool = False) -> str | None:
    """Why a compiled configuration cannot run well, from ptxas's report; None when fine.
    keep_spills measures one that spills rather than prune it (a few spilled bytes off the
    hot loop can cost nothing: fused/README.md has configurations of 4-52 spilled bytes
    0.3-0.8% faster than the best that spills none)."""
    s = spec.with_params(**config.params)
    if usage.spills and not keep_spills:
        return (f"{SPILL_REASON} ({usage.spill_stores} B stores, {usage.spill_loads} B loads)")
    threads = s.block_threads()
    if usage.registers * threads > limits.registers:
        return (f"{usage.registers} registers x {threads} threads exceed the {limits.registers} "
                "registers of a multiprocessor")
    if usage.static_smem > limits.static_smem:
        return (f"ptxas allocates {usage.static_smem} bytes of static shared memory, more than "
                f"{limits.static_smem}")
    smem = usage.static_smem + s.dynamic_smem_bytes()
    if smem > limits.smem_per_block:
        return (f"{smem} bytes of shared memory (ptxas's static plus the dynamic ring) exceed "
                f"the {limits.smem_per_block} a block may opt into on {limits.arch}")
    return None
