"""The zoo video DiT at every size its card says it was trained on: not noise, and DraftAttention
close to dense there.

    python benchmarks/video_grids.py --threads 2 --write [--card]    # the shipped entry
    python benchmarks/video_grids.py --zoo-dir DIR --grids 4x32x32 --dense-only   # another
    python benchmarks/video_grids.py --tiles 4x4 2x4 --write   # other tiles, side by side
    python benchmarks/video_grids.py --speed --tiles 4x4 2x4 --write

For each grid (frames x height x width in pixels; default the card's `training.grids`) and each
prompt, a dense video and, unless `--dense-only`, one with DraftAttention at 90% sparsity and the
zoo's tile (`mmspec.zoo.registry.ZOO_VIDEO_TILE`, defaults otherwise), from the same seed; with
`--tiles`, one per tile given (section `video_grids_tiles`; the card takes none of them).
Reported per grid:

- the frames' pixel mean and standard deviation (in [0, 1], over all pixels of all prompts) and
  their roughness (mean |difference| of horizontally adjacent pixels), beside the same figures of
  the training clips at that size (`mmspec.zoo.clips`, the 16 held-out seeds): a model off its
  sizes made dark noise (mean far below the clips', roughness far above);
- PSNR of the sparse video against the dense one (`mmspec.video_dit.compare.psnr`, uint8),
  mean and worst prompt.

With `--speed`, instead: per grid, the first prompt's generation timed dense and with
DraftAttention at 90% for each tile, side by side in one run (after an untimed warm-up of each),
end to end and per self-attention call (`attn1` forward, projections included); written to section
`video_grids_speed`.

`--card` writes the figures into the entry's card (`quality`); `--write` into BENCHMARKS.md
(section `video_grids`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

if __package__ in (None, ""):  # `python benchmarks/video_grids.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table, write_section
from benchmarks.video import AttentionTimer
from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, remove_draft_attention
from mmspec.video_dit.compare import psnr
from mmspec.video_dit.video_io import to_uint8
from mmspec.zoo.cards import read_card, write_card
from mmspec.zoo.clips import HELDOUT_SEED, clip_batch
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.registry import ZOO_VIDEO_TILE, load

PROMPTS = ("a red circle moving right", "a blue square moving down", "a yellow triangle moving left",
           "a white circle moving up")


def frame_stats(frames: np.ndarray) -> dict:
    """float `[..., H, W, 3]` in [0, 1] -> mean, std and roughness (mean |x[w+1] - x[w]|)."""
    return {"mean": float(frames.mean()), "std": float(frames.std()),
            "roughness": float(np.abs(np.diff(frames, axis=-2)).mean())}


def clip_stats(grid) -> dict:
    videos, _ = clip_batch(range(HELDOUT_SEED, HELDOUT_SEED + 16), *grid)  # [B, 3, F, H, W]
    return frame_stats(((videos + 1) / 2).permute(0, 2, 3, 4, 1).numpy())


def measure(pipe, grid, prompts, steps: int, dense_only: bool, tiles=(ZOO_VIDEO_TILE,)) -> dict:
    """The figures of one grid; those of DraftAttention per tile in `tiles` (the first one's
    also at the top level, as the card holds them)."""
    frames, height, width = grid
    call = dict(num_frames=frames, height=height, width=width, num_inference_steps=steps)
    dense, sparse = [], {tile: ([], []) for tile in tiles}  # tile: (videos, densities)
    for i, prompt in enumerate(prompts):
        dense.append(pipe(prompt, **call, generator=torch.Generator().manual_seed(i)).frames[0])
        if dense_only:
            continue
        for tile in tiles:
            state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.9, tile=tile))
            try:
                sparse[tile][0].append(pipe(prompt, **call,
                                            generator=torch.Generator().manual_seed(i)).frames[0])
            finally:
                remove_draft_attention(pipe)
            sparse[tile][1].append(state.sparse_density())
    out = {"dense": frame_stats(np.stack(dense)), "clips": clip_stats(grid)}
    if dense_only:
        return out
    out["tiles"] = {}
    for tile, (videos, density) in sparse.items():
        scores = [psnr(to_uint8(d), to_uint8(s)) for d, s in zip(dense, videos)]
        out["tiles"]["x".join(map(str, tile))] = dict(
            sparse=frame_stats(np.stack(videos)), psnr_90_mean=float(np.mean(scores)),
            psnr_90_min=float(np.min(scores)), sparse_density=float(np.mean(density)))
    out.update(out["tiles"]["x".join(map(str, tiles[0]))])
    return out


def timed_run(pipe, prompt, call, config=None) -> dict:
    """One generation: seconds end to end, each `attn1` forward's seconds in call order, and
    which calls DraftAttention made sparse (None for dense)."""
    state = apply_draft_attention(pipe, config) if config is not None else None
    timer = AttentionTimer(pipe.transformer)
    try:
        start = time.perf_counter()
        frames = pipe(prompt, **call, generator=torch.Generator().manual_seed(0)).frames[0]
        seconds = time.perf_counter() - start
    finally:
        timer.remove()
        if state is not None:
            remove_draft_attention(pipe)
    sparse = None if state is None else [r.sparse for r in state.records]
    return {"seconds": seconds, "attn": timer.times, "sparse": sparse, "frames": frames,
            "density": None if state is None else state.sparse_density()}


def speed(pipe, grid, prompt, steps: int, tiles, repeats: int) -> dict:
    """Dense against DraftAttention (90%, each tile) on one prompt at one grid: the modes run in
    turn `repeats` times; each keeps its fastest end-to-end time and, per self-attention call,
    that call's fastest time over the repeats (a shared machine only adds time)."""
    frames, height, width = grid
    call = dict(num_frames=frames, height=height, width=width, num_inference_steps=steps)
    configs = {"x".join(map(str, t)): DraftAttentionConfig(sparsity=0.9, tile=t) for t in tiles}
    warm = dict(call, num_inference_steps=2)  # builds the CPU kernel, allocates
    for config in (None, *configs.values()):
        timed_run(pipe, prompt, warm, config)
    best = {}
    for _ in range(repeats):
        for name, config in (("dense", None), *configs.items()):
            run = timed_run(pipe, prompt, call, config)
            if name in best:
                run["seconds"] = min(run["seconds"], best[name]["seconds"])
                run["attn"] = [min(a, b) for a, b in zip(run["attn"], best[name]["attn"])]
            best[name] = run
    dense = best["dense"]
    out = {"dense_s": dense["seconds"], "attn_share": sum(dense["attn"]) / dense["seconds"],
           "tiles": {}}
    for name in configs:
        run = best[name]
        pos = [i for i, s in enumerate(run["sparse"]) if s]
        d_sparse, s_sparse = (sum(r["attn"][i] for i in pos) for r in (dense, run))
        out["tiles"][name] = {
            "density": run["density"], "sparse_calls": len(pos), "calls": len(run["attn"]),
            "dense_call_ms": 1e3 * d_sparse / len(pos), "sparse_call_ms": 1e3 * s_sparse / len(pos),
            "attn_sparse_ratio": d_sparse / s_sparse,
            "attn_all_ratio": sum(dense["attn"]) / sum(run["attn"]),
            "e2e_s": run["seconds"], "e2e_ratio": dense["seconds"] / run["seconds"],
            "psnr": psnr(to_uint8(dense["frames"]), to_uint8(run["frames"]))}
    return out


