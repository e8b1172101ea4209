"""Adaptive DraftAttention budgets against fixed ones at equal mean density (issue 32 item 3).

    python benchmarks/draft_budgets.py [--write] [--threads 1]

`mode="top_p"` (per query tile the fewest key tiles holding `mass` of the draft map, capped at
`max_density` of the row) and `calibrate=True` (each layer's sparsity set from the last dense
step's draft map so that `mass` of it is kept) against the fixed budgets `global` (the paper's
per-head percentile) and `row`, run at the mean density the adaptive one reached:

1. Synthetic heads (`benchmarks/draft_attention.py::structured_heads`, 21x32x48 tokens, 8x16
   tiles): attention-mass recall (the true softmax mass inside the kept blocks) and the PSNR of
   the attention output against dense, exact on 16 random query tiles (--query-tiles).
2. The zoo video DiT's real maps: q, k, v of every self-attention call of the dense generation of
   prompts 0-1 (steps 5, 6, 10, 15, 19 of 20; step 5 is the last dense step, calibration's
   probe): the same measures, exact over all query tiles, on the sparse steps 6-19.
3. The zoo video DiT end to end: PSNR of each video against the dense one (prompts 0-1, seeds
   0-1, CFG 3, 20 steps, 30% dense warm-up, layer 0 dense), the fixed budgets at the sparse
   layers' mean density of the adaptive run.

Results go to BENCHMARKS.md (section `draft_budgets`) only with --write.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.draft_attention import structured_heads
from benchmarks.report import markdown_table, write_section
from benchmarks.video import PROMPTS, generate
from mmspec.video_dit import DraftAttentionConfig, tile_layout
from mmspec.video_dit.compare import psnr
from mmspec.video_dit.draft_map import (calibrated_sparsity, draft_probs, pool_tiles,
                                        select_blocks)
from mmspec.zoo.registry import load

MASSES = (0.9,)
MAX_DENSITY = 0.5


def draft_map(q, k, layout):
    """fp32 `[1, H, nT, nT]` of q, k `[1, H, N, D]` in token order."""
    return draft_probs(pool_tiles(layout.to_tiles(q), layout), pool_tiles(layout.to_tiles(k),
                                                                          layout),
                       q.shape[-1] ** -0.5)


def score(q, k, v, layout, masks, query_tiles=None):
    """Recall and output error power of each block mask `[H, nT, nT]` on one call, exact on the
    sampled query tiles (all with None): {name: (kept mass summed over rows, error power)},
    rows, reference power and peak."""
    qt, kt, vt = (layout.to_tiles(x)[0] for x in (q, k, v))  # [H, N, D] tile order
    h, n, d = qt.shape
    nt, bk = layout.num_tiles, layout.tile_tokens
    tiles = torch.arange(nt) if query_tiles is None else torch.randperm(
        nt, generator=torch.Generator().manual_seed(1))[:query_tiles].sort().values
    sums = {name: [0.0, 0.0] for name in masks}
    ref2, peak, rows_done = 0.0, 0.0, 0
    values = vt.view(h, nt, bk, d)
    for chunk in tiles.split(max(1, 1024 // bk)):
        rows = (chunk[:, None] * bk + torch.arange(bk)).flatten()
        p = torch.softmax(qt[:, rows] @ kt.transpose(-1, -2) * d**-0.5, -1).view(h, -1, nt, bk)
        mass = p.sum(-1)  # [H, R, nT]
        num = torch.einsum("hrjk,hjkd->hrjd", p, values)  # [H, R, nT, D]
        ref = num.sum(2)
        ref2, peak = ref2 + float(ref.pow(2).sum()), max(peak, float(ref.abs().max()))
        rows_done += len(rows)
        for name, kept in masks.items():
            keep = kept[:, chunk].repeat_interleave(bk, dim=1).float()  # [H, R, nT]
            kept_mass = (mass * keep).sum(-1)
            out = (num * keep[..., None]).sum(2) / kept_mass.clamp_min(1e-30)[..., None]
            sums[name][0] += float(kept_mass.sum())
            sums[name][1] += float((out - ref).pow(2).sum())
    return sums, rows_done * h, ref2, peak, d


def adaptive_vs_fixed(calls, layout, calibration=None, query_tiles=None):
    """Rows [method, density, recall, output PSNR dB] over `calls` [(layer, q, k, v)]: top_p at
    each mass, and (with `calibration`, {layer: (q, k)} of the probe step) calibrate, each
    followed by global and row at its mean density."""
    own = torch.eye(layout.num_tiles, dtype=torch.bool)
    maps = [draft_map(q, k, layout) for _, q, k, _ in calls]
    groups = []
    for mass in MASSES:
        adaptive = [select_blocks(p, 0.0, "top_p", mass=mass, max_density=MAX_DENSITY,
                                  own=own)[0] for p in maps]
        groups.append((f"top_p, mass {mass}", adaptive))
        if calibration is not None:
            sparsity = {layer: float(calibrated_sparsity(draft_map(q, k, layout), mass,
                                                         MAX_DENSITY))
                        for layer, (q, k) in calibration.items()}
            groups.append((f"calibrate, mass {mass} (global)",
                           [select_blocks(p, sparsity[c[0]], "global")[0]
                            for c, p in zip(calls, maps)]))
    rows = []
    for name, adaptive in groups:
        density = float(torch.stack([m.float().mean() for m in adaptive]).mean())
        methods = {name: adaptive}
        for mode in ("global", "row"):
            methods[f"{mode} at equal density"] = [select_blocks(p, 1 - density, mode)[0]
                                                   for p in maps]
        totals = {m: [0.0, 0.0, 0.0] for m in methods}  # kept mass, error power, density
        n_rows = ref2 = 0.0
        peak = 0.0
        for i, (_, q, k, v) in enumerate(calls):
            sums, rows_i, ref2_i, peak_i, _ = score(q, k, v, layout,
                                                    {m: masks[i] for m, masks in methods.items()},
                                                    query_tiles)
            n_rows, ref2, peak = n_rows + rows_i, ref2 + ref2_i, max(peak, peak_i)
            for m in methods:
                totals[m][0] += sums[m][0]
                totals[m][1] += sums[m][1]
                totals[m][2] += float(methods[m][i].float().mean()) / len(calls)
        d = calls[0][1].shape[-1]
        for m, (kept, err2, dens) in totals.items():
            mse = err2 / (n_rows * d)
            rows.append([m, f"{dens:.3f}", f"{kept / n_rows:.3f}",
                         f"{10 * math.log10(peak**2 / mse):.2f}"])
    return rows


def synthetic_section(query_tiles):
    grid, tile = (21, 32, 48), (8, 16)
    layout = tile_layout(grid, tile)
    q, k, v, names = structured_heads(grid, 128)
    rows = adaptive_vs_fixed([(0, q, k, v)], layout, query_tiles=query_tiles)
    return (f"### 1. Synthetic heads ({grid[0]}x{grid[1]}x{grid[2]} = {math.prod(grid):,} tokens, "
            f"{tile[0]}x{tile[1]} tiles = {layout.num_tiles} draft tokens; heads "
            f"{', '.join(names)})\n\nExact on {query_tiles} random query tiles. Density: share of blocks "
            f"kept (own blocks included); recall: true softmax mass inside them; PSNR of the "
            f"attention output against dense (peak = the largest |output|).\n\n"
            + markdown_table(["method", "density", "recall", "output PSNR dB"], rows))


def real_section(pipe, size, steps):
    grid = (size[0], size[1] // 2, size[2] // 2)
    layout = tile_layout(grid, (4, 4))
    captured = []
    for i, prompt in enumerate(PROMPTS[:2]):
        store = []
        generate(pipe, prompt, i, size, steps, 3.0, capture=((5, 6, 10, 15, 19), store))
        captured.append(store)
    rows_all = []
    for store in captured:  # the probe step's calls calibrate that run's sparse steps
        calls, probe = [], {}
        for step, layer, q, k, v in store:
            for b in range(q.shape[0]):  # the CFG batch: each row is one call
                one = (q[b:b + 1], k[b:b + 1], v[b:b + 1])
                if step == 5:
                    probe.setdefault(layer, []).append(one[:2])
                elif layer > 0:  # layer 0 stays dense in generation
                    calls.append((layer, *one))
        probe = {layer: (torch.cat([q for q, _ in qk]), torch.cat([k for _, k in qk]))
                 for layer, qk in probe.items() if layer > 0}
        rows_all.append((calls, probe))
    calls = [c for calls, _ in rows_all for c in calls]
    # calibration per run, scored over both runs: one table, the runs' calls pooled
    rows = []
    for calls_i, probe in rows_all:
        rows.append(adaptive_vs_fixed(calls_i, layout, probe))
    merged = []
    for j in range(len(rows[0])):
        cells = [r[j] for r in rows]
        merged.append([cells[0][0]] + [f"{np.mean([float(c[i]) for c in cells]):.3f}"
                                       for i in (1, 2, 3)])
    return (f"### 2. The zoo video DiT's real maps ({grid[0]}x{grid[1]}x{grid[2]} = "
            f"{math.prod(grid):,} tokens, 4x4 tiles = {layout.num_tiles} draft tokens, 2 heads)"
            f"\n\nDense generation of prompts 0-1 (CFG 3, {steps} steps): the sparse layers "
            f"(1-2) at steps 6, 10, 15, 19, each CFG row one call ({len(calls)} calls); exact "
            f"over all query tiles; calibrate probes step 5 of the same run (the last dense "
            f"step). Mean of the two runs' figures.\n\n"
            + markdown_table(["method", "density", "recall", "output PSNR dB"], merged))


def video_section(pipe, size, steps, prompts):
    dense = [generate(pipe, p, i, size, steps, 3.0)["video"] for i, p in enumerate(prompts)]
    rows = []
    tile = (4, 4)
    adaptive = [(f"top_p, mass {m}", dict(mode="top_p", mass=m)) for m in MASSES]
    adaptive += [(f"calibrate, mass {m} (global)", dict(calibrate=True, mass=m)) for m in MASSES]
    for name, kw in adaptive:
        runs = [generate(pipe, p, i, size, steps, 3.0,
                         DraftAttentionConfig(tile=tile, max_density=MAX_DENSITY, **kw))
                for i, p in enumerate(prompts)]
        density = float(np.mean([r["sparse_density"] for r in runs]))
        group = [(name, runs)]
        for mode in ("global", "row"):
            group.append((f"{mode} at equal density", [
                generate(pipe, p, i, size, steps, 3.0,
                         DraftAttentionConfig(sparsity=1 - density, tile=tile, mode=mode))
                for i, p in enumerate(prompts)]))
        for method, runs in group:
            p = [psnr(d, r["video"]) for d, r in zip(dense, runs)]
            rows.append([method, f"{np.mean([r['sparse_density'] for r in runs]):.3f}",
                         f"{np.mean(p):.2f} / {np.min(p):.2f}"])
            print(rows[-1], flush=True)
    return (f"### 3. The zoo video DiT end to end ({size[0]} frames of {size[1]}x{size[2]})\n\n"
            f"Prompts 0-{len(prompts) - 1} (seeds = index), CFG 3, {steps} Euler steps, 30% "
            f"dense warm-up, layer 0 dense, 4x4 tiles, max_density {MAX_DENSITY}. Density: mean "
            f"kept-block share of the sparse calls; PSNR of each video against the dense one "
            f"(uint8).\n\n"
            + markdown_table(["method", "density (sparse calls)", "video PSNR dB (mean / min)"],
                             rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--query-tiles", type=int, default=16, help="synthetic query tiles scored")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    entry = load("video-dit")
    pipe, spec = entry.model, entry.card["spec"]
    pipe.set_progress_bar_config(disable=True)
    size, steps = (spec["frames"], spec["height"], spec["width"]), 20
    parts = [synthetic_section(args.query_tiles)]
    print(parts[-1], flush=True)
    parts.append(real_section(pipe, size, steps))
    print(parts[-1], flush=True)
    parts.append(video_section(pipe, size, steps, PROMPTS[:2]))
    print(parts[-1], flush=True)
    body = (f"`mode=\"top_p\"` and `calibrate=True` (max_density {MAX_DENSITY}) against "
            f"`global` and `row` at the density the adaptive budget reached.\n\n"
            + "\n\n".join(parts))
    if args.write:
        write_section("draft_budgets", "DraftAttention: adaptive budgets (top_p, calibrate) "
                      "against fixed ones (`benchmarks/draft_budgets.py`)", body)


if __name__ == "__main__":
    main()
