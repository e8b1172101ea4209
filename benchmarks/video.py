"""The zoo video DiT with dense attention vs DraftAttention (issue 7), and DraftAttention's block
selection on its real attention maps (issue 3).

    python benchmarks/video.py [--write] [--plot] [--quick] [--threads 1]

1. Quality: `mmspec.zoo.load("video-dit")` generates the same prompts from the same seeds at its
   default grid, the first it was trained on (4 frames of 32x32 pixels = 4x16x16 tokens, the
   zoo's (4, 4) tiles = 64 draft tokens; `benchmarks/video_grids.py` covers the other sizes),
   20 Euler steps, CFG 3, dense and with DraftAttention (default warm-up: 30% dense steps, layer
   0 dense) at several sparsities, modes global and row. PSNR and SSIM of each sparse video
   against its dense twin (`mmspec.video_dit.compare`). Bar: PSNR >= 25 dB at 90% sparsity.
2. Speed: one generation at a grid large enough for sparse attention to pay on a CPU (16 frames
   of 64x64 pixels = 16x32x32 = 16,384 tokens, (8, 16) tiles = 128-token blocks as in the paper),
   5 steps (step 0 dense), no CFG, dense vs 75% and 90%. Every self-attention call (`attn1`
   forward, projections included) is timed with hooks; the table gives the attention time of the
   sparse calls, of all calls, and the end-to-end time, each as dense / sparse, and the PSNR of
   that generation against dense. Bar: attention >= 5x faster at 90%.
3. Fidelity on real maps: q, k, v (after norm and RoPE) of every self-attention layer of the
   dense generation of section 1 are captured at a few steps; on each call, attention-mass recall
   and relative output error of draft-global, draft-row, a local window, random blocks and the
   oracle at equal block budget (`benchmarks/draft_attention.py::fidelity_of`, exact over all
   query tiles), averaged over calls.

Results go to BENCHMARKS.md (sections `video` and `draft_attention_real`) only with --write;
--plot writes `benchmarks/plots/video_density_psnr.png` and `video_frames.png`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.draft_attention import _tile_sizes, fidelity_of, tile_name
from benchmarks.report import check_plot_deps, markdown_table, write_section
from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, remove_draft_attention
from mmspec.video_dit import tile_layout
from mmspec.video_dit.compare import psnr, ssim
from mmspec.video_dit.processors import _wan_rope
from mmspec.video_dit.video_io import to_uint8
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.registry import ZOO_VIDEO_TILE, load

PLOTS = Path(__file__).resolve().parent / "plots"
PROMPTS = ("a red circle moving right", "a blue square moving down", "a yellow triangle moving left",
           "a green circle moving up", "a white square moving right", "a red triangle moving down")


class AttentionTimer:
    """Wall time of every `attn1` forward of a Wan transformer, in call order."""

    def __init__(self, transformer):
        self.times, self._start, self.handles = [], None, []
        for block in transformer.blocks:
            self.handles.append(block.attn1.register_forward_pre_hook(self._pre))
            self.handles.append(block.attn1.register_forward_hook(self._post))

    def _pre(self, module, args):
        self._start = time.perf_counter()

    def _post(self, module, args, output):
        self.times.append(time.perf_counter() - self._start)

    def remove(self):
        for h in self.handles:
            h.remove()


class QKVCapture:
    """Processor wrapper that keeps q, k, v `[B, H, N, D]` (after norm and RoPE) of chosen steps."""

    def __init__(self, original, layer, steps, store, counter):
        self.original, self.layer, self.steps, self.store, self.counter = (
            original, layer, steps, store, counter)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        step = self.counter[0]
        if encoder_hidden_states is None and step in self.steps:
            q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
            k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
            v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
            q, k = _wan_rope(q, *rotary_emb), _wan_rope(k, *rotary_emb)
            self.store.append((step, self.layer, *(x.transpose(1, 2).clone() for x in (q, k, v))))
        return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


def generate(pipe, prompt, seed, size, steps, guidance, config=None, timer=False, capture=None,
             perturb=0.0):
    """One video `[F, H, W, 3]` uint8 plus seconds, density and attention times.

    perturb: add `perturb` x another standard normal (seed + 10^6) to the initial noise.
    """
    frames, height, width = size
    latents = torch.randn((1, 3, frames, height, width), generator=torch.Generator().manual_seed(seed))
    if perturb:
        latents += perturb * torch.randn(latents.shape,
                                         generator=torch.Generator().manual_seed(seed + 10**6))
    state = apply_draft_attention(pipe, config) if config is not None else None
    attn_timer = AttentionTimer(pipe.transformer) if timer else None
    counter, originals = [0], {}
    if capture is not None:
        for layer, block in enumerate(pipe.transformer.blocks):
            originals[block.attn1] = block.attn1.processor
            block.attn1.set_processor(QKVCapture(block.attn1.processor, layer, capture[0],
                                                 capture[1], counter))

    def on_step_end(p, i, t, kw):
        counter[0] += 1
        return {}

    start = time.perf_counter()
    out = pipe(prompt, num_frames=frames, height=height, width=width, num_inference_steps=steps,
               guidance_scale=guidance, latents=latents,
               callback_on_step_end=on_step_end).frames[0]
    seconds = time.perf_counter() - start
    for module, proc in originals.items():
        module.set_processor(proc)
    result = {"video": to_uint8(out), "seconds": seconds,
              "density": state.mean_density() if state is not None else 1.0,
              "sparse_density": None, "attn": attn_timer.times if timer else None}
    if state is not None:
        sparse = [r.density for r in state.records if r.density < 1.0]
        result["sparse_density"] = float(np.mean(sparse)) if sparse else 1.0
        remove_draft_attention(pipe)
    if attn_timer is not None:
        attn_timer.remove()
    return result


# --------------------------------------------------------------------------------- 1. quality


def dense_runs(pipe, prompts, size, steps, capture_steps):
    """The dense video of each prompt (seed = its index, CFG 3), and q, k, v of every
    self-attention call at `capture_steps` in the runs of prompts 0-1."""
    dense, captured = [], []
    for i, prompt in enumerate(prompts):
        store = []
        dense.append(generate(pipe, prompt, i, size, steps, 3.0,
                              capture=(capture_steps, store) if i < 2 else None))
        captured += store
    return dense, captured


def quality(pipe, prompts, size, steps, tile, sparsities, capture_steps):
    dense, captured = dense_runs(pipe, prompts, size, steps, capture_steps)
    # control: how far the dense sampler itself moves when its initial noise moves by 1%
    nudged = [generate(pipe, p, i, size, steps, 3.0, perturb=0.01) for i, p in enumerate(prompts)]
    control = {"psnr": float(np.mean([psnr(d["video"], r["video"]) for d, r in zip(dense, nudged)])),
               "ssim": float(np.mean([ssim(d["video"], r["video"]) for d, r in zip(dense, nudged)]))}
    print("control", control, flush=True)
    rows, videos = [], {("dense", 0.0): dense[0]["video"]}
    for mode in ("global", "row"):
        for s in sparsities:
            cfg = DraftAttentionConfig(sparsity=s, tile=tile, mode=mode)
            runs = [generate(pipe, p, i, size, steps, 3.0, cfg) for i, p in enumerate(prompts)]
            videos[(mode, s)] = runs[0]["video"]
            p = [psnr(d["video"], r["video"]) for d, r in zip(dense, runs)]
            rows.append({"mode": mode, "sparsity": s, "psnr": float(np.mean(p)),
                         "psnr_min": float(np.min(p)),
                         "ssim": float(np.mean([ssim(d["video"], r["video"])
                                                for d, r in zip(dense, runs)])),
                         "sparse_density": float(np.mean([r["sparse_density"] for r in runs])),
                         "density": float(np.mean([r["density"] for r in runs]))})
            print(rows[-1], flush=True)
    return rows, videos, captured, control


# ----------------------------------------------------------------------------------- 2. speed


def speed(pipe, prompt, size, steps, tile, sparsities, capture_steps):
    """Timing rows, sparse and total call counts, and q, k, v captured in the dense run's last
    step after it was timed (a separate run, so the capture does not count in the timing)."""
    dense_steps, dense_layers = 1, 1
    n_layers = len(pipe.transformer.blocks)
    # warm-up: the first sparse call may build the fused CPU kernel; the first dense call allocates
    generate(pipe, prompt, 0, size, 2, 1.0, DraftAttentionConfig(
        sparsity=0.9, tile=tile, dense_steps=dense_steps, dense_layers=dense_layers))
    dense = generate(pipe, prompt, 0, size, steps, 1.0, timer=True)
    captured = []
    generate(pipe, prompt, 0, size, max(capture_steps) + 1, 1.0, capture=(capture_steps, captured))
    sparse_pos = [i for i in range(len(dense["attn"]))
                  if i // n_layers >= dense_steps and i % n_layers >= dense_layers]
    rows = []
    for s in sparsities:
        cfg = DraftAttentionConfig(sparsity=s, tile=tile, dense_steps=dense_steps,
                                   dense_layers=dense_layers)
        run = generate(pipe, prompt, 0, size, steps, 1.0, cfg, timer=True)
        d_sparse = sum(dense["attn"][i] for i in sparse_pos)
        s_sparse = sum(run["attn"][i] for i in sparse_pos)
        rows.append({"sparsity": s, "density": run["sparse_density"],
                     "dense_call_ms": 1e3 * d_sparse / len(sparse_pos),
                     "sparse_call_ms": 1e3 * s_sparse / len(sparse_pos),
                     "attn_sparse_ratio": d_sparse / s_sparse,
                     "attn_all_ratio": sum(dense["attn"]) / sum(run["attn"]),
                     "attn_share_dense": sum(dense["attn"]) / dense["seconds"],
                     "e2e_dense_s": dense["seconds"], "e2e_sparse_s": run["seconds"],
                     "e2e_ratio": dense["seconds"] / run["seconds"],
                     "psnr": psnr(dense["video"], run["video"]),
                     "ssim": ssim(dense["video"], run["video"])})
        print(rows[-1], flush=True)
    return rows, len(sparse_pos), len(dense["attn"]), captured


# ----------------------------------------------------------------------- 3. real-map fidelity


def real_fidelity(captured, grid, tile, sparsities, query_tiles=None, query_tile=None):
    layout = tile_layout(grid, tile, query_tile=query_tile)
    acc = {}
    for step, layer, q, k, v in captured:
        for b in range(q.shape[0]):
            rows, _, nt = fidelity_of(q[b:b + 1], k[b:b + 1], v[b:b + 1], layout, sparsities,
                                      query_tiles=query_tiles or layout.num_query_tiles)
            for r in rows:
                a = acc.setdefault((r["sparsity"], r["method"]), {"recall": [], "error": [],
                                                                   "density": [], "by_layer": {}})
                a["recall"].append(r["recall"])
                a["error"].append(r["error"])
                a["density"].append(r["density"])
                a["by_layer"].setdefault(layer, []).append(r["recall"])
    out = []
    for (s, m), a in acc.items():
        out.append({"sparsity": s, "method": m, "density": float(np.mean(a["density"])),
                    "recall": float(np.mean(a["recall"])), "recall_min": float(np.min(a["recall"])),
                    "error": float(np.mean(a["error"])),
                    "by_layer": {l: float(np.mean(x)) for l, x in sorted(a["by_layer"].items())}})
    return out, layout.num_tiles


def tile_report(pipe, prompts, size, grid, steps, tiles, capture_steps, sparsity=0.9):
    """Real-map fidelity and video PSNR at one sparsity for each tile (or query tile over tile):
    q, k, v captured in the dense runs of prompts 0-1 (as section 1), the videos of every
    prompt against the dense video of its seed, draft-global, the other defaults of
    DraftAttentionConfig (30% dense warm-up, layer 0 dense)."""
    dense, captured = dense_runs(pipe, prompts, size, steps, capture_steps)
    methods = ("draft-global", "draft-row", "local window", "random", "oracle (global)")
    rows = []
    for item in tiles:
        tile, query_tile = (item, None) if len(item) == 2 else (item[2:], item[:2])
        layout = tile_layout(grid, tile, query_tile=query_tile)
        fid, _ = real_fidelity(captured, grid, tile, (sparsity,), query_tile=query_tile)
        by = {r["method"]: r for r in fid}
        cfg = DraftAttentionConfig(sparsity=sparsity, tile=tile, query_tile=query_tile)
        runs = [generate(pipe, p, i, size, steps, 3.0, cfg) for i, p in enumerate(prompts)]
        p = [psnr(d["video"], r["video"]) for d, r in zip(dense, runs)]
        bound = by["oracle (global)"]["recall"]
        rows.append([tile_name(layout)] + [f"{by[m]['recall']:.3f}" for m in methods]
                    + [f"{by['draft-global']['recall'] / bound:.0%}",
                       f"{by['draft-global']['error']:.3f}",
                       f"{np.mean(p):.2f} / {np.min(p):.2f}"])
        print(rows[-1], flush=True)
    n_calls = sum(c[2].shape[0] for c in captured)
    t, h, w = grid
    return (
        f"Real attention maps of the zoo `video-dit` as in section `draft_attention_real` "
        f"(dense generation of prompts 0-1, steps {', '.join(map(str, capture_steps))} of "
        f"{steps}, both CFG rows: {n_calls} attention calls of {t}x{h}x{w} = {t * h * w:,} "
        f"tokens, exact over all query tiles) at sparsity {sparsity:.0%} for each tile (QHxQW "
        f"over THxTW: query tiles of whole tiles); and the videos of {len(prompts)} prompts "
        f"generated with `DraftAttentionConfig(sparsity={sparsity}, tile=..., query_tile=...)` "
        f"(draft-global, first 30% of steps and layer 0 dense) against the dense video of the "
        f"same seed, PSNR mean / worst prompt.\n\n"
        + markdown_table(["tile (tokens per block)", *(f"recall {m}" for m in methods),
                          "draft-global / bound", "rel. error draft-global",
                          "PSNR dB draft-global"], rows))


# ------------------------------------------------------------------------------------ plots


def heads(pipe) -> str:
    n = pipe.transformer.config.num_attention_heads
    return f"{n} head{'s' if n != 1 else ''}"


def model_steps(card: dict) -> int:
    """Training steps of a video-dit card, the fine-tuned-from entries' (`init_from`) included."""
    steps = card["training"]["steps"]
    return steps + (model_steps(card["init_from"]["card"]) if "init_from" in card else 0)


