"""A copy of perfscope's kernel sources with probes or variants patched in.

benchmarks/tail_split_probe.py and benchmarks/power_probe.py time the persistent stage from
the inside: each adds its own %globaltimer / clock64 reads to hop::persistent_gemm;
benchmarks/epilogue_cost.py builds hgemm_fused_bias_act with parts of its epilogue taken
out. Each patches the committed source at anchors that must each stand exactly once (so a
kernel change that moves one is refused, not silently patched elsewhere), and compiles the
stage from a temporary folder through KernelSpec.kernel_dir, launched as bench launches it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from perfscope.kernels.spec import KERNEL_DIR


def patched(text: str, replacements: Sequence[tuple[str, str]]) -> str:
    """text with each anchor replaced; a ValueError names an anchor not there exactly once."""
    for anchor, repl in replacements:
        if text.count(anchor) != 1:
            raise ValueError(f"probe anchor not found once: {anchor.strip()[:60]}")
        text = text.replace(anchor, repl)
    return text


def patched_kernel_dir(texts: Mapping[str, str], prefix: str) -> Path:
    """A temporary folder holding every kernel source and header as committed, with the
    files named in texts replaced by their texts: a KernelSpec's kernel_dir."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    for path in KERNEL_DIR.iterdir():
        if path.suffix in (".cu", ".cuh"):
            shutil.copy(path, folder / path.name)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return folder


def probed_kernel_dir(header: str, prefix: str) -> Path:
    """A temporary folder holding the kernel sources as committed and `header` as
    hopper.cuh: a KernelSpec's kernel_dir."""
    return patched_kernel_dir({"hopper.cuh": header}, prefix)
