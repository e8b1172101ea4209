"""Block-sparse attention vs dense SDPA, side by side in one run.

CPU (always): the torch backend vs dense `F.scaled_dot_product_attention`, B=1, H=4, N=16384, D=64,
fp32, 128-token blocks, at density 1.0, 0.25 and 0.1 (random kept blocks, the same count in every
row). Bars: >= 8x faster than dense at density 0.1; no slower than 1.3x dense at density 1.0.
A mask that keeps every block goes to PyTorch's own flash attention (the dense baseline itself),
so the density-1.0 bar is taken on the block kernel called directly, which that row also times.

GPU (when CUDA is present): every GPU backend (Triton, FlexAttention; Triton's TMA variants on
sm90+, FlashInfer and FlashAttention-4 where their packages import) against the *fastest* dense
attention on the machine (SDPA's default selection, its cuDNN / flash / efficient backends,
FlashAttention-2/3 where installed, compiled FlexAttention without a mask), bf16, B=1, H=16,
N=32768, D=128 and 64, random and causal block masks at densities 1.0 to 0.05. Goals (issue 42):
>= 0.9x the best dense call at density 1.0, >= 8x at density 0.1.

    python benchmarks/kernels.py [--write] [--repeats 3]
    python benchmarks/kernels.py --gpu-only [--write] [--points P.json]   # GPU tables alone
    python benchmarks/kernels.py --gpu-only --auto   # also: the points as auto's table, and
                                                     # auto timed against the fastest backend

A full run on a GPU machine would re-measure the CPU table on that machine's CPU; `--gpu-only`
keeps the CPU section from the CPU machine and writes the GPU table into section `kernels_gpu`.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.kernels.tune import random_block_mask, timed

try:
    from gpu_results import record
    from report import markdown_table, write_section
except ImportError:  # run as a module from the repo root
    from benchmarks.gpu_results import record
    from benchmarks.report import markdown_table, write_section


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


def random_causal_mask(h, n, block, density, device, seed=0):
    """Block-causal: every diagonal block (partial, causal inside) and a `density` share of the
    blocks below it, chosen at random per row (at least the diagonal)."""
    from mmspec.kernels.masks.causal import causal_predicate

    g = torch.Generator().manual_seed(seed)
    nb = n // block
    below = torch.ones(nb, nb, dtype=torch.bool).tril(-1)
    score = torch.rand(1, h, nb, nb, generator=g).masked_fill(~below, 2.0)
    keep = (torch.arange(nb)[:, None] * density).round().long()  # blocks kept below row m
    full = score.argsort(-1).argsort(-1) < keep  # the `keep` lowest scores among row m's
    diag = torch.eye(nb, dtype=torch.bool).expand(1, h, nb, nb)
    return BlockSparseMask.from_block_flags(full.to(device), diag.to(device),
                                            causal_predicate(0), block, n, n)


def dense_candidates(q, k, v, causal):
    """The dense attention calls available here, by name: SDPA's default selection and each of
    its GPU backends, FlashAttention-2/3 where installed, FlexAttention compiled with no mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend=None):
        def call():
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call

    calls = {"SDPA default": sdpa(), "SDPA flash": sdpa(SDPBackend.FLASH_ATTENTION),
             "SDPA cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION),
             "SDPA efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # flash-attn's [B, N, H, D]
    try:
        from flash_attn_interface import flash_attn_func as fa3

        calls["FlashAttention-3"] = lambda: fa3(qt, kt, vt, causal=causal)
    except ImportError:
        pass
    try:
        from flash_attn import flash_attn_func as fa2

        calls["FlashAttention-2"] = lambda: fa2(qt, kt, vt, causal=causal)
    except ImportError:
        pass
    if q.device.type != "cuda":  # compiling flex on a CPU takes longer than the table
        return calls
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    block_mask = (create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2],
                                    device=q.device) if causal else None)
    calls["FlexAttention (compiled)"] = lambda: flex(q, k, v, block_mask=block_mask)
    return calls