def plot(rows, videos, out_dir: Path, grid, tile) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, marker in (("global", "o"), ("row", "s")):
        r = [x for x in rows if x["mode"] == mode]
        ax.plot([x["sparse_density"] for x in r], [x["psnr"] for x in r], marker=marker,
                label=f"draft-{mode}")
    ax.axhline(25, color="grey", ls=":", label="bar 25 dB")
    ax.set_xlabel("kept-block density in sparse layers")
    ax.set_ylabel("PSNR vs dense (dB)")
    ax.set_title(f"video-dit, {grid[0]}x{grid[1]}x{grid[2]} tokens, {tile[0]}x{tile[1]} tiles "
                 f"(the zoo preset's)")
    ax.legend()
    ax.grid(alpha=0.3)
    paths = [out_dir / "video_density_psnr.png"]
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    keys = [("dense", 0.0)] + [("global", s) for s in sorted({k[1] for k in videos if k[0] == "global"})]
    strip = np.concatenate([np.concatenate(list(videos[k]), axis=1) for k in keys], axis=0)
    fig, ax = plt.subplots(figsize=(6, 1.5 * len(keys)))
    ax.imshow(strip, interpolation="nearest")
    h = videos[keys[0]].shape[1]
    ax.set_yticks([h * (i + 0.5) for i in range(len(keys))])
    ax.set_yticklabels(["dense"] + [f"{int(k[1] * 100)}%" for k in keys[1:]])
    ax.set_xticks([])
    ax.set_title(f"'{PROMPTS[0]}', seed 0: frames left to right")
    paths.append(out_dir / "video_frames.png")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


