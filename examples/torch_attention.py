"""Attention's two batched matmuls in PyTorch, the kind of program a user profiles: one
cuBLAS strided batched GEMM launch runs every head's product.

    python3 examples/torch_attention.py [--iters 3] [--heads 32] [--seq 2048] [--dim 128]

Every iteration launches, in this order (Q, K, V: heads x seq x dim, BF16):

  1. S = Q @ K^T                torch.bmm over the heads, a heads x seq x seq x dim batch
                                (K^T a transposed view), inside the NVTX range
                                ``scores-bf16-<heads>x<seq>x<seq>x<dim>``
  2. P = softmax(S / sqrt(dim)) PyTorch elementwise kernels (no range)
  3. O = P @ V                  torch.bmm, a heads x seq x dim x seq batch, inside
                                ``values-bf16-<heads>x<seq>x<dim>x<seq>``

A range named ``...-<dtype>-BxMxNxK`` tells perfscope the batch, the shape and the dtype of
what it holds, so the first iteration's P @ V is profiled and held against cuBLAS's own
batched GEMM at the same shape with

    perfscope profile --nvtx values-bf16-32x2048x128x2048/ --launch-count 1 \\
        -- python3 examples/torch_attention.py
    perfscope diff <the report it wrote> cublas

The range name carries the shape the same way --shape 32x2048x128x2048 --dtype bf16 would.
"""

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=128)
    args = ap.parse_args()
    h, s, d = args.heads, args.seq, args.dim
    scores, values = f"scores-bf16-{h}x{s}x{s}x{d}", f"values-bf16-{h}x{s}x{d}x{s}"
    print(f"torch attention: {scores}, softmax, {values}; {args.iters} iterations")
    torch.manual_seed(0)
    q, k, v = (torch.randn(h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(args.iters):
        torch.cuda.nvtx.range_push(scores)
        logits = torch.bmm(q, k.transpose(1, 2))
        torch.cuda.nvtx.range_pop()
        p = torch.softmax(logits / d ** 0.5, dim=-1)
        torch.cuda.nvtx.range_push(values)
        o = torch.bmm(p, v)
        torch.cuda.nvtx.range_pop()
        q = o
    torch.cuda.synchronize()
    print(f"done; mean |O| = {o.float().abs().mean().item():.4f}")


if __name__ == "__main__":
    main()