def gpu_backends() -> tuple[str, ...]:
    """Triton and FlexAttention; Triton's Hopper (TMA) variants, FlashInfer and FlashAttention-4
    where they are registered (the TMA ones with a Triton that has tensor descriptors; each
    refuses GPUs it cannot run on by its constraints, reported as a failed column)."""
    from mmspec.kernels import available_backends

    extra = ("triton-tma", "triton-tma-persistent", "flashinfer", "fa4")
    return ("triton", "flex") + tuple(b for b in extra if b in available_backends())


GOAL_DENSITIES = {1.0: "1.0", 0.1: "0.1"}  # issue 42's kernel goals, D 128, random blocks
GOAL_BACKENDS = ("triton", "triton-tma", "triton-tma-persistent")


def _sync(device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else device


def time_backends(q, k, v, mask, backends, repeats, where):
    """Milliseconds of each backend on one mask; a backend that raises (a Triton compile error,
    a constraint, an output off the first one's) is left out and printed. A CUDA error that
    poisons the context (an illegal memory access) ends the run: every later call would fail."""
    sync = _sync(q.device.type)
    ref, times = None, {}
    for backend in backends:
        try:
            out = block_sparse_attention(q, k, v, mask, backend=backend)
            if ref is None:
                ref = out
            elif (out - ref).abs().max().item() > 0.05:
                raise RuntimeError(f"differs from {backends[0]} by "
                                   f"{(out - ref).abs().max().item():.3f}")
            times[backend] = timed(
                lambda: block_sparse_attention(q, k, v, mask, backend=backend), repeats, sync)
        except Exception as err:  # any failure of one backend is its row's "failed"
            print(f"{where}: {backend} failed ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:120] if str(err) else ''})", flush=True)
            sync()  # raises when the context is lost: the rows so far are written already
    return times


def best_dense(q, k, v, causal, repeats, where):
    """ms of each dense call that runs here (`dense_candidates`), by name."""
    dense = {}
    for name, call in dense_candidates(q, k, v, causal).items():
        try:
            dense[name] = timed(call, repeats, _sync(q.device.type))
        except Exception as err:  # not built for this GPU / dtype / head dim
            print(f"{where}: {name} unavailable ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:100] if str(err) else ''})", flush=True)
    print(f"{where}: dense " + ", ".join(f"{c} {t * 1e3:.2f} ms" for c, t in dense.items()),
          flush=True)
    return dense


def gpu_table(repeats, head_dims=(128, 64), densities=(1.0, 0.1, 0.5, 0.25, 0.05),
              backends=None, n=32768, h=16, block=128, progress=lambda body, points: None,
              device="cuda"):
    """Every backend at every density against the fastest dense call on this GPU (bf16), for
    random and causal block masks; also a JSON-able list of the measured points. The goal rows
    (D 128, random, density 1.0 and 0.1) come first; `progress(body, points)` is called after
    every row with the table so far, and issue 42's goals are recorded as they are measured.
    `device`: "cuda"; the CPU runs it at a tiny size in tests/benchmarks/test_kernels_bench.py."""
    repeats = max(repeats, 10) if device == "cuda" else repeats
    backends = backends or gpu_backends()
    table = {"rows": [], "dense_rows": [], "points": []}
    for d in head_dims:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, n, d, generator=g).to(device, torch.bfloat16)
                   for _ in range(3))
        for kind in ("random", "causal"):
            causal = kind == "causal"
            dense = best_dense(q, k, v, causal, repeats, f"D={d} {kind}")
            best = min(dense, key=dense.get)
            table["dense_rows"].append(
                [d, kind] + [f"{dense[c] * 1e3:.2f}" if c in dense else "n/a"
                             for c in DENSE_COLUMNS] + [best])
            for density in densities:
                mask = (random_causal_mask if causal else random_block_mask)(
                    h, n, block, density, device)
                times = time_backends(q, k, v, mask, backends, repeats,
                                      f"D={d} {kind} {density}")
                kept = mask.density()
                row = [d, kind, f"{density:g} ({kept:.3f})", f"{best} {dense[best] * 1e3:.2f}"]
                for backend in backends:
                    t = times.get(backend)
                    row += ([f"{t * 1e3:.2f}", f"{dense[best] / t:.2f}x"] if t else ["failed", ""])
                row.append(f"{(0.5 if causal else 1.0) / kept if kept else float('inf'):.1f}x")
                table["rows"].append(row)
                table["points"].append({
                    "head_dim": d, "mask": kind, "density": kept, "asked": density,
                    "dtype": "bfloat16", "dense": {c: t * 1e3 for c, t in dense.items()},
                    "backends_ms": {b: t * 1e3 for b, t in times.items()}})
                print("  " + " | ".join(str(c) for c in row), flush=True)
                if d == 128 and kind == "random" and density in GOAL_DENSITIES:
                    for backend in GOAL_BACKENDS:
                        t = times.get(backend)
                        record("kernels_gpu", f"{backend} vs best dense, D 128, density "
                               f"{GOAL_DENSITIES[density]}", dense[best] / t if t else None,
                               _device_name(device))
                progress(gpu_body(table, backends, repeats, n, h, block, device),
                         table["points"])
        q = k = v = None  # free their GPU memory before the next head dim
    return gpu_body(table, backends, repeats, n, h, block, device), table["points"]