# ------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The command line (`mmspec bench` reads its options here)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the BENCHMARKS.md sections")
    p.add_argument("--plot", action="store_true", help=f"write PNG charts into {PLOTS}")
    p.add_argument("--quick", action="store_true", help="small shapes, a smoke run")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--zoo-dir", type=Path, default=ZOO_DIR)
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--tiles", default="",
                   help="only real-map fidelity and PSNR at 90%% for each tile, or query tile "
                        "over tile, e.g. 4x4,2x4,4x4/2x4, at the training grid, into section "
                        "draft_attention_real_tiles")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    tiles = _tile_sizes(args.tiles) if args.tiles else None
    if args.tiles and not tiles:
        p.error(f"--tiles takes THxTW tile sizes, or QHxQW/THxTW (query tile over tile, whole "
                f"tiles), joined by commas, e.g. 4x4,4x4/2x4; got {args.tiles!r}")
    check_plot_deps(args.plot)
    torch.set_num_threads(args.threads)
    entry = load("video-dit", args.zoo_dir)
    pipe, spec = entry.model, entry.card["spec"]
    pipe.set_progress_bar_config(disable=True)
    size = (spec["frames"], spec["height"], spec["width"])
    grid = (size[0], size[1] // 2, size[2] // 2)
    if args.quick:
        prompts, steps, sparsities, big, big_steps = PROMPTS[:2], 4, (0.75, 0.9), (4, 32, 64), 3
        capture_steps = (1, 3)
    else:
        prompts, steps, sparsities, big, big_steps = PROMPTS[:4], 20, (0.5, 0.75, 0.9, 0.95), (16, 64, 64), 5
        capture_steps = (6, 10, 15, 19)  # the sparse steps (0-5 are the 30% dense warm-up)
    tile, big_tile = ZOO_VIDEO_TILE, (8, 16)  # the zoo's tile (video_dit.generate's on it)
    if tiles:
        body = tile_report(pipe, prompts, size, grid, steps, tiles, capture_steps)
        print(body)
        if args.write:
            write_section("draft_attention_real_tiles", "DraftAttention on real attention maps "
                          "against the tile size (`benchmarks/video.py --tiles`)", body)
        return
    bn = big[0] * (big[1] // 2) * (big[2] // 2)
    trained_tokens = ", ".join(f"{f}x{h // 2}x{w // 2}" for f, h, w in pipe.trained_grids) + (
        " tokens")
    load0 = os.getloadavg()

    t0 = time.time()
    qrows, videos, captured, control = quality(pipe, prompts, size, steps, tile, sparsities, capture_steps)
    fid, n_tiles = real_fidelity(captured, grid, tile, (0.75, 0.9, 0.95))
    quality_s = time.time() - t0
    srows = []
    if not args.skip_speed:
        load1 = os.getloadavg()
        srows, n_sparse, n_calls, big_captured = speed(pipe, prompts[0], big, big_steps, big_tile,
                                                       (0.75, 0.9), (1, big_steps - 1))
        big_grid = (big[0], big[1] // 2, big[2] // 2)
        big_fid, big_tiles = real_fidelity(big_captured, big_grid, big_tile, (0.75, 0.9, 0.95),
                                           query_tiles=32)

    q_table = markdown_table(
        ["mode", "sparsity", "kept-block density (sparse layers)", "computed share (whole run)",
         "PSNR dB (mean / min)", "SSIM"],
        [[r["mode"], f"{int(r['sparsity'] * 100)}%", f"{r['sparse_density']:.3f}",
          f"{r['density']:.3f}", f"{r['psnr']:.2f} / {r['psnr_min']:.2f}", f"{r['ssim']:.4f}"]
         for r in qrows])
    at90 = {r["mode"]: r for r in qrows if r["sparsity"] == 0.9}
    bar_q = "; ".join(f"draft-{m}: {r['psnr']:.2f} dB → **{'met' if r['psnr'] >= 25 else 'missed'}**"
                      for m, r in at90.items())
    body = (
        f"Model: `mmspec.zoo.load(\"video-dit\")` (tiny WanTransformer3DModel, pixel space, "
        f"{pipe.transformer.config.num_layers} layers, {heads(pipe)} of "
        f"{pipe.transformer.config.attention_head_dim}). Threads: {args.threads}. "
        f"Load average at the start: {load0[0]:.1f} on {os.cpu_count()} CPUs (shared machine).\n\n"
        f"### 1. Quality at the default grid ({size[0]} frames {size[1]}x{size[2]} = "
        f"{grid[0]}x{grid[1]}x{grid[2]} = {grid[0] * grid[1] * grid[2]:,} tokens, {tile[0]}x{tile[1]}"
        f" tiles = {grid[0] * grid[1] * grid[2] // (tile[0] * tile[1])} draft tokens)\n\n"
        f"{len(prompts)} prompts, seeds 0..{len(prompts) - 1}, {steps} Euler steps, CFG 3 (batch 2), "
        f"DraftAttentionConfig defaults otherwise (first 30% of steps dense, layer 0 dense). "
        f"PSNR / SSIM of each sparse video against the dense video of the same seed (uint8, "
        f"`mmspec.video_dit.compare`); mean over prompts (and the worst prompt's PSNR).\n\n"
        + q_table
        + f"\n\nControl (no DraftAttention): dense with its initial noise nudged by 1% "
          f"(+ 0.01·N(0, 1)) against dense: PSNR {control['psnr']:.2f} dB, SSIM "
          f"{control['ssim']:.4f}: the sampler itself is stable, so the PSNR drop above comes "
          f"from the attention the sparse layers drop (section `draft_attention_real` measures "
          f"how much of the model's attention mass 10% of the blocks can hold at this grid)."
          f"\n\nBar at 90% sparsity, PSNR ≥ 25 dB: {bar_q}.\n"
    )
    if srows:
        s_table = markdown_table(
            ["sparsity", "kept-block density", "attn call ms dense → sparse",
             "attention (sparse calls) dense/sparse", "attention (all calls) dense/sparse",
             "end to end dense/sparse", "PSNR dB", "SSIM"],
            [[f"{int(r['sparsity'] * 100)}%", f"{r['density']:.3f}",
              f"{r['dense_call_ms']:.0f} → {r['sparse_call_ms']:.0f}",
              f"**{r['attn_sparse_ratio']:.2f}x**", f"{r['attn_all_ratio']:.2f}x",
              f"{r['e2e_ratio']:.2f}x ({r['e2e_dense_s']:.0f} s → {r['e2e_sparse_s']:.0f} s)",
              f"{r['psnr']:.2f}", f"{r['ssim']:.4f}"] for r in srows])
        r90 = next(r for r in srows if r["sparsity"] == 0.9)
        body += (
            f"\n### 2. Speed at a generation grid of {big[0]} frames {big[1]}x{big[2]} = "
            f"{big[0]}x{big[1] // 2}x{big[2] // 2} = {bn:,} tokens, {big_tile[0]}x{big_tile[1]} tiles "
            f"({big_tile[0] * big_tile[1]}-token blocks), CPU\n\n"
            f"Prompt '{prompts[0]}', seed 0, {big_steps} steps, no CFG, step 0 and layer 0 dense "
            f"({n_sparse} of {n_calls} self-attention calls sparse). Each `attn1` forward is timed "
            f"(projections included). Small problems do not get faster on a CPU (below 2^18 "
            f"q·kv the kernel is dense masked SDPA), hence this grid, "
            f"{bn / (grid[0] * grid[1] * grid[2]):g}x the grid of section 1: the model was "
            f"trained on {trained_tokens}, so this is timing at a size it extrapolates to "
            f"through RoPE, and its PSNR is against the dense output at the same size. Load "
            f"average at the start of this part: {load1[0]:.1f}; dense share of the end-to-end "
            f"time spent in self-attention: {100 * srows[0]['attn_share_dense']:.0f}%.\n\n"
            + s_table
            + f"\n\nBar at 90%, attention ≥ 5x faster: sparse calls "
              f"{r90['attn_sparse_ratio']:.2f}x → **{'met' if r90['attn_sparse_ratio'] >= 5 else 'missed'}**.\n"
        )
    def fid_table(fid):
        return markdown_table(
            ["sparsity", "method", "density", "recall", "recall (worst call)", "recall per layer",
             "rel. error"],
            [[f"{int(r['sparsity'] * 100)}%", r["method"], f"{r['density']:.3f}",
              f"{r['recall']:.3f}", f"{r['recall_min']:.3f}",
              " / ".join(f"{x:.2f}" for x in r["by_layer"].values()), f"{r['error']:.3f}"]
             for r in fid])

    def reading(fid, card):
        f90 = {r["method"]: r for r in fid if r["sparsity"] == 0.9}
        bound = f90["oracle (global)"]["recall"]
        order = sorted(("draft-global", "draft-row", "local window", "random"),
                       key=lambda m: -f90[m]["recall"])
        return (
            f"the global oracle (each head's heaviest blocks of the true map; no mask with this "
            f"budget keeps more) keeps {bound:.3f} of the mass at 90%, so "
            + ("no block mask reaches 0.9 on these maps either" if bound < 0.9 else
               "a block mask can reach 0.9 on these maps")
            + f": this {model_steps(card)}-step "
            f"model's heads spread their mass "
            f"{'far more evenly than' if bound < 0.8 else 'more evenly than, or as evenly as,'} "
            f"the synthetic heads (section `draft_attention`). Recall at 90% ranks "
            f"{' > '.join(order)}; draft-global keeps {f90['draft-global']['recall'] / bound:.0%} "
            f"of the bound.")

    def fid_verdict(fid):
        f90 = {r["method"]: r for r in fid if r["sparsity"] == 0.9}
        base = max(f90["local window"]["recall"], f90["random"]["recall"])
        base_err = min(f90["local window"]["error"], f90["random"]["error"])
        return "; ".join(
            f"{m}: recall {f90[m]['recall']:.3f}, error {f90[m]['error']:.3f} → **"
            + ("met" if f90[m]["recall"] >= 0.9 and f90[m]["recall"] > base
               and f90[m]["error"] < base_err else "missed") + "**"
            for m in ("draft-global", "draft-row")) + (
            f". Oracle recall at 90%: {f90['oracle']['recall']:.3f}")

    n_calls_cap = sum(c[2].shape[0] for c in captured)
    real = (
        f"Real attention maps: q, k, v (after RMS norm and RoPE) of every self-attention layer of "
        f"the zoo `video-dit` during the dense generation of `benchmarks/video.py` section 1 "
        f"(prompts 0-1, steps {', '.join(map(str, capture_steps))} of {steps}, conditional and "
        f"unconditional CFG rows): {n_calls_cap} attention calls of {grid[0]}x{grid[1]}x{grid[2]} "
        f"= {grid[0] * grid[1] * grid[2]:,} tokens, {tile[0]}x{tile[1]} tiles = {n_tiles} draft "
        f"tokens, {heads(pipe)}. Same measures and methods "
        f"as the synthetic table above (`fidelity_of`), exact over all query tiles, averaged over "
        f"calls (min = worst call); recall per layer in layer order (layer 0 is the dense layer in "
        f"generation but is scored here too).\n\n"
        + fid_table(fid)
        + f"\n\nBar at 90% (recall ≥ 0.9, beats window and random in recall and error): "
          f"{fid_verdict(fid)}.\n"
        + f"\nReading: {reading(fid, entry.card)}\n"
    )
    if srows:
        real += (
            f"\nAt the generation grid of section 2 ({big_grid[0]}x{big_grid[1]}x{big_grid[2]} = "
            f"{bn:,} tokens, {big_tile[0]}x{big_tile[1]} tiles = {big_tiles} draft tokens; dense "
            f"run, no CFG, steps 1 and {big_steps - 1} of {big_steps}, {len(big_captured)} calls; "
            f"exact on {min(32, big_tiles)} random query tiles of {big_tiles} per call):\n\n"
            + fid_table(big_fid)
            + f"\n\nAt 90%: {fid_verdict(big_fid)}.\n"
        )
    print(body)
    print(real)
    print(f"quality + capture + fidelity took {quality_s:.0f} s")
    if args.plot:
        for path in plot(qrows, videos, PLOTS, grid, tile):
            print("wrote", path)
        body += ("\nCharts: `benchmarks/plots/video_density_psnr.png` (PSNR vs density), "
                 "`benchmarks/plots/video_frames.png` (dense vs global-mode sparse frames, "
                 "prompt 0).\n")
    if args.write:
        write_section("video", "Video zoo DiT: dense vs DraftAttention (`benchmarks/video.py`)", body)
        write_section("draft_attention_real",
                      "DraftAttention fidelity on real attention maps (`benchmarks/video.py`)", real)


if __name__ == "__main__":
    main()
