"""The layouts a stage may take its weight operand B in, and the one packing step.

Every reference (cuBLAS, cuBLASLt, the unfused groups) and every other stage reads B as the
row-major K x N matrix. ``hgemm_small_m_packed`` reads it in 64-column strips: strip t holds
B's columns 64t..64t+63 for all K rows (K zero-padded to whole 64-row k tiles, N to whole
strips), one strip after another, so each of its TMA boxes (64 k rows x 64 columns) is 8 KB of
contiguous memory instead of 64 rows of 128 bytes 2N bytes apart. A decode-shaped GEMM reads
a weight that does not change between calls: an inference engine packs it once when it loads
the model, as this module does once per operand before any launch is timed
(``Prepared.weight``), and the pack's cost is not part of a launch.

Pure array code: ``xp`` is numpy or cupy, so the CPU tests hold the layout the GPU runs.
"""

from __future__ import annotations

from typing import Any

from perfscope.errors import PerfscopeError

ROW_MAJOR = "row-major"
STRIPS64 = "strips64"
LAYOUTS = (ROW_MAJOR, STRIPS64)
# Columns per strip (one 128-byte swizzle atom of 16-bit elements) and the k-tile rows K is
# padded to (the stages' BK).
STRIP_COLS = 64
STRIP_K_ROWS = 64


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def strips_shape(k: int, n: int) -> tuple[int, int, int]:
    """(strips, padded K rows, columns per strip) of a K x N weight packed in strips."""
    return _ceil(n, STRIP_COLS), _ceil(k, STRIP_K_ROWS) * STRIP_K_ROWS, STRIP_COLS


def pack_strips(xp: Any, b: Any) -> Any:
    """B (K x N, row-major) as strips: out[t, k, c] = B[k, 64t + c], zero past K and N."""
    if b.ndim != 2:
        raise PerfscopeError(f"a weight to pack into strips is a K x N matrix, not an array of "
                             f"shape {tuple(b.shape)}")
    k, n = (int(d) for d in b.shape)
    strips, kp, cols = strips_shape(k, n)
    padded = xp.zeros((kp, strips * cols), dtype=b.dtype)
    padded[:k, :n] = b
    return xp.ascontiguousarray(padded.reshape(kp, strips, cols).transpose(1, 0, 2))


def unpack_strips(xp: Any, packed: Any, k: int, n: int) -> Any:
    """The K x N matrix back from its strips (for tests and checks)."""
    strips, kp, cols = (int(d) for d in packed.shape)
    return xp.ascontiguousarray(packed.transpose(1, 0, 2).reshape(kp, strips * cols)[:k, :n])


def weight_for(xp: Any, layout: str, b: Any) -> Any:
    """B as a stage of this layout takes it: itself (row-major) or packed into strips."""
    if layout == ROW_MAJOR:
        return b
    if layout == STRIPS64:
        return pack_strips(xp, b)
    raise PerfscopeError(f"unknown weight layout {layout!r}; perfscope knows {', '.join(LAYOUTS)}")


def check_weight(name: str, layout: str, b: Any, k: int, n: int) -> None:
    """Refuse, in one sentence, a B that is not in the layout the stage takes."""
    want = (k, n) if layout == ROW_MAJOR else strips_shape(k, n)
    got = tuple(int(d) for d in b.shape)
    if got != want:
        how = ("the row-major K x N matrix" if layout == ROW_MAJOR
               else "B packed into 64-column strips by Prepared.weight (kernels/weights.py)")
        raise PerfscopeError(f"{name} takes {how}, of shape {want}, not an array of shape {got}")