def gpu_body(table, backends, repeats, n, h, block, device="cuda"):
    """The kernels_gpu section's markdown from the rows measured so far."""
    rows = table["rows"]
    header = ["D", "mask", "density asked (kept blocks)", "best dense (ms)"]
    for backend in backends:
        header += [f"{backend} (ms)", f"{backend} vs best dense"]
    header.append("ideal (best dense x 1/density)")
    r128 = {(r[1], r[2].split()[0]): r for r in rows if r[0] == 128}

    def speed(kind, dens, col):
        try:
            return float(r128[(kind, dens)][col].rstrip("x"))
        except (KeyError, ValueError):
            return None

    def goal(dens, bar):
        got = {b: speed("random", dens, 5 + 2 * i) for i, b in enumerate(backends)
               if b.startswith("triton")}
        best = max((b for b in got if got[b]), key=got.get, default=None)
        figures = ", ".join(f"{b} {x}x" if x else f"{b} failed" for b, x in got.items())
        return f"{figures}: {'met' if best and got[best] >= bar else 'missed'}"

    aims = ("Goals (issue 42, D=128, random blocks): density 1.0 >= 0.9x the best dense call "
            f"({goal('1', 0.9)}); density 0.1 >= 8x ({goal('0.1', 8)}).")
    return (f"GPU {_device_name(device)}, bf16, B=1, H={h}, N={n}, {block}x{block} "
            f"blocks; median of {repeats} after a warm-up, device synchronised around each call. "
            "Best dense: the fastest of the dense calls below, measured in the same run on the "
            "same inputs (causal rows against the dense causal call; their ideal is "
            "0.5 / kept density, the causal half being the dense call's own work). Every "
            "backend's output is checked against the first one's; a backend that raised is "
            "'failed'. The goals are also in benchmarks/results/gpu/kernels_gpu.json.\n\n"
            "Dense attention on this GPU (ms):\n\n"
            + markdown_table(["D", "mask"] + list(DENSE_COLUMNS) + ["fastest"],
                             table["dense_rows"])
            + "\n\n" + markdown_table(header, rows) + "\n\n" + aims + "\n")


