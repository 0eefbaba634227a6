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

import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

M, N, K = 4096, 4096, 4040
ROUNDS, RUNS = 9, 20
TILE = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_stages=3, num_warps=8)


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


def operands() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Both forms of A (contiguous, and a view into a 4096-wide buffer) with one B."""
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    wide = torch.zeros(M, 4096, device="cuda", dtype=torch.bfloat16)
    wide[:, :K] = a
    return {"ld4040": (a, b), "ld4096": (wide[:, :K], b)}


def launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """One GEMM: a grid of one program per 128 x 256 tile."""
    grid = (triton.cdiv(M, TILE["BLOCK_M"]) * triton.cdiv(N, TILE["BLOCK_N"]),)
    _matmul[grid](a, b, c, M, N, K, a.stride(0), **TILE)


def _ms(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(RUNS):
        launch(a, b, c)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / RUNS


def time_both(out: Path) -> None:
    """Alternating rounds of the two forms; the medians and their ratio to OUT."""
    forms = operands()
    outs = {name: torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for name in forms}
    for name, (a, b) in forms.items():
        launch(a, b, outs[name])
    assert torch.equal(outs["ld4040"], outs["ld4096"]), "the two forms disagree"
    err = (outs["ld4096"].float() - forms["ld4096"][0].float() @ forms["ld4096"][1].float()).norm()
    c = outs["ld4040"]
    for a, b in forms.values():
        _ms(a, b, c)
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(ROUNDS):
        for name, (a, b) in forms.items():
            times[name].append(_ms(a, b, c))
    med = {name: statistics.median(t) for name, t in times.items()}
    row = {"shape": f"{M}x{N}x{K}", "dtype": "bf16", "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "tile": TILE, "ms": med,
           "rounds": times, "abs_fro_error_vs_fp32": float(err),
           "aligned_over_straddling": med["ld4040"] / med["ld4096"],
           "round_ratios": [x / y for x, y in zip(times["ld4040"], times["ld4096"], strict=True)]}
    out.write_text(json.dumps(row, indent=1))
    print(json.dumps({k: row[k] for k in ("ms", "aligned_over_straddling")}))


def run(form: str) -> None:
    """Two launches, then one inside the form's NVTX range."""
    a, b = operands()[form]
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        launch(a, b, c)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(f"{form}-bf16-{M}x{N}x{K}")
    launch(a, b, c)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    triton.set_allocator(_scratch)
    if sys.argv[1] == "time":
        time_both(Path(sys.argv[2]))
    else:
        run(sys.argv[2])
