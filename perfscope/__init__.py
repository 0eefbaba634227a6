"""perfscope: Nsight Compute profiling and bottleneck diagnosis for CUDA GEMM kernels.

    import perfscope
    for kp in perfscope.load("report.ncu-rep.xz"):
        print(kp.name, kp.sol.duration_ns, kp.stalls.top(3))

The report model is imported on first use, so ``import perfscope`` stays cheap for
commands (bench, sass) that never read a report.
"""

from __future__ import annotations

from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.version import __version__

_LAZY = {"KernelProfile": "perfscope.profile", "load": "perfscope.profile",
         "load_many": "perfscope.loadpool", "to_dataframe": "perfscope.export",
         "to_json": "perfscope.export"}

__all__ = ["PerfscopeError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
