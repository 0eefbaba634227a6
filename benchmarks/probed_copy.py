"""A copy of perfscope's Hopper kernel sources with probes patched into hopper.cuh.

benchmarks/tail_split_probe.py and benchmarks/power_probe.py time the persistent stage from
the inside: each adds its own %globaltimer / clock64 reads to hop::persistent_gemm. Both
patch the committed hopper.cuh at anchors that must each stand exactly once (so a kernel
change that moves one is refused, not silently probed elsewhere), and compile the stage
from a temporary folder through KernelSpec.kernel_dir, launched as bench launches it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from perfscope.kernels.spec import KERNEL_DIR

# What hopper.cu includes besides hopper.cuh, copied unchanged.
_UNCHANGED = ("hopper.cu", "tma.cuh")


def patched(text: str, replacements: Sequence[tuple[str, str]]) -> str:
    """text with each anchor replaced; a ValueError names an anchor not there exactly once."""
    for anchor, repl in replacements:
        if text.count(anchor) != 1:
            raise ValueError(f"probe anchor not found once: {anchor.strip()[:60]}")
        text = text.replace(anchor, repl)
    return text


def probed_kernel_dir(header: str, prefix: str) -> Path:
    """A temporary folder holding hopper.cu and tma.cuh as committed and `header` as
    hopper.cuh: a KernelSpec's kernel_dir."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    for name in _UNCHANGED:
        shutil.copy(KERNEL_DIR / name, folder / name)
    (folder / "hopper.cuh").write_text(header)
    return folder
