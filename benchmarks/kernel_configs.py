"""Sweep the Triton kernel's launch configurations on this GPU (the kernel is not autotuned).

For each (BLOCK_M, BLOCK_N, num_warps, num_stages) it first checks the output against dense SDPA
with the same mask on a small case, then times the kernel at 32,256 tokens (Wan2.1's 21x32x48
latent grid), B=1, H=12, bf16, 128x128 blocks, random kept blocks at density 1.0 and 0.1, for
head dims 128 and 64, next to dense SDPA (the default backend, as diffusers calls it). The
first config of `launch_configs` should be the fastest that passes on the GPUs people use.

    python benchmarks/kernel_configs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kernels import random_block_mask
from benchmarks.report import timed
from mmspec.kernels import block_sparse_attention
from mmspec.kernels.backends import triton_kernel

CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
    (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4), (64, 64, 8, 3),
]


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("kernel_configs.py needs a CUDA device")
    sync = torch.cuda.synchronize
    default = triton_kernel.launch_configs
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; configs tried in order for D=128: "
          f"{default(128, 128, 128)}, D=64: {default(128, 128, 64)}")
    for d in (128, 64):
        small = [torch.randn(1, 4, 2048, d, generator=g).cuda().bfloat16() for _ in range(3)]
        small_mask = random_block_mask(4, 2048, 128, 0.3, "cuda")
        keep = small_mask.to_dense()
        ref = F.scaled_dot_product_attention(*[t.float() for t in small], attn_mask=keep)
        q, k, v = (torch.randn(1, 12, 32256, d, generator=g).cuda().bfloat16() for _ in range(3))
        t_dense = timed(lambda: F.scaled_dot_product_attention(q, k, v), 20, sync)
        masks = {dens: random_block_mask(12, 32256, 128, dens, "cuda") for dens in (1.0, 0.1)}
        print(f"\nD={d}: dense SDPA {t_dense * 1e3:.3f} ms")
        for cfg in CONFIGS:
            triton_kernel.launch_configs = lambda *_, cfg=cfg: [cfg]
            triton_kernel._CHOSEN.clear()
            try:
                out = block_sparse_attention(*small, small_mask, backend="triton")
                err = (out.float() - ref).abs().max().item()
                times = {}
                for dens, m in masks.items():
                    call = lambda m=m: block_sparse_attention(q, k, v, m, backend="triton")
                    times[dens] = timed(call, 20, sync)
            except Exception as e:  # a config the compiler rejects (shared memory, registers)
                print(f"  {cfg}: failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            finally:
                triton_kernel.launch_configs = default
                triton_kernel._CHOSEN.clear()
            print(f"  {cfg}: max err {err:.4f}{' WRONG' if err > 0.05 else ''}; "
                  + "; ".join(f"density {dens}: {t * 1e3:.3f} ms ({t_dense / t:.2f}x dense)"
                              for dens, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
