"""perfscope: Nsight Compute profiling and bottleneck diagnosis for CUDA GEMM kernels.

    import perfscope
    for kp in perfscope.load("report.ncu-rep.xz"):
        print(kp.name, kp.sol.duration_ns, kp.stalls.ranked[:3])
"""

from perfscope.errors import PerfscopeError
from perfscope.profile import KernelProfile, load, load_many

__version__ = "0.1.0"

__all__ = ["KernelProfile", "PerfscopeError", "__version__", "load", "load_many"]
