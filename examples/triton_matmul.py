"""A small program with its own Triton matmul: a target for ``perfscope profile --kernel``.

    python3 examples/triton_matmul.py [--iters 5]

Every iteration launches, in this order:

  1. ``matmul_kernel`` (Triton, this file): Y = X @ W, 4096x4096x4096, BF16 in and out,
     FP32 accumulation;
  2. a PyTorch elementwise kernel: Y.relu_() (``vectorized_elementwise_kernel``).

So with a kernel filter that matches only ``matmul_kernel``, launch N of the filter is the
matmul of iteration N (0-based): ``--launch-skip 2 --launch-count 1`` profiles the third
iteration's matmul, after two warm iterations (the first also compiles the kernel):

    perfscope profile --kernel 'matmul_kernel|nvjet' --launch-skip 2 --launch-count 1 \\
        --shape 4096x4096x4096 --dtype bf16 -- python3 examples/triton_matmul.py

The inputs are made before the loop (their random-number kernels match no filter above).
"""

import argparse

import torch
import triton
import triton.language as tl

M = N = K = 4096


@triton.jit
def matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn,
                  stride_ym, stride_yn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of Y per program; programs walk the tiles in groups of
    GROUP_M rows so neighbouring programs share W's columns in L2."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows
    tile_n = (pid % per_group) // rows

    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_tile = x_ptr + (offs_m[:, None] % M) * stride_xm + offs_k[None, :] * stride_xk
    w_tile = w_ptr + offs_k[:, None] * stride_wk + (offs_n[None, :] % N) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        x = tl.load(x_tile, mask=offs_k[None, :] < k_left, other=0.0)
        w = tl.load(w_tile, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(x, w, acc)
        x_tile += BLOCK_K * stride_xk
        w_tile += BLOCK_K * stride_wk
    y_tile = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_tile, acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[1]
    block_m, block_n, block_k = 128, 256, 64
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    matmul_kernel[grid](x, w, y, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                        y.stride(0), y.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                        BLOCK_K=block_k, GROUP_M=8, num_warps=8, num_stages=3)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    print(f"Triton matmul_kernel: {M}x{N}x{K} bf16, then relu; {args.iters} iterations")
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(args.iters):
        matmul(x, w, y)      # matmul_kernel
        y.relu_()            # PyTorch elementwise
    torch.cuda.synchronize()
    expect = torch.relu(x.float() @ w.float())
    err = (torch.linalg.norm(y.float() - expect) / torch.linalg.norm(expect)).item()
    print(f"done; relative error against an FP32 matmul: {err:.1e}")


if __name__ == "__main__":
    main()
