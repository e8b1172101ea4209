"""Block-sparse attention vs dense SDPA, side by side in one run.

CPU (always): the torch backend vs dense `F.scaled_dot_product_attention`, B=1, H=4, N=16384, D=64,
fp32, 128-token blocks, at density 1.0, 0.25 and 0.1 (random kept blocks, the same count in every
row). Bars: >= 8x faster than dense at density 0.1; no slower than 1.3x dense at density 1.0.
A mask that keeps every block goes to PyTorch's own flash attention (the dense baseline itself),
so the density-1.0 bar is taken on the block kernel called directly, which that row also times.

GPU (when CUDA is present): the Triton kernel vs SDPA's flash backend, bf16, B=1, H=16, N=32768,
D=128. Aims: >= 0.8x flash throughput at density 1.0, >= 8x its speed at density 0.1.

    python benchmarks/kernels.py [--write] [--repeats 3]
    python benchmarks/kernels.py --gpu-only [--write]   # the GPU table alone, its own section

A full run on a GPU machine would re-measure the CPU table on that machine's CPU; `--gpu-only`
keeps the CPU section from the CPU machine and writes the GPU table into section `kernels_gpu`.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mmspec.kernels import BlockSparseMask, block_sparse_attention

try:
    from report import markdown_table, write_section
except ImportError:  # run as a module from the repo root
    from benchmarks.report import markdown_table, write_section


def random_block_mask(h, n, block, density, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = n // block
    keep = max(1, round(density * nb))
    order = torch.rand(1, h, nb, nb, generator=g).argsort(-1)[..., :keep]
    blocks = torch.zeros(1, h, nb, nb, dtype=torch.bool).scatter_(-1, order, True)
    return BlockSparseMask.from_dense(blocks.to(device), block, n, n)


def timed_pair(fn_a, fn_b, repeats, sync=lambda: None, ctx_a=None):
    """Medians of `fn_a` and `fn_b` timed alternately, so that a load change on a shared machine
    moves both rather than the ratio."""
    from contextlib import nullcontext

    ctx_a = ctx_a or nullcontext
    with ctx_a():
        fn_a()
    fn_b()
    sync()
    ta, tb = [], []
    for _ in range(repeats):
        with ctx_a():
            start = time.perf_counter()
            fn_a()
            sync()
            ta.append(time.perf_counter() - start)
        start = time.perf_counter()
        fn_b()
        sync()
        tb.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


def bench(device, dtype, b, h, n, d, block, densities, backend, repeats, dense_label, dense_ctx):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(device, dtype) for _ in range(3))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for density in densities:
        mask = random_block_mask(h, n, block, density, device)
        t_dense, t_sparse = timed_pair(
            lambda: F.scaled_dot_product_attention(q, k, v),
            lambda: block_sparse_attention(q, k, v, mask, backend=backend), repeats, sync,
            dense_ctx)
        label = f"{mask.density():.2f}"
        if mask.is_dense and device == "cpu":
            label += " (API: PyTorch's flash)"
        rows.append([label, f"{t_dense * 1e3:.0f}", f"{t_sparse * 1e3:.0f}",
                     f"{t_dense / t_sparse:.2f}x"])
        print(f"density {label}: {dense_label} {t_dense * 1e3:.0f} ms, "
              f"{backend} {t_sparse * 1e3:.0f} ms, speedup {t_dense / t_sparse:.2f}x", flush=True)
        if mask.is_dense and device == "cpu":  # the block kernel itself, past the flash shortcut
            from mmspec.kernels.backends import torch_blocks

            kernel, scale = torch_blocks._cpu_kernel(), d**-0.5
            path = "fused C++" if kernel is not None else "batched-matmul"
            t_dense, t_block = timed_pair(
                lambda: F.scaled_dot_product_attention(q, k, v),
                lambda: torch_blocks._fused_cpu(kernel, q, k, v, mask, scale, 0.0)
                if kernel is not None else torch_blocks._batched(q, k, v, mask, scale),
                repeats, sync)
            rows.append([f"{mask.density():.2f} ({path} block kernel)", f"{t_dense * 1e3:.0f}",
                         f"{t_block * 1e3:.0f}", f"{t_dense / t_block:.2f}x"])
            print(f"density 1.00, {path} block kernel: dense SDPA {t_dense * 1e3:.0f} ms "
                  f"(timed again, alternating with it), block kernel {t_block * 1e3:.0f} ms, "
                  f"speedup {t_dense / t_block:.2f}x", flush=True)
    return rows


def gpu_table(header, repeats):
    """Triton vs SDPA flash in bf16 at 32k tokens, with the aims of the module docstring."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = bench("cuda", torch.bfloat16, 1, 16, 32768, 128, 128, (1.0, 0.5, 0.25, 0.1),
                 "triton", max(repeats, 10), "SDPA flash",
                 lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))
    speed = {r[0]: float(r[3][:-1]) for r in rows}
    aims = (f"Aims: density 1.00 >= 0.8x flash (measured {speed['1.00']:.2f}x: "
            f"{'met' if speed['1.00'] >= 0.8 else 'missed'}); density 0.10 >= 8x flash "
            f"(measured {speed['0.10']:.2f}x: {'met' if speed['0.10'] >= 8 else 'missed'}).")
    return (f"GPU ({torch.cuda.get_device_name()}), Triton kernel vs SDPA's flash backend: bf16, "
            f"B=1, H=16, N=32768, D=128, 128x128 blocks, random kept blocks (same count per "
            f"row), median of {max(repeats, 10)} after a warm-up.\n\n"
            + markdown_table(header, rows) + "\n\n" + aims + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU table (Triton vs SDPA flash), into section kernels_gpu")
    args = parser.parse_args()
    from contextlib import nullcontext

    header = ["density", "dense (ms)", "block-sparse (ms)", "speedup vs dense"]
    if args.gpu_only:
        if not torch.cuda.is_available():
            parser.error("--gpu-only needs a CUDA device; none is visible")
        body = gpu_table(header, args.repeats)
        print(body)
        if args.write:
            write_section("kernels_gpu", "Block-sparse attention kernel on a GPU "
                          "(`benchmarks/kernels.py --gpu-only`)", body)
        return
    rows = bench("cpu", torch.float32, 1, 4, 16384, 64, 128, (1.0, 0.25, 0.1), "torch",
                 args.repeats, "dense SDPA", nullcontext)
    speed = {r[0].split(" (")[0] + (" block" if "block kernel" in r[0] else ""):
             float(r[3][:-1]) for r in rows}
    full = speed["1.00 block"]
    verdict = (
        f"Bars: density 0.10 needs >= 8x (measured {speed['0.10']:.2f}x: "
        f"{'met' if speed['0.10'] >= 8 else 'missed'}); density 1.00 needs >= 1/1.3 = 0.77x, "
        f"taken on the block kernel called directly (measured {full:.2f}x: "
        f"{'met' if full >= 1 / 1.3 else 'missed'}); through the API a full mask runs PyTorch's "
        f"flash attention, the baseline itself."
    )
    body = ("CPU, torch backend vs dense `F.scaled_dot_product_attention`: B=1, H=4, N=16384, "
            "D=64, fp32, 128x128 blocks, random kept blocks (same count per row), medians of "
            f"{args.repeats}, dense and block-sparse timed alternately per row.\n\n"
            + markdown_table(header, rows) + "\n\n" + verdict + "\n")
    print(verdict)
    if torch.cuda.is_available():
        body += "\n" + gpu_table(header, args.repeats)
    else:
        body += "\nGPU comparison (Triton vs SDPA flash): not run, no CUDA device on this machine.\n"
    if args.write:
        write_section("kernels", "Block-sparse attention kernel (`benchmarks/kernels.py`)", body)


if __name__ == "__main__":
    main()
