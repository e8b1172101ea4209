"""Sweep the Triton kernels' launch configurations on this GPU (the kernels are not autotuned).

For each (BLOCK_M, BLOCK_N, num_warps, num_stages) it first checks the output against dense SDPA
with the same mask on a small case, then times the kernel at 32,256 tokens (Wan2.1's 21x32x48
latent grid), B=1, H=12, bf16, 128x128 blocks, random kept blocks at density 1.0 and 0.1, for
head dims 128 and 64, next to dense SDPA (the default backend, as diffusers calls it). The
first config of `launch_configs` should be the fastest that passes on the GPUs people use.

`--tma` sweeps the Hopper kernel (`mmspec/kernels/backends/triton_tma.py`) instead, at D=128
(issue 33's goals): configs with warp specialisation off and on, for the grid of one program per
query tile ("triton-tma") and the persistent one ("triton-tma-persistent"). A config the
compiler rejects is reported and skipped.

    python benchmarks/kernel_configs.py [--tma] [--repeats 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kernels import random_block_mask
from mmspec.kernels.tune import timed
from mmspec.kernels import block_sparse_attention
from mmspec.kernels.backends import triton_kernel, triton_tma

CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
    (128, 64, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4), (64, 64, 8, 3),
]
# the TMA kernel's: the fastest few of CONFIGS on the H100 (BENCHMARKS.md), each with warp
# specialisation off and on (then, as in Triton's tutorial, 4 warps for the specialised loop)
TMA_CONFIGS = [(128, 64, 8, 2, False), (128, 128, 8, 2, False), (64, 128, 4, 3, False),
               (128, 64, 4, 2, True), (128, 128, 4, 2, True), (128, 64, 8, 2, True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tma", action="store_true", help="sweep the Hopper (TMA) kernel")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernel_configs.py needs a CUDA device")
    sync = torch.cuda.synchronize
    module = triton_tma if args.tma else triton_kernel
    backends = ("triton-tma", "triton-tma-persistent") if args.tma else ("triton",)
    default = module.launch_configs
    g = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, triton {triton_kernel.triton.__version__}; configs "
          f"tried in order for D=128: {default(128, 128, 128)}, D=64: {default(128, 128, 64)}")
    for d in (128,) if args.tma else (128, 64):  # the TMA sweep at issue 33's head dim only
        small = [torch.randn(1, 4, 2048, d, generator=g).cuda().bfloat16() for _ in range(3)]
        small_mask = random_block_mask(4, 2048, 128, 0.3, "cuda")
        keep = small_mask.to_dense()
        ref = F.scaled_dot_product_attention(*[t.float() for t in small], attn_mask=keep)
        q, k, v = (torch.randn(1, 12, 32256, d, generator=g).cuda().bfloat16() for _ in range(3))
        t_dense = timed(lambda: F.scaled_dot_product_attention(q, k, v), args.repeats, sync)
        masks = {dens: random_block_mask(12, 32256, 128, dens, "cuda") for dens in (1.0, 0.1)}
        print(f"\nD={d}: dense SDPA {t_dense * 1e3:.3f} ms")
        for backend in backends:
            for cfg in TMA_CONFIGS if args.tma else CONFIGS:
                module.launch_configs = lambda *_, cfg=cfg: [cfg]
                triton_kernel._CHOSEN.clear()
                try:
                    out = block_sparse_attention(*small, small_mask, backend=backend)
                    err = (out.float() - ref).abs().max().item()
                    times = {}
                    for dens, m in masks.items():
                        call = lambda m=m: block_sparse_attention(q, k, v, m, backend=backend)
                        times[dens] = timed(call, args.repeats, sync)
                except Exception as e:  # a config the compiler rejects (shared memory, registers)
                    print(f"  {backend} {cfg}: failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''}", flush=True)
                    continue
                finally:
                    module.launch_configs = default
                    triton_kernel._CHOSEN.clear()
                print(f"  {backend} {cfg}: max err {err:.4f}{' WRONG' if err > 0.05 else ''}; "
                      + "; ".join(f"density {dens}: {t * 1e3:.3f} ms ({t_dense / t:.2f}x dense)"
                                  for dens, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