def speed_report(pipe, grids, prompt, steps: int, tiles, threads: int, repeats: int) -> str:
    load0, t0 = os.getloadavg()[0], time.time()
    rows = []
    for grid in grids:
        r = speed(pipe, grid, prompt, steps, tiles, repeats)
        print(grid, r, flush=True)
        tokens = grid[0] * (grid[1] // 2) * (grid[2] // 2)
        for name, t in r["tiles"].items():
            th, tw = (int(v) for v in name.split("x"))
            rows.append([f"{grid[0]} frames of {grid[1]}x{grid[2]} ({tokens:,} tokens)",
                         f"{name} ({th * tw}-token blocks)", f"{t['density']:.3f}",
                         f"{t['dense_call_ms']:.1f} → {t['sparse_call_ms']:.1f}",
                         f"**{t['attn_sparse_ratio']:.2f}x**", f"{t['attn_all_ratio']:.2f}x",
                         f"{t['e2e_ratio']:.2f}x ({r['dense_s']:.1f} s → {t['e2e_s']:.1f} s)",
                         f"{100 * r['attn_share']:.0f}%", f"{t['psnr']:.2f}"])
    table = markdown_table(
        ["size", "tile", "kept-block density (sparse calls)", "attn call ms dense → sparse "
         "(sparse calls)", "attention (sparse calls) dense/sparse", "attention (all calls) "
         "dense/sparse", "end to end dense/sparse", "dense time in self-attention",
         "PSNR dB vs dense"], rows)
    one = next(iter(r["tiles"].values()))
    return (f"Prompt '{prompt}', seed 0, {steps} Euler steps, CFG 3; DraftAttention at 90% "
            f"sparsity, first 30% of steps and layer 0 dense ({one['sparse_calls']} of "
            f"{one['calls']} self-attention calls sparse). After an untimed 2-step warm-up of "
            f"each mode, dense and each tile ran in turn {repeats} times; each figure is the "
            f"fastest of the {repeats}, end to end and per `attn1` forward (each call's own "
            f"fastest, projections included). Threads: {threads}; load average at "
            f"the start {load0:.1f} on {os.cpu_count()} CPUs; {time.time() - t0:.0f} s.\n\n"
            f"{table}\n")


def parse_tile(text: str) -> tuple[int, int]:
    try:
        tile = tuple(int(v) for v in text.split("x"))
    except ValueError:
        tile = ()
    if len(tile) != 2 or min(tile) < 1:
        raise argparse.ArgumentTypeError(f"must be HEIGHTxWIDTH in latent tokens such as 4x4, "
                                         f"got {text!r}")
    return tile


def parse_grid(text: str) -> tuple[int, int, int]:
    try:
        grid = tuple(int(v) for v in text.split("x"))
    except ValueError:
        grid = ()
    if len(grid) != 3 or min(grid) < 1:
        raise argparse.ArgumentTypeError(f"must be FRAMESxHEIGHTxWIDTH such as 4x32x32, got "
                                         f"{text!r}")
    return grid


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo-dir", type=Path, default=ZOO_DIR)
    p.add_argument("--grids", type=parse_grid, nargs="+", default=None,
                   help="default: the card's training.grids")
    p.add_argument("--prompts", type=int, default=2, help=f"how many of {len(PROMPTS)}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dense-only", action="store_true", help="frame statistics only")
    p.add_argument("--tiles", type=parse_tile, nargs="+", default=None,
                   help="DraftAttention tiles side by side (default: the zoo's); with any, "
                        "--write writes section video_grids_tiles and --card is refused")
    p.add_argument("--speed", action="store_true",
                   help="time dense against each tile's DraftAttention instead (first prompt); "
                        "--write writes section video_grids_speed")
    p.add_argument("--repeats", type=int, default=3, help="with --speed: runs per mode, fastest "
                   "kept")
    p.add_argument("--card", action="store_true", help="write the figures into the card")
    p.add_argument("--write", action="store_true", help="write section video_grids")
    return p


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tiles is not None and args.card:
        parser.error("--card records the zoo's tile; run it without --tiles")
    if args.speed and (args.card or args.dense_only):
        parser.error("--speed times generations only; run it without --card and --dense-only")
    tiles = args.tiles or [ZOO_VIDEO_TILE]
    torch.set_num_threads(args.threads)
    entry = load("video-dit", args.zoo_dir)
    pipe = entry.model
    pipe.set_progress_bar_config(disable=True)
    grids = args.grids or list(pipe.trained_grids)
    prompts = PROMPTS[:args.prompts]
    if args.speed:
        body = speed_report(pipe, grids, prompts[0], args.steps, tiles, args.threads,
                            args.repeats)
        print(body)
        if args.write:
            write_section("video_grids_speed", "The zoo video DiT at its trained sizes, speed "
                          "against the tile (`benchmarks/video_grids.py --speed`)", body)
        return
    load0, t0 = os.getloadavg()[0], time.time()
    results = {}
    for grid in grids:
        start = time.time()
        results["%dx%dx%d" % grid] = measure(pipe, grid, prompts, args.steps, args.dense_only,
                                             tuple(tiles))
        print(f"{grid}: {results['%dx%dx%d' % grid]} ({time.time() - start:.0f} s)", flush=True)
    trained = {tuple(g) for g in pipe.trained_grids}

    def row(name, r):
        d, c = r["dense"], r["clips"]
        grid = tuple(int(v) for v in name.split("x"))
        cells = [f"{grid[0]} frames of {grid[1]}x{grid[2]}" + ("" if grid in trained else
                                                                 " (not trained)"),
                 f"{d['mean']:.3f} / {c['mean']:.3f}", f"{d['std']:.3f} / {c['std']:.3f}",
                 f"{d['roughness']:.3f} / {c['roughness']:.3f}"]
        for t in r.get("tiles", {}).values():
            cells += [f"{t['sparse_density']:.3f}",
                      f"{t['psnr_90_mean']:.2f} / {t['psnr_90_min']:.2f}"]
        return cells

    head = ["size", "mean, dense / clips", "std, dense / clips", "roughness, dense / clips"]
    names = ["x".join(map(str, t)) for t in tiles]
    if not args.dense_only:
        for name in names:
            suffix = "" if args.tiles is None else f", {name} tiles"
            head += [f"kept-block density (sparse steps){suffix}",
                     f"PSNR dB at 90% (mean / min){suffix}"]
    table = markdown_table(head, [row(k, r) for k, r in results.items()])
    tile = " / ".join(names) + (" (the zoo's)" if args.tiles is None else "")
    where = Path(os.path.relpath(args.zoo_dir.resolve(), Path(__file__).resolve().parent.parent))
    body = (f"Model: `video-dit` from {where}, trained at "
            f"{', '.join('x'.join(map(str, g)) for g in pipe.trained_grids)} (frames x height x "
            f"width; card `training`). "
            f"{len(prompts)} prompts, seeds 0..{len(prompts) - 1}, {args.steps} Euler steps, "
            f"CFG 3. Frame statistics of the dense videos in [0, 1] beside those of the 16 "
            f"held-out training clips at the same size; DraftAttention at 90% sparsity with "
            f"{tile} tiles, first 30% of steps and layer 0 dense, against dense from "
            f"the same seed. Threads: {args.threads}; load average at the start {load0:.1f} on "
            f"{os.cpu_count()} CPUs; {time.time() - t0:.0f} s.\n\n{table}\n")
    print(body)
    if args.write and args.tiles is None:
        write_section("video_grids", "The zoo video DiT at its trained sizes "
                      "(`benchmarks/video_grids.py`)", body)
    elif args.write:
        write_section("video_grids_tiles", "The zoo video DiT at its trained sizes, tiles side "
                      "by side (`benchmarks/video_grids.py --tiles`)", body)
    if args.card:
        card = read_card(entry.path)
        card["quality"] = {
            "note": f"benchmarks/video_grids.py: {len(prompts)} prompts, {args.steps} steps, CFG "
                    f"3; frame mean / std / roughness of the dense videos beside the held-out "
                    f"clips'; PSNR of DraftAttention (90%, {names[0]} tiles) against dense",
            **{k: {kk: (round(vv, 4) if isinstance(vv, float) else
                        {a: round(b, 4) for a, b in vv.items()})
                   for kk, vv in r.items() if kk != "tiles"}
               for k, r in results.items()}}
        write_card(entry.path, card)


if __name__ == "__main__":
    main()
