"""perfscope: Nsight Compute profiling and bottleneck diagnosis for CUDA GEMM kernels.

    import perfscope
    for kp in perfscope.load("report.ncu-rep.xz"):
        print(kp.name, kp.sol.duration_ns, kp.stalls.ranked[:3])

The report model is imported on first use, so ``import perfscope`` stays cheap for
commands (bench, sass) that never read a report.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from perfscope.errors import PerfscopeError

# Load the report reader before anything can load CuPy: in the other order the reader
# crashes the process (see perfscope.profile._ncu_report_module).
CUPY_BEFORE_READER = "cupy._core.core" in sys.modules and "ncu_report" not in sys.modules
# The runner (the process ncu profiles) never reads reports.
if not CUPY_BEFORE_READER and os.environ.get("PERFSCOPE_RUNNER") != "1":
    # The reader is needed only once a report is read; its absence is reported then.
    with contextlib.suppress(ImportError):
        import ncu_report as _ncu_report  # noqa: F401

__version__ = "0.1.0"

_LAZY = {"KernelProfile": "perfscope.profile", "load": "perfscope.profile",
         "load_many": "perfscope.profile", "to_dataframe": "perfscope.export",
         "to_json": "perfscope.export"}

__all__ = ["CUPY_BEFORE_READER", "PerfscopeError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
