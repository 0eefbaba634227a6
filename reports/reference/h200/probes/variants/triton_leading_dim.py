"""Triton's TMA matmul with A's rows 8,080 bytes apart against 8,192 apart. (2026-12-05)

    python3 PROBES/variants/triton_leading_dim.py time OUT.json
    python3 PROBES/variants/triton_leading_dim.py run ld4040|ld4096

The question of cublas_leading_dim.py asked of a third kernel, one without multicast and
with a ring as shallow as the persistent stage's: a Triton matmul whose A and B arrive
through device-side tensor descriptors (the external set's triton_tma configuration:
128 x 256 x 64 tiles, 3 stages, 8 warps), bf16 4096 x 4040 by 4040 x 4096. ``ld4040``
holds A contiguous (rows 8,080 bytes apart: their boxes' 128-byte rows straddle lines),
``ld4096`` the same values in a 4096-wide buffer, every row on a line. Same kernel (lda
is not specialised on, so both forms run one compiled kernel), same math, C bit-identical.
``time`` and ``run`` as in cublas_leading_dim.py (NVTX range ``<form>-bf16-4096x4096x4040``).
"""

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from cublas_leading_dim import K, M, N, run, time_both

TILE = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8)


# The external set's tma_matmul_kernel (benchmarks/external/workloads.py) with A's leading
# dimension a parameter (there it is K): kept apart, so that the external set's kernel stays
# the one its committed reports ran.
@triton.jit(do_not_specialize=["lda"])
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, lda, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[lda, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                       block_shape=[BLOCK_K, BLOCK_N])
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([tile_m * BLOCK_M, kt * BLOCK_K])
        b = b_desc.load([kt * BLOCK_K, tile_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    cm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + cm[:, None] * N + cn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(cm[:, None] < M) & (cn[None, :] < N))


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """One GEMM: a grid of one program per 128 x 256 tile, A's leading dimension as given."""
    grid = (triton.cdiv(M, TILE["BLOCK_M"]) * triton.cdiv(N, TILE["BLOCK_N"]),)
    _matmul[grid](a, b, c, M, N, K, a.stride(0), **TILE)


if __name__ == "__main__":
    triton.set_allocator(_scratch)
    if sys.argv[1] == "time":
        time_both(Path(sys.argv[2]), launch, {"triton": triton.__version__, "tile": TILE})
    else:
        run(sys.argv[2], launch)
