"""The GEMM ladders: KernelSpec registry, the .cu sources beside it, cuBLAS references.

    from perfscope.kernels import get_spec
    spec = get_spec("hgemm_bcf")          # one-sentence PerfscopeError if unknown
    spec.name_expression("bf16")          # 'hgemm_bcf<__nv_bfloat16, 128, 128, 32, 8>'
"""

from perfscope.kernels.registry import (
    COMPILED_ONLY,
    REFERENCE_FOR_DTYPE,
    REGISTRY,
    all_specs,
    audit_specs,
    get_spec,
    names,
    run_reads,
    stage_catalogue,
    stage_info,
)
from perfscope.kernels.spec import (
    DTYPES,
    KERNEL_DIR,
    KernelSpec,
    Shape,
    ShapeConstraint,
    normalize_dtype,
    parse_shape,
)

__all__ = [
    "COMPILED_ONLY",
    "DTYPES",
    "KERNEL_DIR",
    "REFERENCE_FOR_DTYPE",
    "REGISTRY",
    "KernelSpec",
    "Shape",
    "ShapeConstraint",
    "all_specs",
    "audit_specs",
    "get_spec",
    "names",
    "normalize_dtype",
    "parse_shape",
    "run_reads",
    "stage_catalogue",
    "stage_info",
]
