"""The tensor maps a program's kernels were launched with, as the program encoded them.

A report holds no tensor map, so for a kernel perfscope did not write it cannot say how
the TMA boxes lay over the operands. `perfscope profile --tensor-maps -- COMMAND` preloads
`native/mapcapture.c` into the program; it writes one JSON line per map the program encoded
and passed by value to a launch, and one per such launch (which parameter, at which byte, held
which map). This module reads those lines into values the run manifest keeps
(:class:`KernelMaps`: a kernel, its launch shape, and the maps each of its parameters held)
and turns a launch's maps into the :class:`~perfscope.stage.OperandRead` the rules read.

A kernel is matched to the report's launches by its mangled name, grid and block. Where the
program launched one kernel at one launch shape with maps of different geometry (a decode
step at several sequence lengths), the launch cannot be told apart and its reads stay unknown.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perfscope.stage import OperandRead

# CUtensorMapDataType (cuda.h): the element's name and bytes. The packed sub-byte formats
# (16U4, 16U6) have no whole-byte element and are left out: their reads stay unknown.
DATA_TYPES: dict[int, tuple[str, int]] = {
    0: ("u8", 1), 1: ("u16", 2), 2: ("u32", 4), 3: ("s32", 4), 4: ("u64", 8), 5: ("s64", 8),
    6: ("fp16", 2), 7: ("fp32", 4), 8: ("fp64", 8), 9: ("bf16", 2), 10: ("fp32", 4),
    11: ("tf32", 4), 12: ("tf32", 4),
}
# CUtensorMapSwizzle (cuda.h): the swizzle span in bytes (the 128-byte atom variants as 128).
SWIZZLE_BYTES = {0: 0, 1: 32, 2: 64, 3: 128, 4: 128, 5: 128, 6: 128}
CAPTURE_LAYOUT = "as encoded"


@dataclass(frozen=True)
class TensorMap:
    """One cuTensorMapEncodeTiled call's geometry (its address left out: the same map over
    other memory reads the same way). dims, box and elem_strides are innermost first;
    strides are the byte strides of dims 1.. (dimension 0 is contiguous)."""

    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    elem_strides: tuple[int, ...] = ()
    swizzle: int = 0
    interleave: int = 0

    @property
    def element(self) -> tuple[str, int] | None:
        """(name, bytes) of the element type, None for a packed sub-byte one."""
        return DATA_TYPES.get(self.dtype)

    def describe(self) -> str:
        """'bf16 8192 x 8192' (outermost first, as a matrix is named)."""
        name = self.element[0] if self.element else f"type {self.dtype}"
        return f"{name} {' x '.join(str(d) for d in reversed(self.dims))}"

    def read(self, operand: str) -> OperandRead | None:
        """How a box over this map reads memory, as an OperandRead: its contiguous run is the
        box's innermost row, extended over the next dimension while the box spans a whole,
        dense one. None where that is not a run of rows (one dimension, elements skipped,
        interleaved layouts, sub-byte types)."""
        el = self.element
        rank = len(self.dims)
        if (el is None or rank < 2 or len(self.strides) != rank - 1 or len(self.box) != rank
                or any(s != 1 for s in self.elem_strides) or self.interleave):
            return None
        width = el[1]
        run, level = self.box[0] * width, 0
        # A box spanning a whole dense dimension continues into the next one.
        while (level + 1 < rank and self.box[level] == self.dims[level]
               and self.strides[level] == run):
            run *= self.box[level + 1]
            level += 1
        if level + 1 >= rank:      # each box is one piece: whole slices of the outermost dimension
            piece = run // self.box[-1]
            return OperandRead(operand, self.dims[-1], piece, self.box[-1], piece, CAPTURE_LAYOUT)
        row_bytes = self.strides[level]
        extent = self.dims[-1] * self.strides[-1]
        return OperandRead(operand, max(1, extent // row_bytes), row_bytes,
                           math.prod(self.box[level + 1:]), run, CAPTURE_LAYOUT)

    @classmethod
    def from_dict(cls, d: dict) -> TensorMap:
        """A TensorMap from a capture line, or back from its dataclasses.asdict values."""
        return cls(int(d["dtype"]), tuple(int(x) for x in d["dims"]),
                   tuple(int(x) for x in d["strides"]), tuple(int(x) for x in d["box"]),
                   tuple(int(x) for x in d.get("elem_strides", ())), int(d.get("swizzle", 0)),
                   int(d.get("interleave", 0)))


@dataclass(frozen=True)
class MapUse:
    """A map a launch was passed: at which parameter, at which byte of it."""

    param: int
    offset: int
    map: TensorMap

    def label(self) -> str:
        """'parameter 1 (bf16 16 x 8192)', with the byte where the map sits inside a struct."""
        at = f" at byte {self.offset}" if self.offset else ""
        return f"parameter {self.param}{at} ({self.map.describe()})"


@dataclass(frozen=True)
class KernelMaps:
    """A kernel the program launched at one grid and block with these maps, and how often."""

    kernel: str                         # the mangled name the driver gave
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    maps: tuple[MapUse, ...]
    launches: int = 1

    def reads(self) -> tuple[OperandRead, ...] | None:
        """How the launch read memory by TMA, each map an operand (a kernel's output map is
        one too: a map does not say whether it is loaded or stored); None where one map's
        boxes are not rows (TensorMap.read)."""
        reads = tuple(u.map.read(u.label()) for u in self.maps)
        return None if any(r is None for r in reads) else reads

    @classmethod
    def from_dict(cls, d: dict) -> KernelMaps:
        """KernelMaps back from its dataclasses.asdict values (as the run manifest holds them)."""
        return cls(str(d["kernel"]), _triple(d["grid"]), _triple(d["block"]),
                   tuple(MapUse(int(u["param"]), int(u["offset"]), TensorMap.from_dict(u["map"]))
                         for u in d["maps"]), int(d.get("launches", 1)))


@dataclass(frozen=True)
class MapCapture:
    """What the capture library wrote for one run of a program."""

    kernels: tuple[KernelMaps, ...]
    truncated: bool = False             # a process wrote its most launch lines and stopped
    skipped_lines: int = 0              # lines that were not JSON (a process killed mid-line)
    unknown_maps: int = 0               # launch lines naming a map their process never described


def _triple(v: Sequence) -> tuple[int, int, int]:
    a, b, c = (int(x) for x in v)
    return a, b, c


def parse_capture(lines: Iterable[str]) -> MapCapture:
    """The capture library's JSON lines, as the kernels and maps they name (launches with
    the same kernel, launch shape and maps counted together, in first-seen order).

    A line cut short (a process killed mid-write) is skipped and counted, and so is a launch
    naming a map its process never described (the library describes each map before the
    first launch that passes it, so only a damaged file holds one)."""
    encodes: dict[tuple[int, int], TensorMap] = {}
    seen: Counter[tuple] = Counter()
    order: list[tuple] = []
    truncated, skipped, unknown = False, 0, 0
    for line in lines:
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            pid = int(d["pid"])
            if "encode" in d:
                encodes[pid, int(d["encode"])] = TensorMap.from_dict(d)
            elif "launch" in d:
                named = [(int(p), int(o), (pid, int(i))) for p, o, i in d["maps"]]
                if any(key not in encodes for _, _, key in named):
                    unknown += 1
                    continue
                uses = [MapUse(p, o, encodes[key]) for p, o, key in named]
                key = (str(d["kernel"]), _triple(d["grid"]), _triple(d["block"]), tuple(uses))
                if key not in seen:
                    order.append(key)
                seen[key] += 1
            elif "truncated" in d:
                truncated = True
        except (ValueError, KeyError, TypeError):
            skipped += 1
    kernels = tuple(KernelMaps(k, g, b, u, seen[(k, g, b, u)]) for k, g, b, u in order)
    return MapCapture(kernels, truncated, skipped, unknown)


def reads_for(kernels: Sequence[KernelMaps], mangled: str,
              grid: tuple[int, int, int] | None,
              block: tuple[int, int, int] | None) -> tuple[OperandRead, ...] | None:
    """The reads of a report's launch from the captured kernels: those of the kernel with
    its name, grid and block, when the program passed it maps of one geometry only; None
    where it passed none, or several that the launch cannot be told apart by."""
    found = {km.maps for km in kernels if km.kernel == mangled and km.grid == grid
             and km.block == block}
    if len(found) != 1:
        return None
    (maps,) = found
    return KernelMaps(mangled, grid or (0, 0, 0), block or (0, 0, 0), maps).reads()
