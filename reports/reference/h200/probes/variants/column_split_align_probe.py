"""Is the column split's slowness its misaligned B boxes? (Written 2026-12-05; not yet run.)

    PYTHONPATH=. python3 PROBES/variants/column_split_align_probe.py OUT.json   (from a tree
    with column-split.patch applied)

Times STREAMK=4 as it is against the same kernel with every piece's first column rounded
down to a multiple of 64 (aligned TMA boxes, the same widths and math; its output is wrong,
only its time counts), with the unsplit kernel as the third side of the same rounds.
aligned_over_split above 1: the aligned pieces are faster; plain_over_aligned above 1: the
aligned split beats the unsplit kernel.
"""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

from perfscope.kernels import get_spec
from perfscope.kernels.launch import prepare
from perfscope.kernels.spec import KERNEL_DIR, parse_shape
from perfscope.timing import BenchOptions, time_stage

ANCHOR = "        n0 = 8 * (j * units8 / per_row);\n        w = 8 * ((j + 1) * units8 / per_row) - n0;\n"


def aligned_kernels(folder: Path) -> Path:
    """A copy of the kernels whose column-split pieces start on a 64-column boundary."""
    shutil.copytree(KERNEL_DIR, folder, dirs_exist_ok=True)
    header = (folder / "hopper.cuh").read_text()
    assert header.count(ANCHOR) == 1
    (folder / "hopper.cuh").write_text(header.replace(ANCHOR, ANCHOR + "        n0 = n0 / 64 * 64;\n"))
    return folder


def main() -> None:
    """Time the aligned split, the split and the unsplit kernel in the same rounds."""
    folder = aligned_kernels(Path("/tmp/aligned/kernels"))
    base = get_spec("hgemm_tma_wgmma_persistent")
    rows = []
    for shape in ("4096x4096x4096", "8192x8192x8192"):
        s = parse_shape(shape)
        split = prepare(base.with_params(STREAMK=4), "bf16", s)
        aligned = prepare(dataclasses.replace(base.with_params(STREAMK=4), kernel_dir=folder), "bf16", s)
        plain = prepare(base, "bf16", s)
        t = time_stage(aligned, split, BenchOptions(runs=20, rounds=7, warmup=3), parent=plain)
        row = dict(shape=shape, dtype="bf16", aligned_over_split=t.ratio_to_reference.median,
                   aligned_ms=t.time_ms.median, split_ms=t.reference_time_ms.median,
                   plain_over_aligned=t.ratio_to_parent.median)
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
