"""A small PyTorch MLP step, the kind of program a user profiles: cuBLAS does the matmuls.

    python3 examples/torch_matmul.py [--iters 5]

Every iteration launches, in this order (X, W1, W2: 4096x4096 BF16):

  1. H = X @ W1            cuBLAS GEMM, 4096x4096x4096 (an ``nvjet_sm90_*`` kernel on Hopper)
  2. G = gelu(H)           PyTorch elementwise kernel
  3. Y = G @ W2            cuBLAS GEMM, 4096x4096x4096
  4. X = Y + X             PyTorch elementwise kernel (the residual add)

With a kernel filter that matches only the GEMMs, filter launch 2*i is iteration i's
X @ W1 and 2*i + 1 its G @ W2, so ``--launch-skip 2 --launch-count 1`` profiles the
third GEMM: iteration 1's X @ W1, after one warm iteration:

    perfscope profile --kernel 'matmul_kernel|nvjet' --launch-skip 2 --launch-count 1 \\
        --shape 4096x4096x4096 --dtype bf16 -- python3 examples/torch_matmul.py

The inputs are made before the loop (their random-number kernels match no filter above).
"""

import argparse

import torch
import torch.nn.functional as F

D = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    print(f"torch MLP step: X @ W1, gelu, @ W2, + X; every matmul {D}x{D}x{D} bf16; "
          f"{args.iters} iterations")
    torch.manual_seed(0)
    x = torch.randn(D, D, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(D, D, device="cuda", dtype=torch.bfloat16) / D ** 0.5
    w2 = torch.randn(D, D, device="cuda", dtype=torch.bfloat16) / D ** 0.5
    for _ in range(args.iters):
        h = x @ w1           # GEMM
        g = F.gelu(h)        # elementwise
        y = g @ w2           # GEMM
        x = y + x            # elementwise
    torch.cuda.synchronize()
    print(f"done; mean |X| = {x.float().abs().mean().item():.3f}")


if __name__ == "__main__":
    main()