def auto_table(points, repeats, n=32768, h=16, block=128):
    """Write `points` as this machine's timing table for `backend="auto"`, then time auto against
    each point's fastest backend, alternately on the same inputs (issue 33's goal: within 5% at
    every measured point)."""
    from mmspec.kernels import tune
    from mmspec.kernels.backends import timings
    from mmspec.kernels.backends.registry import resolve_backend

    repeats = max(repeats, 10)
    sync = torch.cuda.synchronize
    path = timings.write_table(tune.from_points({"device": torch.cuda.get_device_name(),
                                                 "points": points}))
    rows, ratios = [], []
    for d in sorted({p["head_dim"] for p in points}, reverse=True):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, h, n, d, generator=g).to("cuda", torch.bfloat16)
                   for _ in range(3))
        for p in points:
            if p["head_dim"] != d or not p["backends_ms"]:
                continue
            mask = (random_causal_mask if p["mask"] == "causal" else random_block_mask)(
                h, n, block, p["asked"], "cuda")
            fastest = min(p["backends_ms"], key=p["backends_ms"].get)
            chosen = resolve_backend("auto", q, k, v, mask).name
            t_auto, t_fast = timed_pair(
                lambda: block_sparse_attention(q, k, v, mask),
                lambda: block_sparse_attention(q, k, v, mask, backend=fastest), repeats, sync)
            ratios.append(t_auto / t_fast)
            rows.append([d, p["mask"], f"{p['density']:.3f}", fastest, f"{t_fast * 1e3:.2f}",
                         chosen, f"{t_auto * 1e3:.2f}", f"{t_auto / t_fast:.3f}"])
            print("  auto: " + " | ".join(str(c) for c in rows[-1]), flush=True)
        q = k = v = None
    worst = max(ratios)
    return (f"`backend=\"auto\"` from the table these points make (written to {path.name} in "
            "the machine's torch extension folder), timed alternately with each point's fastest "
            f"backend (median of {repeats}):\n\n"
            + markdown_table(["D", "mask", "kept density", "fastest backend", "its ms",
                              "auto's choice", "auto ms", "auto / fastest"], rows)
            + f"\n\nGoal (issue 33): auto within 5% of the fastest backend at every measured "
              f"point: worst {worst:.3f}x ({'met' if worst <= 1.05 else 'missed'}).\n")


DENSE_COLUMNS = ("SDPA default", "SDPA cuDNN", "SDPA flash", "SDPA efficient",
                 "FlashAttention-3", "FlashAttention-2", "FlexAttention (compiled)")


def build_parser() -> argparse.ArgumentParser:
    """The command line (`mmspec bench` reads its options here)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write the table into BENCHMARKS.md")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the GPU tables (every backend vs the best dense call), into "
                             "section kernels_gpu")
    parser.add_argument("--points", default=None,
                        help="also write the measured GPU points to this JSON file")
    parser.add_argument("--head-dims", type=lambda t: tuple(int(x) for x in t.split(",")),
                        default=(128, 64), metavar="128,64",
                        help="with --gpu-only: the head dims, in this order (default 128,64)")
    parser.add_argument("--auto", action="store_true",
                        help="with --gpu-only: write the points as this machine's table for "
                             "backend='auto' and time auto against the fastest backend per point")
    return parser


def main():
    parser = build_parser()
    args = parser.parse_args()
    from contextlib import nullcontext

    header = ["density", "dense (ms)", "block-sparse (ms)", "speedup vs dense"]
    if args.gpu_only:
        if not torch.cuda.is_available():
            parser.error("--gpu-only needs a CUDA device; none is visible")
        def progress(body, points):  # after every row: a run cut short keeps what it measured
            if args.points:
                import json

                with open(args.points, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "points": points}, f,
                              indent=1)
            if args.write:
                write_section("kernels_gpu", "Block-sparse attention kernel on a GPU "
                              "(`benchmarks/kernels.py --gpu-only`)", body)

        body, points = gpu_table(args.repeats, args.head_dims, progress=progress)
        if args.auto:
            body += "\n" + auto_table(points, args.repeats)
            progress(body, points)
        print(body)
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
        body += "\n" + gpu_table(args.repeats)[0]
    else:
        body += ("\nGPU comparison: not run, no CUDA device on this machine (`--gpu-only` on a "
                 "GPU machine writes section kernels_gpu).\n")
    if args.write:
        write_section("kernels", "Block-sparse attention kernel (`benchmarks/kernels.py`)", body)


if __name__ == "__main__":
    main()
