#!/usr/bin/env bash
# GPU acceptance of issue 15 (and issue 16 items 4-5), on the H200, from the repository root:
#
#     OUT=/some/folder bash benchmarks/programs_acceptance.sh
#
# In a checkout with no reports/local (a fresh shell on a fresh machine):
#   1. `perfscope profile hgemm_bcf_dbf && perfscope diff hgemm_bcf_dbf cublas`: the diff
#      profiles the missing cuBLAS reference beside the stage's report, then prints the verdict;
#   2. a Triton matmul nobody here profiles by hand (examples/triton_matmul.py): one launch
#      picked with --launch-skip/--launch-count, then `diff REPORT:matmul_kernel@0 cublas`
#      and `... cublaslt` (cuBLASLt through nvmath-python, profiled on demand);
#   3. a PyTorch MLP step (examples/torch_matmul.py): two GEMM launches of one nvjet kernel
#      with --time, each diffed against cublas and cublaslt (@0, @1), and @0 against @1;
#   4. a 2-CTA-cluster TMA stage verified through cuda.bindings' cuLaunchKernelEx and
#      cuOccupancyMaxActiveClusters, with the SM clock read from NVML by PCI bus id.
# Every step's stdout and stderr land in $OUT/NN-name.{out,err}; $OUT/summary.tsv holds
# each step's exit code and seconds; $OUT/reports.tar.xz the reports and manifests made,
# $OUT/sizes.txt their sizes compressed (the references, each from an ncu process of its
# own, must stay far under 1 MB). Stops starting steps after about 225 s.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    # nvmath-python (and the cuda-core/cuda-pathfinder it wants) from the carried wheels.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl >"$OUT/00-wheels.log" 2>&1
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PS=(python3 -m perfscope.cli)
BUDGET=225
T0=$(date +%s)
printf 'step\trc\tseconds\n' >"$OUT/summary.tsv"

step() {  # step NAME ARGV...: run with the time left, log, record rc and seconds
    local name=$1
    shift
    local left=$((BUDGET - ($(date +%s) - T0)))
    if ((left < 10)); then
        printf '%s\tskipped\t0\n' "$name" >>"$OUT/summary.tsv"
        return 0
    fi
    local start rc ms
    start=$(date +%s%N)
    timeout "$((left < 150 ? left : 150))" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '%s\t%s\t%d.%03d\n' "$name" "$rc" "$((ms / 1000))" "$((ms % 1000))" >>"$OUT/summary.tsv"
    return 0
}

written() {  # the report a `perfscope profile -- ...` step wrote
    sed -n 's/^wrote \(.*\) ([0-9]* kernel launch.*/\1/p' "$OUT/$1.out" | tail -1
}

{ nvidia-smi --query-gpu=name,pci.bus_id,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import importlib.metadata as m
try: print('ncu-report', m.version('ncu-report'))
except m.PackageNotFoundError: print('ncu-report: no wheel; the reader of the ncu install (extras/python)')"
  python3 -c "import nvmath; print('nvmath', nvmath.__version__)"
  ncu --version | tail -1; } >"$OUT/00-environment.txt" 2>&1

# 1. A ladder stage, then its cuBLAS reference on demand.
step 01-profile-stage "${PS[@]}" profile hgemm_bcf_dbf
step 02-diff-stage-cublas "${PS[@]}" diff hgemm_bcf_dbf cublas

# 2. Triton: iteration 2's matmul (the first compiles the kernel).
step 03-profile-triton "${PS[@]}" profile --kernel 'matmul_kernel|nvjet' --launch-skip 2 \
    --launch-count 1 --shape 4096x4096x4096 --dtype bf16 -- python3 examples/triton_matmul.py
TRITON=$(written 03-profile-triton)
step 04-diff-triton-cublas "${PS[@]}" diff "$TRITON:matmul_kernel@0" cublas
step 05-diff-triton-cublaslt "${PS[@]}" diff "$TRITON:matmul_kernel@0" cublaslt

# 3. PyTorch: iteration 1's X @ W1 (@0) and G @ W2 (@1), timed against the reference.
step 06-profile-torch "${PS[@]}" profile --kernel 'matmul_kernel|nvjet' --launch-skip 2 \
    --launch-count 2 --shape 4096x4096x4096 --dtype bf16 --time -- \
    python3 examples/torch_matmul.py --iters 3
TORCH=$(written 06-profile-torch)
step 07-diff-torch0-cublas "${PS[@]}" diff "$TORCH:nvjet@0" cublas
step 08-diff-torch0-cublaslt "${PS[@]}" diff "$TORCH:nvjet@0" cublaslt
step 09-diff-torch1-cublas "${PS[@]}" diff "$TORCH:nvjet@1" cublas
step 10-diff-torch1-cublaslt "${PS[@]}" diff "$TORCH:nvjet@1" cublaslt
step 11-diff-torch0-torch1 "${PS[@]}" diff "$TORCH:nvjet@0" "$TORCH:nvjet@1"

# 4. cuda.bindings launch path (cluster attribute, occupancy query) and NVML by bus id.
step 12-bench-cluster "${PS[@]}" bench hgemm_tma_wgmma_cluster --dtype bf16 --shape 2048x2048x2048 \
    --runs 5 --rounds 1 --out "$OUT/bench-cluster.json"

# What was made: reports, manifests, and the references' compressed sizes.
if [ -d reports/local ]; then
    python3 - "$OUT" <<'PY'
import lzma, sys, tarfile
from pathlib import Path
out = Path(sys.argv[1])
with open(out / "sizes.txt", "w") as sizes:
    for rep in sorted(Path("reports/local").rglob("*.ncu-rep")):
        raw = rep.read_bytes()
        sizes.write(f"{rep}\t{len(raw)} bytes\t{len(lzma.compress(raw, preset=9))} bytes xz\n")
with tarfile.open(out / "reports.tar.xz", "w:xz") as tar:
    tar.add("reports/local")
PY
fi
printf 'total\t-\t%s\n' "$(($(date +%s) - T0))" >>"$OUT/summary.tsv"
cat "$OUT/summary.tsv"
