"""Launch the column split once, its pieces' boxes as they are or aligned, for ncu. (2026-12-05)

    PYTHONPATH=. python3 PROBES/variants/column_split_align_launch.py split|aligned   (from a
    tree with column-split.patch applied)

The program `perfscope profile -- ...` captures so that the split's two forms have reports
of their own from one machine: ``split`` is STREAMK=4 as the patch has it (pieces that
start on a multiple of 8 columns, so their B boxes' 128-byte rows straddle two lines),
``aligned`` the same kernel with every piece's first column rounded down to 64
(column_split_align_probe.aligned_kernels: the same widths and math, aligned boxes, a
wrong C; the stage runner would refuse to profile it, a program is not verified). Three
warm-up launches, then one inside the NVTX range ``<form>-bf16-4096x4096x4096`` that
`profile --nvtx` selects.
"""

import dataclasses
import sys
from pathlib import Path

import cupy as cp

from perfscope.kernels import get_spec
from perfscope.kernels.launch import output_array, prepare
from perfscope.kernels.spec import parse_shape
from perfscope.verify import make_inputs

sys.path.insert(0, str(Path(__file__).parent))
from column_split_align_probe import aligned_kernels

SHAPE = "4096x4096x4096"
WARMUP = 3


def main() -> None:
    """Prepare the chosen form, warm it up, launch it once inside its NVTX range."""
    form = sys.argv[1]
    spec = get_spec("hgemm_tma_wgmma_persistent").with_params(STREAMK=4)
    if form == "aligned":
        spec = dataclasses.replace(spec, kernel_dir=aligned_kernels(Path("/tmp/aligned/kernels")))
    elif form != "split":
        raise SystemExit("say split or aligned")
    prep = prepare(spec, "bf16", parse_shape(SHAPE))
    a, b = make_inputs(cp, prep.shape, "bf16", seed=1)
    c = output_array(cp, prep)
    for _ in range(WARMUP):
        prep.launch(a, b, c)
    cp.cuda.Device().synchronize()
    with _Range(form):
        prep.launch(a, b, c)
    cp.cuda.Device().synchronize()


class _Range:
    """cupy's NVTX push and pop around the measured launch."""

    def __init__(self, form: str) -> None:
        self.name = f"{form}-bf16-{SHAPE}"

    def __enter__(self) -> None:
        cp.cuda.nvtx.RangePush(self.name)

    def __exit__(self, *exc: object) -> None:
        cp.cuda.nvtx.RangePop()


if __name__ == "__main__":
    main()
