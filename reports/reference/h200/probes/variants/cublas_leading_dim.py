"""cuBLAS with A's rows 8,080 bytes apart against the same A rows 8,192 bytes apart. (2026-12-05)

    python3 PROBES/variants/cublas_leading_dim.py time OUT.json
    python3 PROBES/variants/cublas_leading_dim.py run ld4040|ld4096

A kernel nobody here wrote, for rule PS106 (TMA box rows that straddle 128-byte lines):
torch.matmul (cuBLAS) of a bf16 4096 x 4040 A by a 4040 x 4096 B. ``ld4040`` holds A
contiguous, so its rows start 8,080 bytes apart and all but one in eight start inside a
128-byte line; ``ld4096`` is the same values in a 4096-wide buffer (a view with leading
dimension 4096, which cuBLAS takes as it is), every row on a line. Same math, same
values, only where A's rows start differs.

``time`` checks the two give the same C and times them in alternating rounds with CUDA events
(9 rounds of 20 launches after a warm-up), writing the medians and
``aligned_over_straddling`` (ld4040's time over ld4096's: above 1, the aligned rows are
faster). ``run`` launches one form twice, then once inside the NVTX range
``<form>-bf16-4096x4096x4040`` for `perfscope profile --nvtx <form>-bf16-4096x4096x4040/
--tensor-maps -- python3 ... run <form>`.
"""

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

M, N, K = 4096, 4096, 4040
ROUNDS, RUNS = 9, 20


def operands() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Both forms of A (contiguous, and a view into a 4096-wide buffer) with one B."""
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    wide = torch.zeros(M, 4096, device="cuda", dtype=torch.bfloat16)
    wide[:, :K] = a
    padded = wide[:, :K]
    assert padded.stride() == (4096, 1) and a.stride() == (K, 1)
    return {"ld4040": (a, b), "ld4096": (padded, b)}


Launch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]


def cublas(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """One GEMM through torch.matmul (cuBLAS), into c."""
    torch.matmul(a, b, out=c)


def _ms(launch: Launch, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(RUNS):
        launch(a, b, c)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / RUNS


def time_both(out: Path, launch: Launch = cublas, extra: dict | None = None) -> None:
    """Alternating rounds of the two forms (after checking their C is the same); the
    medians and their ratio to OUT, with ``extra`` (what else identifies the kernel)."""
    forms = operands()
    c = {name: torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for name in forms}
    for name, (a, b) in forms.items():
        launch(a, b, c[name])
    assert torch.equal(c["ld4040"], c["ld4096"]), "the two forms disagree"
    for name, (a, b) in forms.items():
        _ms(launch, a, b, c[name])
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(ROUNDS):
        for name, (a, b) in forms.items():
            times[name].append(_ms(launch, a, b, c[name]))
    med = {name: statistics.median(t) for name, t in times.items()}
    row = {"shape": f"{M}x{N}x{K}", "dtype": "bf16", "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "cuda": torch.version.cuda, **(extra or {}), "ms": med,
           "rounds": times, "aligned_over_straddling": med["ld4040"] / med["ld4096"],
           "round_ratios": [x / y for x, y in zip(times["ld4040"], times["ld4096"], strict=True)]}
    out.write_text(json.dumps(row, indent=1))
    print(json.dumps({k: row[k] for k in ("ms", "aligned_over_straddling")}))


def run(form: str, launch: Launch = cublas) -> None:
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
    if sys.argv[1] == "time":
        time_both(Path(sys.argv[2]))
    else:
        run(sys.argv[2])
