"""DraftAttention benchmarks: overhead, fidelity on structured attention, speed (issue 3).

    python benchmarks/draft_attention.py [--write] [--quick]

1. Overhead: tile reorder, pooling, draft map, block selection and BlockSparseMask construction as
   a share of one dense attention call, at 32,256 video tokens (Wan2.1 512x768x81f: 21x32x48
   latent tokens, 8x16 tiles = 252 draft tokens), one head of dim 128, CPU. Bar: <= 5%.
2. Fidelity: a synthetic workload with spatio-temporal locality (a local head, a same-frame head,
   a same-place head and a mixed head, each with 4 sink keys) on the same 21x32x48 grid. For each
   sparsity, the attention-mass recall (share of the true softmax probability inside the kept
   blocks, averaged over queries and heads) and the relative output error ||O_s - O|| / ||O|| of
   draft-global, draft-row, a local window and random blocks at equal block budget, next to an
   oracle that keeps each query tile's heaviest key tiles by the true mass and a global oracle
   that keeps each head's heaviest blocks of the whole true map (the most mass any mask with that
   many blocks can hold: mean recall is the kept blocks' mass over all queries), and a shared
   oracle that pools the heads' budgets (the bound for any split of the work among the heads).
   Bar: recall >= 0.9 for both draft modes at 90% sparsity, and both beat window and random.
3. Speed: the sparse kernel call (draft mask at 90% sparsity) and the whole DraftAttention call
   vs dense SDPA, same shapes as 1.
4. GPU end to end (only on a CUDA machine): one denoising step (one transformer forward, CFG batch
   of 2, bf16) of a Wan2.1-T2V-1.3B-sized `WanTransformer3DModel` (30 layers, 12 heads of 128,
   FFN 8960; random weights: the timing does not depend on them) on the same 21x32x48 latent grid,
   dense vs DraftAttention at 75% and 90% sparsity (layer 0 dense, as the paper). `wan_step`
   runs the same code on any device; tests/video_dit exercise it on CPU at a tiny size.

Results go to BENCHMARKS.md (section `draft_attention`) only with --write.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_results import GOALS, record
from benchmarks.report import markdown_table, timed_interleaved, write_section
from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.video_dit import draft_attention, tile_layout
from mmspec.video_dit import DraftAttentionConfig, fused_draft
from mmspec.video_dit.draft_map import (block_budget, draft_probs, pool_query_tiles, pool_tiles,
                                        select_blocks)
from mmspec.video_dit.generate import check_compile_backend


# ------------------------------------------------------------------------------ 1 and 3: timing


def overhead_and_speed(grid, tile, heads, dim, sparsity, reps, device="cpu", dtype=torch.float32,
                       query_tile=None):
    """Seconds per call of dense SDPA, each part of DraftAttention's overhead, the sparse kernel
    call and the whole `draft_attention` call: the fastest of `reps` calls each (a shared CPU:
    the fastest call is the least noisy), all timed in turn in every round."""
    layout = tile_layout(grid, tile, device=device, query_tile=query_tile)
    own = layout.own_blocks() if layout.asymmetric else None
    blocks = (layout.query_tile_tokens, layout.tile_tokens)
    n = layout.num_tokens
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, dim, generator=g).to(device, dtype) for _ in range(3))
    scale = dim**-0.5

    qt, kt, vt = (layout.to_tiles(x) for x in (q, k, v))
    q_hat, k_hat = pool_query_tiles(qt, layout), pool_tiles(kt, layout)
    probs = draft_probs(q_hat, k_hat, scale)
    kept = select_blocks(probs, sparsity, "global", own=own)
    mask = BlockSparseMask.from_dense(kept, blocks, n, n)
    out_t = block_sparse_attention(qt, kt, vt, mask)
    parts = {
        "reorder q, k, v and restore the output": lambda: (
            [layout.to_tiles(x) for x in (q, k, v)], layout.from_tiles(out_t)),
        "pool q and k per tile": lambda: (pool_query_tiles(qt, layout), pool_tiles(kt, layout)),
        "draft map softmax(q_hat k_hat^T)": lambda: draft_probs(q_hat, k_hat, scale),
        "block selection (global)": lambda: select_blocks(probs, sparsity, "global", own=own),
        "block selection (row)": lambda: select_blocks(probs, sparsity, "row", own=own),
        "BlockSparseMask from the block map": lambda: BlockSparseMask.from_dense(
            kept, blocks, n, n),
    }
    fused = {}
    if torch.device(device).type == "cuda":  # the fused draft (the interpreter is no timing)
        def fused_call(mode):  # pooling through the tile permutation: q and k in model order
            drafted = fused_draft.draft_blocks(q, k, layout, sparsity, mode, scale, untiled=True)
            return BlockSparseMask.from_full_lists(drafted.counts, drafted.indices, blocks, n, n)

        fused = {f"fused: pool + draft map + selection + index ({mode})":
                 (lambda mode=mode: fused_call(mode)) for mode in ("global", "row")}
    torch_draft = DraftAttentionConfig(tile=layout.tile, query_tile=layout.query_tile,
                                       draft_kernel="torch")
    order = layout.perm
    calls = {
        "dense": lambda: F.scaled_dot_product_attention(q, k, v),
        **parts,
        **fused,
        "sparse_call": lambda: block_sparse_attention(qt, kt, vt, mask),
        "sparse_call_gathered": lambda: block_sparse_attention(q, k, v, mask, token_order=order),
        "whole": lambda: draft_attention(q, k, v, layout, sparsity=sparsity),
        "whole_reorder": lambda: layout.from_tiles(draft_attention(
            *(layout.to_tiles(x) for x in (q, k, v)), layout, sparsity=sparsity, tiled=True)[0]),
        "whole_torch_draft": lambda: draft_attention(q, k, v, layout, torch_draft,
                                                     sparsity=sparsity),
    }
    calls = working(calls)
    t = timed_interleaved(calls, reps, device_sync(device), reduce=min)
    failed = float("nan")  # a call that raised: "failed" in its row
    agree = failed  # the no-reorder path's output against the reorder path's, max abs
    if "whole" in calls and "whole_reorder" in calls:
        agree = float((calls["whole"]()[0].float() - calls["whole_reorder"]().float()).abs().max())
    return {"n": n, "layout": layout, "dense": t["dense"], "agree": agree,
            "costs": {name: t.get(name, failed) for name in parts},
            "fused": {name: t.get(name, failed) for name in fused},
            "density": mask.density(),
            **{name: t.get(name, failed) for name in ("sparse_call", "sparse_call_gathered",
                                                      "whole", "whole_reorder",
                                                      "whole_torch_draft")}}


def working(calls: dict) -> dict:
    """The calls that run once without raising (a Triton compile error, a backend's constraint);
    the others are printed and left out, so that one failing call costs only its own row."""
    kept = {}
    for name, call in calls.items():
        try:
            call()
            kept[name] = call
        except Exception as err:  # any failure of one call is its row's "failed"
            print(f"{name}: failed ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:120] if str(err) else ''})", flush=True)
    return kept


# ------------------------------------------------------ joint attention with padded text, CPU


def padded_text_report(grid, tile, text=(1000, 256, 729), valid_text=120, sparsity=0.9, reps=3,
                       dim=128, device="cpu"):
    """HunyuanVideo 1.5's joint attention: video tokens, then its text and image tokens with the
    valid ones first (text-to-video: `valid_text` prompt tokens, no glyph text, image tokens
    masked), 1 head, one sample (its guider runs one forward per CFG branch). The same call
    timed with the text blocks that hold only padding computed (as before 2026-11-25: every text
    block kept a dense row and column) and skipped, alternately (`timed_pair`)."""
    from contextlib import contextmanager

    from benchmarks.kernels import timed_pair
    from mmspec.video_dit import sparse_attention

    layout = tile_layout(grid, tile, device=device)
    n, text_len = layout.num_tokens, sum(text)
    g = torch.Generator().manual_seed(0)
    heads = 16 if torch.device(device).type == "cuda" else 1  # HunyuanVideo 1.5: 16 heads of 128
    dtype = gpu_dtype(device)
    q, k, v = (torch.randn(1, heads, n + text_len, dim, generator=g).to(device, dtype)
               for _ in range(3))
    key_valid = torch.ones(1, n + text_len, dtype=torch.bool, device=device)
    key_valid[:, n + valid_text :] = False
    real = sparse_attention._live_blocks

    @contextmanager
    def padding_computed():
        sparse_attention._live_blocks = lambda *a: torch.ones_like(real(*a))
        try:
            yield
        finally:
            sparse_attention._live_blocks = real

    def call():
        return draft_attention(q, k, v, layout, sparsity=sparsity, text_len=text_len,
                               key_valid=key_valid)

    times = timed_pair(call, call, reps, device_sync(device), ctx_a=padding_computed)
    with padding_computed():
        computed = call()
    skipped = call()
    rows = [[name, f"{float(density):.3f}", f"{seconds * 1e3:.0f}", f"{times[0] / seconds:.2f}x"]
            for name, (_, density), seconds in (("padding computed", computed, times[0]),
                                                ("padding skipped", skipped, times[1]))]
    keep = key_valid[0]  # rows read downstream: video and valid text
    diff = (computed[0][..., keep, :] - skipped[0][..., keep, :]).abs()
    t, h, w = grid
    return (
        f"{n:,} video tokens ({t}x{h}x{w} latent grid: HunyuanVideo 1.5 at 480p, "
        f"{(t - 1) * 4 + 1} frames; "
        f"{tile[0]}x{tile[1]} tiles = {layout.num_tiles} draft tokens) and {text_len:,} text and "
        f"image tokens ({' + '.join(str(x) for x in text)}: prompt, glyph, image) of which the "
        f"first {valid_text} are valid (text-to-video), in {-(-text_len // layout.tile_tokens)} "
        f"blocks; one draft_attention call, {heads} head(s), D={dim}, {str(dtype)[6:]}, "
        f"sparsity {sparsity:.0%}, {device_name(device)}, median of {reps} calls of each, timed "
        f"alternately after a warm-up.\n\n"
        + markdown_table(["text blocks of padding only", "density (share of blocks computed)",
                          "draft_attention ms", "speedup"], rows)
        + f"\n\nThe outputs of the video and valid text rows agree to {float(diff.max()):.1e} "
          f"(max abs); the skipped rows are padding, read by no valid token. Blocks computed: "
          f"{float(computed[1]) / float(skipped[1]):.2f}x fewer, time {times[0] / times[1]:.2f}x "
          f"less on this {'GPU' if torch.device(device).type == 'cuda' else 'CPU'}. "
          f"Image-to-video keeps its image tokens valid, so fewer blocks are skipped.\n")


# ----------------------------------------------------------------------- 4: Wan step, on a GPU

WAN_1_3B = {"num_layers": 30, "num_attention_heads": 12, "attention_head_dim": 128, "ffn_dim": 8960}


def wan_step(device, dtype, grid, sparsities, reps=3, tile=(8, 16), batch=2, text_tokens=512,
             config_kw=None, compile=None, draft_kernels=("auto",), no_reorder=False,
             per_layer=False, **arch):
    """Time one forward of a `WanTransformer3DModel` (`arch` overrides `WAN_1_3B`) on latents of
    token grid `grid` (T, H, W): dense, then under `apply_draft_attention` at each sparsity (step
    0 sparse, layer 0 dense). Returns rows {sparsity, density, ms, speedup} and the dense ms;
    times are medians of `reps` after a warm-up, with the device synchronised. `compile`: a
    torch.compile backend for every block (fullgraph, as diffusers' `compile_repeated_blocks`),
    dense and sparse alike. `no_reorder`: also each sparsity with `permute_once=False`;
    `per_layer`: also each with `gathered_loads=False` (`dense_vs_draft`)."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 1.3B weights in seconds on a GPU
        model = WanTransformer3DModel(patch_size=(1, 2, 2), in_channels=16, out_channels=16,
                                      **{"text_dim": 4096, "freq_dim": 256, **WAN_1_3B, **arch})
    model = _cast(model, device, dtype)
    t, h, w = grid
    g = torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(batch, 16, t, 2 * h, 2 * w, generator=g).to(device, dtype),
        "encoder_hidden_states": torch.randn(batch, text_tokens, model.config.text_dim,
                                             generator=g).to(device, dtype),
        "timestep": torch.full((batch,), 500.0, device=device),
    }
    return dense_vs_draft(model, inputs, sparsities, tile, reps, config_kw, compile, draft_kernels,
                          no_reorder, per_layer)


COGVIDEOX_2B = {"num_layers": 30, "num_attention_heads": 30, "attention_head_dim": 64}


def cogvideox_step(device, dtype, grid, sparsities, reps=3, tile=(8, 16), batch=2, config_kw=None,
                   compile=None, draft_kernels=("auto",), no_reorder=False, per_layer=False,
                   **arch):
    """`wan_step` for a `CogVideoXTransformer3DModel` (`arch` overrides `COGVIDEOX_2B`: sincos
    positions, no RoPE) with its 226 text tokens in front of the video in joint attention."""
    from diffusers import CogVideoXTransformer3DModel

    t, h, w = grid
    torch.manual_seed(0)
    model = _cast(CogVideoXTransformer3DModel(
        in_channels=16, out_channels=16, time_embed_dim=512, text_embed_dim=4096, patch_size=2,
        sample_width=2 * w, sample_height=2 * h, sample_frames=4 * (t - 1) + 1,
        max_text_seq_length=226, **{**COGVIDEOX_2B, **arch}), device, dtype)
    g = torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(batch, t, 16, 2 * h, 2 * w, generator=g).to(device, dtype),
        "encoder_hidden_states": torch.randn(batch, 226, 4096, generator=g).to(device, dtype),
        "timestep": torch.full((batch,), 500, device=device, dtype=torch.long),
    }
    return dense_vs_draft(model, inputs, sparsities, tile, reps, config_kw, compile, draft_kernels,
                          no_reorder, per_layer)


def _cast(model, device, dtype):
    """Like from_pretrained(dtype=...): the modules diffusers keeps in fp32 stay fp32."""
    from mmspec.zoo.video_pipeline import cast_keeping_fp32

    return cast_keeping_fp32(model, dtype, device).eval()


def dense_vs_draft(model, inputs, sparsities, tile, reps, config_kw=None, compile=None,
                   draft_kernels=("auto",), no_reorder=False, per_layer=False):
    """Median ms of `model(**inputs)` dense, then under DraftAttention at each sparsity and each
    of `draft_kernels` (`DraftAttentionConfig.draft_kernel`); with `no_reorder`, also the first
    of them with `permute_once=False`: no reorder once per forward either, every sparse layer
    reads q, k, v through the tile permutation (row "reorder": "none"; the others "once per
    forward" where frames are whole tiles, else "none" too); with `per_layer`, also the first
    with `gathered_loads=False`: where tokens stay in the model's order, every sparse layer
    copies q, k, v into tile order and the output back (row "reorder": "per layer"). With
    `compile` (a backend) every
    transformer block is compiled first (the warm-up compiles)."""
    from mmspec.video_dit import (
        DraftAttentionConfig,
        apply_draft_attention,
        remove_draft_attention,
    )

    device = next(model.parameters()).device
    sync = device_sync(device)
    if compile is not None:
        for name in ("blocks", "transformer_blocks"):
            for block in getattr(model, name, ()):
                block.compile(fullgraph=True, backend=compile)

    def run():
        with torch.no_grad():
            out = model(**inputs, return_dict=False)[0]
        sync()
        return out

    def median_ms():
        run()  # warm-up: kernel compilation, allocator
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[len(times) // 2]

    dense_ms = median_ms()
    rows = []
    variants = [(kernel, True, True) for kernel in draft_kernels]
    variants += [(draft_kernels[0], False, True)] if no_reorder else []
    variants += [(draft_kernels[0], True, False)] if per_layer else []
    for s in sparsities:
        for kernel, once, gathered in variants:
            state = apply_draft_attention(model, DraftAttentionConfig(
                sparsity=s, tile=tile, dense_steps=0, dense_layers=1,
                **{"draft_kernel": kernel, "permute_once": once, "gathered_loads": gathered,
                   **(config_kw or {})}))
            try:
                ms = median_ms()
            except Exception as err:  # a failing path is its own row's "failed"
                print(f"DraftAttention {s:.0%}, draft_kernel={kernel!r}: failed "
                      f"({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''})",
                      flush=True)
                ms = float("nan")
            finally:
                remove_draft_attention(model)
            sparse = [float(r.density) for r in state.records if r.density < 1.0]
            rows.append({"sparsity": s, "draft_kernel": kernel, "ms": ms, "permute_once": once,
                         "gathered_loads": gathered,
                         # what the forwards did (apply.py: whole tiles, permute_once, a
                         # family that can reorder), not what the config asked for
                         "reorder": "once per forward" if state.tiled_forwards
                         else "none" if gathered else "per layer",
                         "density": sum(sparse) / max(len(sparse), 1), "speedup": dense_ms / ms})
    return rows, dense_ms


STEPS = 50  # a denoising run (Wan's and HunyuanVideo's default step count)


def run_speedup(step_speedup: float, steps: int = STEPS) -> float:
    """The whole denoising loop's speedup from one sparse step's, with the default dense
    warm-up (`DraftAttentionConfig().dense_steps`, 15 of 50 steps) at the dense step's cost;
    text encoder and VAE decode not counted."""
    dense = DraftAttentionConfig().dense_step_count(steps)
    return steps / (dense + (steps - dense) / step_speedup)


# ----------------------------------------------------------------------------- 2: fidelity


def structured_heads(grid, dim, seed=0):
    """q, k, v `[1, 4, N, dim]` whose logits q.k/sqrt(dim) encode spatio-temporal locality.

    A squared distance -w (c_i - c_j)^2 per coordinate c is the dot product of
    q = [2 w c_i, -w c_i^2, 1] and k = [c_j, 1, -w c_j^2]; a one-hot frame code gives a same-frame
    bonus; a sink coordinate adds a bias to 4 keys; 16 random dims add content noise.
    """
    t, h, w = grid
    n = t * h * w
    g = torch.Generator().manual_seed(seed)
    tt, yy, xx = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    coords = torch.stack([tt, yy, xx], -1).reshape(n, 3).double()
    sinks = torch.randperm(n, generator=g)[:4]
    # per head: (sigma_t, sigma_y, sigma_x) of the distance penalty (inf = none), frame bonus
    specs = {"local": ((1.0, 3.0, 3.0), 0.0), "same-frame": ((math.inf, 12.0, 12.0), 4.0),
             "same-place": ((math.inf, 1.5, 1.5), 0.0), "mixed": ((2.0, 6.0, 6.0), 1.5)}
    qs, ks = [], []
    for (sigmas, frame_bonus) in specs.values():
        qf, kf = [], []
        for c, sigma in enumerate(sigmas):
            wgt = 0.0 if math.isinf(sigma) else 1.0 / (2 * sigma**2)
            ci = coords[:, c]
            qf += [2 * wgt * ci, -wgt * ci**2, torch.ones(n, dtype=torch.float64)]
            kf += [ci, torch.ones(n, dtype=torch.float64), -wgt * ci**2]
        frame = F.one_hot(coords[:, 0].long(), t).double()
        qf.append(frame.T * frame_bonus)
        kf.append(frame.T)
        sink = torch.zeros(n, dtype=torch.float64)
        sink[sinks] = 3.0
        qf.append(torch.ones(1, n, dtype=torch.float64))
        kf.append(sink[None])
        qf = torch.cat([x.reshape(-1, n) for x in qf]).T
        kf = torch.cat([x.reshape(-1, n) for x in kf]).T
        noise = 16
        qn = torch.randn(n, noise, generator=g, dtype=torch.float64) * 0.35
        kn = torch.randn(n, noise, generator=g, dtype=torch.float64) * 0.35
        pad = dim - qf.shape[1] - noise
        qs.append(torch.cat([qf, qn, torch.zeros(n, pad, dtype=torch.float64)], 1) * dim**0.5)
        ks.append(torch.cat([kf, kn, torch.zeros(n, pad, dtype=torch.float64)], 1))
    q = torch.stack(qs)[None].float()
    k = torch.stack(ks)[None].float()
    v = torch.randn(1, len(specs), n, dim, generator=g)
    return q, k, v, list(specs)


def _run_centres(layout, tokens):
    """float64 `[runs, 3]`: (frame, 2 x centre row / th, 2 x centre column / tw) of each run of
    `tokens` slots (a tile or a query tile; no padding), in key-tile units, exact for integers."""
    _, h, w = layout.grid
    runs = layout.perm.view(-1, tokens)
    rows, cols = runs % (h * w) // w, runs % w
    return torch.stack([(runs[:, 0] // (h * w)).double(),
                        (rows.min(1).values + rows.max(1).values).double() / layout.tile[0],
                        (cols.min(1).values + cols.max(1).values).double() / layout.tile[1]], -1)


def window_blocks(layout, grid, tile, budget):
    """The `budget` (query tile, key tile) pairs nearest in (frame, tile row, tile column): for
    query tiles of several tiles, the distance between their centres in tile units."""
    assert not layout.has_padding and layout.grid == tuple(grid) and layout.tile == tuple(tile)
    q_pos = _run_centres(layout, layout.query_tile_tokens)
    k_pos = _run_centres(layout, layout.tile_tokens)
    scale = torch.tensor([1.0, 0.5, 0.5], dtype=torch.float64)
    dist = ((q_pos[:, None] - k_pos[None]).abs() * scale).sum(-1)  # [nQ, nT]; own tiles nearest
    nearest = (-dist).flatten().topk(budget).indices
    kept = torch.zeros(dist.numel(), dtype=torch.bool).scatter_(0, nearest, True)
    return kept.view(dist.shape)


def random_blocks(nt, budget, heads, seed, nq=None):
    nq = nt if nq is None else nq
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(heads, nq * nt, generator=g)
    top = scores.topk(budget, -1).indices
    return torch.zeros(heads, nq * nt, dtype=torch.bool).scatter_(1, top, True).view(heads, nq, nt)


def fidelity(grid, tile, sparsities, query_tiles=32, rows_per_pass=1024):
    """`fidelity_of` the synthetic structured heads on `grid`."""
    layout = tile_layout(grid, tile)
    q, k, v, names = structured_heads(grid, 64)
    result, sampled, nt = fidelity_of(q, k, v, layout, sparsities, query_tiles, rows_per_pass)
    return result, names, sampled, nt


def sharpness_report(grid, tile, scales, sparsity=0.9):
    """Section 2's workload with every head's logits multiplied by each of `scales` (a softmax
    temperature of 1/scale: the same structure, more or less concentrated), at one sparsity."""
    layout = tile_layout(grid, tile)
    q, k, v, _ = structured_heads(grid, 64)
    methods = ("draft-global", "draft-row", "local window", "random", "oracle (global)")
    rows = []
    for scale in scales:
        result, sampled, nt = fidelity_of(q * scale, k, v, layout, [sparsity])
        by = {r["method"]: r for r in result}
        bound = by["oracle (global)"]["recall"]
        met = all(by[m]["recall"] >= 0.9 and all(
            by[m]["recall"] > by[o]["recall"] and by[m]["error"] < by[o]["error"]
            for o in ("local window", "random")) for m in ("draft-global", "draft-row"))
        rows.append([f"{scale:g}"] + [f"{by[m]['recall']:.3f}" for m in methods]
                    + [f"{by['draft-global']['recall'] / bound:.0%}",
                       f"{by['draft-global']['error']:.3f} / {by['draft-row']['error']:.3f}",
                       "met" if met else "missed"])
    header = ["logit scale", *(f"recall {m}" for m in methods), "draft-global / bound",
              "error global / row", "bar"]
    t, h, w = grid
    return (f"Section 2's synthetic heads ({t}x{h}x{w} tokens, {tile[0]}x{tile[1]} tiles, "
            f"exact on {sampled} random query tiles of {nt}) with q scaled by each factor: a "
            f"softmax temperature of 1/scale, so the same local / same-frame / same-place / "
            f"mixed structure and sinks, more or less concentrated. Scale 1 is section 2's "
            f"workload. Sparsity {sparsity:.0%}; 'bar' applies issue 3's rule (both draft modes "
            f"recall >= 0.9 and beat window and random in recall and error).\n\n"
            + markdown_table(header, rows))


def tile_name(layout) -> str:
    """'8x16 (128)', or for query tiles '8x8 over 4x8 (64 / 32)' (tokens per query and key
    block)."""
    (th, tw), (qh, qw) = layout.tile, layout.query_tile
    if not layout.asymmetric:
        return f"{th}x{tw} ({layout.tile_tokens})"
    return f"{qh}x{qw} over {th}x{tw} ({layout.query_tile_tokens} / {layout.tile_tokens})"


def tile_size_report(grid, tiles, sparsity=0.9, reps=3, device="cpu"):
    """Section 2's workload and section 3's call at each tile size: finer blocks keep more of
    the attention mass at the same density (the selection is finer), and each block costs the
    kernel more per token."""
    methods = ("draft-global", "draft-row", "local window", "random", "oracle (global)")
    heads = 12 if torch.device(device).type == "cuda" else 1  # Wan2.1-1.3B's on a GPU
    rows = []
    for tile in tiles:
        tile, query_tile = (tile, None) if len(tile) == 2 else (tile[2:], tile[:2])
        layout = tile_layout(grid, tile, query_tile=query_tile)
        result, sampled, _ = fidelity_of(*structured_heads(grid, 64)[:3], layout, [sparsity])
        by = {r["method"]: r for r in result}
        t = overhead_and_speed(grid, tile, heads=heads, dim=128, sparsity=sparsity,
                               reps=reps, device=device, dtype=gpu_dtype(device),
                               query_tile=query_tile)
        met = all(by[m]["recall"] >= 0.9 and all(
            by[m]["recall"] > by[o]["recall"] and by[m]["error"] < by[o]["error"]
            for o in ("local window", "random")) for m in ("draft-global", "draft-row"))
        draft = (f"{layout.num_query_tiles} x {layout.num_tiles}" if layout.asymmetric
                 else str(layout.num_tiles))
        rows.append([tile_name(layout), draft]
                    + [f"{by[m]['recall']:.3f}" for m in methods]
                    + [f"{t['dense'] / t['sparse_call']:.2f}x", f"{t['dense'] / t['whole']:.2f}x",
                       "met" if met else "missed"])
    header = ["tile (tokens per block)", "draft map", *(f"recall {m}" for m in methods),
              "sparse call vs dense", "draft_attention vs dense", "fidelity bar"]
    t, h, w = grid
    return (f"Section 2's synthetic heads and section 3's call ({heads} head(s), D=128, "
            f"{str(gpu_dtype(device))[6:]}, {device_name(device)}) on the same "
            f"{t}x{h}x{w} grid at sparsity {sparsity:.0%}, for each tile size (QHxQW over THxTW: "
            f"query tiles of whole tiles, query blocks larger than key blocks); recall exact on "
            f"32 random query tiles, speed the fastest of {reps} calls of each, dense SDPA and "
            f"the sparse calls in turn, in the same row. 'fidelity bar' applies issue "
            f"3's rule (both draft modes recall >= 0.9 and beat window and random).\n\n"
            + markdown_table(header, rows))


def true_tile_mass(qt, kt, layout, rows_per_pass=1024):
    """fp32 `[H, nQ, nT]`: the dense softmax mass of each (query tile, key tile) block, summed
    over the query tile's rows; qt, kt `[H, N, D]` in tile order (no padding)."""
    h, n, d = qt.shape
    bq, bk = layout.query_tile_tokens, layout.tile_tokens
    nq, nt = layout.num_query_tiles, layout.num_tiles
    step = max(bq, rows_per_pass // bq * bq)  # whole query tiles per pass
    out = torch.empty(h, nq, nt)
    for start in range(0, n, step):
        stop = min(start + step, n)
        p = torch.softmax(qt[:, start:stop] @ kt.transpose(-1, -2) * d**-0.5, -1)  # [H, R, N]
        out[:, start // bq : stop // bq] = p.view(h, -1, bq, nt, bk).sum((2, 4))
    return out


def fidelity_of(q, k, v, layout, sparsities, query_tiles=32, rows_per_pass=1024):
    """Recall and relative error of each method on one attention call, exact on a random sample
    of query tiles (all of them when `query_tiles` >= the tile count).

    q, k, v: `[1, H, N, D]` in original token order (after RoPE), softmax scale D**-0.5.
    One dense pass over the sampled query rows gives, per (query row, key tile), the softmax mass
    and the mass-weighted value sum; attention restricted to any block mask is then their
    masked sum, renormalised, so every method is scored against the same dense reference.
    Returns (rows of {sparsity, method, density, recall, per_head, error}, sampled query tiles,
    query tiles).
    """
    assert not layout.has_padding
    grid, tile = layout.grid, layout.tile
    h, d, nt, bk = q.shape[1], q.shape[-1], layout.num_tiles, layout.tile_tokens
    nq, bq = layout.num_query_tiles, layout.query_tile_tokens  # = nt, bk without query tiles
    own = layout.own_blocks() if layout.asymmetric else None
    qt, kt, vt = (layout.to_tiles(x)[0] for x in (q, k, v))  # [H, N, D] in tile order
    probs = draft_probs(pool_query_tiles(qt[None], layout), pool_tiles(kt[None], layout),
                        d**-0.5)
    methods = {}
    block_mass = true_tile_mass(qt, kt, layout, rows_per_pass)  # [H, nQ, nT]
    for s in sparsities:
        budget = block_budget(nt, s, nq)
        methods[(s, "draft-global")] = select_blocks(probs, s, "global", own=own)[0]
        methods[(s, "draft-row")] = select_blocks(probs, s, "row", own=own)[0]
        methods[(s, "local window")] = window_blocks(layout, grid, tile, budget).expand(h, -1, -1)
        methods[(s, "random")] = random_blocks(nt, budget, h, seed=int(s * 100), nq=nq)
        # filled per sampled query tile in the pass below; other rows stay at the same count
        methods[(s, "oracle")] = torch.zeros(h, nq, nt, dtype=torch.bool)
        methods[(s, "oracle")][:, :, : round(budget / nq)] = True
        # the heaviest blocks of the whole true map per head, any number per row (the bound for
        # a selection with draft-global's freedom)
        top = block_mass.flatten(1).topk(budget, -1).indices
        methods[(s, "oracle (global)")] = torch.zeros(h, nq * nt, dtype=torch.bool).scatter_(
            1, top, True).view(h, nq, nt)
        # the heaviest blocks of all heads' true maps with the heads' budgets pooled: the bound
        # for any split of the same total work among the heads (a per-head budget schedule)
        top = block_mass.flatten().topk(budget * h).indices
        methods[(s, "oracle (shared)")] = torch.zeros(h * nq * nt, dtype=torch.bool).scatter_(
            0, top, True).view(h, nq, nt)
    gen = torch.Generator().manual_seed(1)
    sample = torch.randperm(nq, generator=gen)[:query_tiles].sort().values
    recall = {m: torch.zeros(h) for m in methods}
    err2 = {m: torch.zeros(h) for m in methods}
    ref2 = torch.zeros(h)
    values = vt.view(h, nt, bk, d)
    per_pass = max(1, rows_per_pass // bq)
    for start in range(0, len(sample), per_pass):
        tiles = sample[start : start + per_pass]  # query tiles of this pass
        rows = (tiles[:, None] * bq + torch.arange(bq)).flatten()
        p = torch.softmax(qt[:, rows] @ kt.transpose(-1, -2) * d**-0.5, -1).view(h, -1, nt, bk)
        mass = p.sum(-1)  # [H, R, nT] softmax mass of each key tile
        num = torch.einsum("hrjk,hjkd->hrjd", p, values)  # [H, R, nT, D]
        ref = num.sum(2)
        ref2 += ref.pow(2).sum((1, 2))
        tile_mass = mass.view(h, len(tiles), bq, nt).sum(2)  # [H, tiles, nT]
        for m, kept in methods.items():
            if m[1] == "oracle":  # the heaviest key tiles of each query tile, by true mass
                top = tile_mass.topk(round(block_budget(nt, m[0], nq) / nq), dim=-1).indices
                rows_kept = torch.zeros_like(tile_mass, dtype=torch.bool).scatter_(-1, top, True)
                kept[:, tiles] = rows_kept
            keep = kept[:, tiles].repeat_interleave(bq, dim=1).float()  # [H, R, nT]
            kept_mass = (mass * keep).sum(-1)  # [H, R]
            out = (num * keep[..., None]).sum(2) / kept_mass.clamp_min(1e-30)[..., None]
            recall[m] += kept_mass.sum(-1)
            err2[m] += (out - ref).pow(2).sum((1, 2))
    n_rows = len(sample) * bq
    result = []
    for (s, name), kept in methods.items():
        per_head = recall[(s, name)] / n_rows
        result.append({"sparsity": s, "method": name, "density": float(kept.float().mean()),
                       "recall": float(per_head.mean()), "per_head": per_head.tolist(),
                       "error": float((err2[(s, name)].sum() / ref2.sum()).sqrt())})
    return result, len(sample), nq


def wan_section(device, grid, tile, quick, compile=None, draft_kernels=None):
    layers = 2 if quick else WAN_1_3B["num_layers"]
    return step_section(
        device, grid, tile, wan_step, {"num_layers": layers},
        f"### 4. GPU end to end: one denoising step of a Wan-sized layer stack, "
        f"{math.prod(grid):,} tokens",
        f"`WanTransformer3DModel`, {layers} layers, 12 heads of 128, FFN 8960 (Wan2.1-T2V-1.3B "
        f"sizes, random weights), {{dtype}}, CFG batch 2, 512 text tokens, latent grid "
        f"{grid[0]}x{grid[1]}x{grid[2]} = {math.prod(grid):,} tokens", compile, draft_kernels)


def cogvideox_section(device, grid, tile, quick, compile=None, draft_kernels=None):
    layers = 2 if quick else COGVIDEOX_2B["num_layers"]
    return step_section(
        device, grid, tile, cogvideox_step, {"num_layers": layers},
        f"### 5. GPU end to end: one denoising step of a CogVideoX-2B-sized layer stack, "
        f"{math.prod(grid):,} video tokens",
        f"`CogVideoXTransformer3DModel`, {layers} layers, 30 heads of 64 (CogVideoX-2B sizes, "
        f"random weights, sincos positions), {{dtype}}, CFG batch 2, 226 text tokens before the "
        f"video in joint attention (dense rows and columns), latent grid "
        f"{grid[0]}x{grid[1]}x{grid[2]}", compile, draft_kernels)


def wan_goal(grid) -> str:
    """Issue 42's name for the Wan step goal at latent grid `grid` (`GOALS`)."""
    return f"Wan step speedup at 90% sparsity, {math.prod(grid):,} tokens"


def step_section(device, grid, tile, step, arch, title, model_text, compile=None,
                 draft_kernels=None):
    """Markdown of `step` (wan_step or cogvideox_step) dense vs 75% and 90% on `device`, the
    draft side fused (the default on CUDA) and in torch ops, each with the whole 50-step run's
    estimate (`run_speedup`); where frames are whole tiles also with no reorder at all
    (`permute_once=False`: the kernel reads through the tile permutation in every sparse layer;
    with padded frames every row runs that way); with `compile` (a torch.compile backend) the
    same again with every block compiled (where the torch draft is traced: `draft_kernel="auto"`
    only)."""
    dtype = gpu_dtype(device)
    kernels = draft_kernels or (("auto", "torch") if torch.device(device).type == "cuda"
                                else ("auto",))
    whole = not tile_layout(grid, tile).has_padding
    rows, dense = step(device, dtype, grid, (0.9, 0.75), tile=tile, draft_kernels=kernels,
                       no_reorder=whole, per_layer=not whole, **arch)
    if step is wan_step and torch.device(device).type == "cuda":  # issue 42's goals
        name = wan_goal(grid)
        at90 = next(r["speedup"] for r in rows if r["sparsity"] == 0.9)
        if name in GOALS["draft_attention_gpu"] and arch.get("num_layers") == 30:
            record("draft_attention_gpu", name, None if math.isnan(at90) else at90,
                   device_name(device))
    names = ({"auto": ", fused draft", "torch": ", torch draft"} if len(kernels) > 1
             else {kernels[0]: ""})

    def name(r):
        return (f"DraftAttention {int(r['sparsity'] * 100)}%{names[r['draft_kernel']]}"
                + ("" if r["permute_once"] else ", permute_once=False")
                + ("" if r["gathered_loads"] else ", gathered_loads=False"))

    table = [["dense (SDPA)", "1.000", f"{dense:.0f}", "1.00x", "1.00x", ""]] + [
        [name(r), f"{r['density']:.3f}", f"{r['ms']:.0f}", f"{r['speedup']:.2f}x",
         f"{run_speedup(r['speedup']):.2f}x", r["reorder"]] if not math.isnan(r["ms"]) else
        [name(r), "", "failed", "", "", r["reorder"]] for r in rows]
    note = ""
    if compile is not None:
        from torch._dynamo import reset

        reset()
        crows, cdense = step(device, dtype, grid, (0.9, 0.75), tile=tile, compile=compile, **arch)
        table += [[f"dense, blocks compiled ({compile})", "1.000", f"{cdense:.0f}",
                   f"{dense / cdense:.2f}x", "", ""]] + [
            [f"DraftAttention {int(r['sparsity'] * 100)}%, blocks compiled", f"{r['density']:.3f}",
             f"{r['ms']:.0f}", f"{dense / r['ms']:.2f}x ({r['speedup']:.2f}x vs compiled dense)",
             f"{run_speedup(r['speedup']):.2f}x vs compiled dense", r["reorder"]]
            for r in crows]
        note = (f" Compiled rows: every block `torch.compile(fullgraph=True, backend={compile!r})`"
                f" (diffusers' `compile_repeated_blocks`), compiled in the warm-up.")
    warm = DraftAttentionConfig().dense_step_count(STEPS)
    return (
        f"{title} ({device_name(device)})\n\n"
        + model_text.format(dtype=str(dtype)[6:])
        + f", {tile[0]}x{tile[1]} tiles; one transformer forward, median of 3 after a warm-up; "
          f"layer 0 dense under DraftAttention. 'fused draft': pooling, draft map, selection and "
          f"block index in Triton (`draft_kernel=\"auto\"` on CUDA); 'torch draft': the same "
          f"in torch ops (`draft_kernel=\"torch\"`). The {STEPS}-step column is an estimate "
          f"from this step's timing, {warm} dense warm-up steps (the default dense_steps=0.3) "
          f"at the dense step's cost and {STEPS - warm} sparse ones: {STEPS} / ({warm} + "
          f"{STEPS - warm} / per-step speedup); text encoder and VAE decode not counted. "
          f"'reorder': 'once per forward' puts the video tokens in tile order after the patch "
          f"embedding and back before unpatchify (frames of whole tiles, the default "
          f"permute_once=True); 'none' never copies them: every sparse layer drafts and attends "
          f"through the tile permutation (padded frames, or permute_once=False); 'per layer' "
          f"(padded frames, gathered_loads=False) copies q, k, v into tile order in every sparse "
          f"layer and the output back.{note}\n\n"
        + markdown_table(["attention", "kept-block density (sparse layers)", "ms per step",
                          "speedup vs dense", f"{STEPS}-step run, {warm} dense (estimate)",
                          "reorder"], table) + "\n")


def device_name(device):
    return torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "CPU"


def gpu_dtype(device):
    """bf16 on a GPU (what video DiTs run in), fp32 for the CPU smoke runs."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def device_sync(device):
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def _ms_share(seconds, dense):
    """(ms, % of dense) cells, "failed" for a call that raised (nan)."""
    if math.isnan(seconds):
        return "failed", ""
    return f"{seconds * 1e3:.3f}", f"{100 * seconds / dense:.2f}%"


def _faster(seconds, dense):
    return "failed" if math.isnan(seconds) else f"{dense / seconds:.2f}x faster"


def overhead_report(device, big_grid, tile, heads=12):
    """Sections 1 and 3 at Wan's 12 heads on `device` (bf16 on a GPU): the draft side's parts,
    fused and in torch ops, with and without the reorder, the sparse call in tile order and
    through the permutation, and the whole call either way; records the draft-side goal."""
    dtype = gpu_dtype(device)
    t = overhead_and_speed(big_grid, tile, heads=heads, dim=128, sparsity=0.9, reps=10,
                           device=device, dtype=dtype)
    dense = t["dense"]
    rows = [[part, *_ms_share(c, dense)] for part, c in t["costs"].items()]
    reorder = t["costs"]["reorder q, k, v and restore the output"]
    unfused = sum(c for part, c in t["costs"].items() if part not in (
        "block selection (row)", "reorder q, k, v and restore the output"))
    # global selection, as the unfused total (no fused timing off CUDA: the --device cpu smoke)
    fused = next(iter(t["fused"].values()), None)
    rows += [[part, *_ms_share(c, dense)] for part, c in t["fused"].items()]
    rows += [["**draft side, torch ops** (pool, map, global selection, mask)",
              *_ms_share(unfused, dense)],
             ["**the same with the reorder per layer, torch ops**",
              *_ms_share(reorder + unfused, dense)]]
    if fused is not None:
        rows += [["**draft side, fused, no reorder** (global; pooling through the permutation)",
                  *_ms_share(fused, dense)]]
    rows += [
        ["dense SDPA (default backend)", f"{dense * 1e3:.3f}", "100%"],
        [f"block_sparse_attention in tile order, draft mask (density {t['density']:.3f})",
         _ms_share(t["sparse_call"], dense)[0], _faster(t["sparse_call"], dense)],
        ["block_sparse_attention through the permutation (`token_order=`, model order in "
         "and out)", _ms_share(t["sparse_call_gathered"], dense)[0],
         _faster(t["sparse_call_gathered"], dense)],
        ["draft_attention, model order: no reorder (draft + mask + sparse call through the "
         "permutation), draft_kernel='auto'", _ms_share(t["whole"], dense)[0],
         _faster(t["whole"], dense)],
        ["draft_attention, the reorder path (q, k, v copied into tile order, output back)",
         _ms_share(t["whole_reorder"], dense)[0], _faster(t["whole_reorder"], dense)],
        ["draft_attention, no reorder, draft_kernel='torch'",
         _ms_share(t["whole_torch_draft"], dense)[0], _faster(t["whole_torch_draft"], dense)],
    ]
    goal = None if fused is None or math.isnan(fused) else 100 * fused / dense
    if torch.device(device).type == "cuda":
        record("draft_attention_gpu", "draft side (draft + mask, no reorder), % of a dense call, "
               "32,256 tokens", goal if t["n"] == 32256 else None, device_name(device))
    verdict = ("fused not timed (no CUDA device, or it failed) → **not measured**" if goal is None
               else f"fused, no reorder, {goal:.2f}% → **{'met' if goal <= 5 else 'missed'}**")
    return (f"### 1 and 3 on {device_name(device)}: overhead and speed at {t['n']:,} tokens, "
            f"{heads} heads, D=128, {str(dtype)[6:]}, sparsity 0.9\n\n"
            f"Same parts as sections 1 and 3, at Wan2.1-1.3B's 12 heads; fastest of 10 runs of "
            f"each after a warm-up, every call (dense included) timed in turn in each run, the "
            f"device synchronised around each; a call that raised is 'failed'. 'fused' rows: "
            f"`mmspec/video_dit/fused_draft.py` (Triton pooling through the tile permutation, "
            f"draft map, a per-head top-k, the block index written on the device) in place of "
            f"the four torch parts above it. Frames of whole tiles in the model's order are not "
            f"reordered: the kernel reads q, k, v through the permutation and writes the output "
            f"in the model's order (`block_sparse_attention(token_order=)`).\n\n"
            + markdown_table(["part", "ms", "% of dense"], rows)
            + f"\n\nThe no-reorder output against the reorder path's, same blocks: max abs "
              f"difference {t['agree']:.1e} ({str(dtype)[6:]}; nan: one of them failed).\n"
            + f"\nGoal (issue 42): the draft side at most 5% of a dense call: {verdict}.\n")


def gpu_report(device, big_grid, tile, quick, extra_grids=(), cogvideox_grids=(), compile=None,
               progress=lambda body: None, draft_kernels=None):
    """Sections 1/3 (overhead and kernel speed) at Wan's 12 heads in bf16, and section 4, on
    `device`: the `--gpu-only` run, which leaves the CPU sections to the CPU machine.
    `progress(body)` after every part, with the parts so far; a part that raises is a line
    saying so, and the next part runs. `draft_kernels`: the steps' draft kernels (default
    `step_section`'s)."""
    parts = []
    # (part, the goal it measures: recorded as not measured when the part fails)
    steps = [(lambda: overhead_report(device, big_grid, tile), None)]
    for section, grids in ((wan_section, (big_grid, *extra_grids)),
                           (cogvideox_section, cogvideox_grids)):
        steps += [(lambda section=section, g=g: section(device, g, tile, quick, compile,
                                                        draft_kernels),
                   wan_goal(g)
                   if section is wan_section and not quick else None) for g in grids]
    for step, goal in steps:
        try:
            parts.append(step())
        except Exception as err:  # any failure of one part is that part's line
            parts.append(f"(a part failed: {type(err).__name__}: "
                         f"{str(err).splitlines()[0][:200] if str(err) else ''})\n")
            traceback.print_exc()  # the whole chain to stderr (steps.log on the GPU machine)
            if torch.device(device).type == "cuda" and goal in GOALS["draft_attention_gpu"]:
                record("draft_attention_gpu", goal, None, device_name(device))
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()  # raises when the context is lost: nothing else runs
        print(parts[-1], flush=True)  # each part as it is measured: a long run shows progress
        progress("\n".join(parts))
    return "\n".join(parts)


# --------------------------------------------------------------------------------------- main


def _sizes(text: str, n: int) -> list[tuple[int, ...]] | None:
    """'21x30x52,21x45x80' -> [(21, 30, 52), (21, 45, 80)] for n = 3; None unless every item is
    n positive ints joined by 'x' (empty items are skipped)."""
    try:
        sizes = [tuple(int(x) for x in item.split("x")) for item in text.split(",") if item]
    except ValueError:
        return None
    return None if any(len(s) != n or min(s) < 1 for s in sizes) else sizes


def _tile_sizes(text: str) -> list[tuple[int, ...]] | None:
    """'8x16,8x8/4x8' -> [(8, 16), (8, 8, 4, 8)]: a tile, or a query tile over a tile (each of
    its sides a multiple of the tile's); None if an item is neither."""
    sizes = []
    for item in (i for i in text.split(",") if i):
        parts = [_sizes(part, 2) for part in item.split("/")]
        if len(parts) > 2 or any(part is None or len(part) != 1 for part in parts):
            return None
        size = sum((part[0] for part in parts), ())
        if len(size) == 4 and (size[0] % size[2] or size[1] % size[3]):
            return None
        sizes.append(size)
    return sizes or None


def _draft_kernels(text: str) -> tuple[str, ...]:
    kernels = tuple(k for k in text.split(",") if k)
    if not kernels or any(k not in ("auto", "triton", "torch") for k in kernels):
        raise argparse.ArgumentTypeError(f"--draft-kernels takes auto, triton and torch joined "
                                         f"by commas, e.g. auto,torch; got {text!r}")
    return kernels


def build_parser() -> argparse.ArgumentParser:
    """The command line (`mmspec bench` reads its options here)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    p.add_argument("--quick", action="store_true", help="small shapes, a smoke run")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's); 1 is steadier on a shared machine")
    p.add_argument("--gpu-only", action="store_true",
                   help="only the device sections (overhead and speed at 12 heads in bf16, Wan "
                        "step), into section draft_attention_gpu; the CPU sections stay")
    p.add_argument("--extra-grids", default="",
                   help="more latent token grids for the --gpu-only Wan step, e.g. 21x30x52 "
                        "(Wan2.1 at 480x832, 81 frames: frames not a multiple of the tile, so "
                        "padded) or 21x45x80 (720x1280)")
    p.add_argument("--cogvideox-grids", default="",
                   help="latent token grids for a --gpu-only CogVideoX-2B step, e.g. 13x30x45 "
                        "(480x720, 49 frames)")
    p.add_argument("--draft-kernels", type=_draft_kernels, default=None, metavar="auto,torch",
                   help="--gpu-only: the end-to-end steps' draft kernels (default auto,torch on "
                        "CUDA: fused and torch ops side by side)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="--gpu-only: the end-to-end steps also with every block torch.compiled "
                        "(fullgraph, backend default inductor), dense and sparse")
    p.add_argument("--device", default="cuda",
                   help="device of --gpu-only (cpu runs its code path in fp32, as a smoke test)")
    p.add_argument("--sharpness", default="",
                   help="only the fidelity workload with its logits scaled by each factor, e.g. "
                        "0.75,1,1.25,1.5,2, at 90%% sparsity, into section "
                        "draft_attention_sharpness (how recall depends on the heads' sharpness)")
    p.add_argument("--padded-text", action="store_true",
                   help="only HunyuanVideo 1.5's joint attention with its text padding computed "
                        "and skipped, into section draft_attention_padded_text (_gpu on a GPU)")
    p.add_argument("--tiles", default="",
                   help="only fidelity and speed (on the GPU when there is one) at 90%% for "
                        "each tile size, e.g. 8x16,8x8,4x8, or query tile over tile, e.g. "
                        "8x8/4x8 (64-token query blocks over 32-token key blocks), into section "
                        "draft_attention_tiles (_gpu on a GPU)")
    return p


def main() -> None:
    p = build_parser()
    args = p.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        big_grid, fid_grid, reps = (5, 32, 48), (4, 16, 32), 2
    else:  # Wan2.1 at 512x768, 81 frames, for all three sections
        big_grid, fid_grid, reps = (21, 32, 48), (21, 32, 48), 3
    tile, sparsities = (8, 16), (0.75, 0.9, 0.95)
    if args.sharpness:
        try:
            scales = [float(x) for x in args.sharpness.split(",")]
        except ValueError:
            scales = [0.0]
        if not scales or min(scales) <= 0:
            p.error(f"--sharpness takes positive numbers joined by commas, e.g. 1,1.5,2; got "
                    f"{args.sharpness!r}")
        body = sharpness_report(fid_grid, tile, scales)
        print(body)
        if args.write:
            write_section("draft_attention_sharpness", "DraftAttention fidelity against the "
                          "sharpness of the synthetic heads", body)
        return
    if args.tiles:
        tiles = _tile_sizes(args.tiles)
        if not tiles:
            p.error(f"--tiles takes THxTW tile sizes, or QHxQW/THxTW (query tile over tile, "
                    f"whole tiles), joined by commas, e.g. 8x16,8x8/4x8; got {args.tiles!r}")
        device = "cuda" if torch.cuda.is_available() else "cpu"  # the speed columns
        body = tile_size_report(fid_grid, tiles, reps=reps, device=device)
        print(body)
        if args.write:
            gpu = "_gpu" if device == "cuda" else ""
            write_section(f"draft_attention_tiles{gpu}", "DraftAttention fidelity and speed "
                          f"against the tile size{' (GPU)' if gpu else ''}", body)
        return
    if args.padded_text:  # on the GPU when there is one (16 heads, bf16), else the CPU
        device = "cuda" if torch.cuda.is_available() else "cpu"
        grid = (5, 30, 53) if args.quick else (31, 30, 53)
        body = padded_text_report(grid, tile, reps=1 if args.quick else 5, device=device)
        print(body)
        if args.write:
            gpu = "_gpu" if device == "cuda" else ""
            write_section(f"draft_attention_padded_text{gpu}", "DraftAttention: HunyuanVideo "
                          f"1.5's text padding skipped{' (GPU)' if gpu else ''}", body)
        return
    if args.gpu_only:
        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            p.error("--gpu-only on cuda needs a CUDA device; none is visible")
        check_compile_backend(p, args.compile)  # before minutes of device time, not after
        grids = {}
        for flag in ("extra_grids", "cogvideox_grids"):
            text = getattr(args, flag)
            grids[flag] = _sizes(text, 3)
            if grids[flag] is None:
                p.error(f"--{flag.replace('_', '-')} takes TxHxW grids of positive ints joined "
                        f"by commas, e.g. 21x30x52,21x45x80; got {text!r}")
        def progress(body):
            if args.write:
                write_section("draft_attention_gpu", "DraftAttention on a GPU "
                              "(`benchmarks/draft_attention.py --gpu-only`)", body)

        gpu_report(args.device, big_grid, tile, args.quick, grids["extra_grids"],
                   grids["cogvideox_grids"], args.compile, progress, args.draft_kernels)
        return

    load = os.getloadavg()
    t = overhead_and_speed(big_grid, tile, heads=1, dim=128, sparsity=0.9, reps=reps)
    dense_ms = t["dense"] * 1e3
    per_layer = sum(c for name, c in t["costs"].items() if name != "block selection (row)")
    once = per_layer - t["costs"]["reorder q, k, v and restore the output"]
    rows = [[name, f"{c * 1e3:.2f}", f"{100 * c / t['dense']:.2f}%"] for name, c in t["costs"].items()]
    rows.append(["**total, reorder per layer** (HunyuanVideo, CogVideoX)",
                 f"{per_layer * 1e3:.2f}", f"**{100 * per_layer / t['dense']:.2f}%**"])
    rows.append(["**total, reorder once per forward** (Wan)", f"{once * 1e3:.2f}",
                 f"**{100 * once / t['dense']:.2f}%**"])
    bar1 = 100 * per_layer / t["dense"] <= 5
    overhead = (
        f"### 1. Overhead at {t['n']:,} video tokens ({big_grid[0]}x{big_grid[1]}x{big_grid[2]} "
        f"latent grid, {tile[0]}x{tile[1]} tiles = {t['layout'].num_tiles} draft tokens), "
        f"1 head, D=128, sparsity 0.9, CPU\n\n"
        f"Dense attention (fused SDPA): {dense_ms:.0f} ms. Each figure is the fastest of "
        f"{reps} runs after a warm-up, every call (dense included) timed in turn in each run. "
        f"Load average at the start "
        f"of the run: {load[0]:.1f} on {os.cpu_count()} CPUs (a shared machine: absolute times "
        f"are noisy, the ratios are measured side by side).\n\n"
        + markdown_table(["part", "ms", "% of dense"], rows)
        + f"\n\nBar ≤ 5% (per-layer reorder, global selection): "
          f"**{'met' if bar1 else 'missed'}**.\n"
    )

    fid, head_names, sampled, fid_tiles = fidelity(fid_grid, tile, sparsities)
    frows = [[f"{int(r['sparsity'] * 100)}%", r["method"], f"{r['density']:.3f}",
              f"{r['recall']:.3f}", " / ".join(f"{x:.2f}" for x in r["per_head"]),
              f"{r['error']:.3f}"] for r in fid]
    at90 = {r["method"]: r for r in fid if r["sparsity"] == 0.9}
    baselines = max(at90["local window"]["recall"], at90["random"]["recall"])
    base_err = min(at90["local window"]["error"], at90["random"]["error"])
    verdict = []
    for m in ("draft-global", "draft-row"):
        r = at90[m]
        ok = r["recall"] >= 0.9 and r["recall"] > baselines and r["error"] < base_err
        verdict.append(f"{m}: recall {r['recall']:.3f}, error {r['error']:.3f} → "
                       f"**{'met' if ok else 'missed'}**")
    fidelity_md = (
        f"### 2. Fidelity on structured attention ({fid_grid[0]}x{fid_grid[1]}x{fid_grid[2]} = "
        f"{fid_grid[0] * fid_grid[1] * fid_grid[2]:,} tokens, {tile[0]}x{tile[1]} tiles, "
        f"heads {' / '.join(head_names)}, 4 sink keys, D=64)\n\n"
        f"Recall = share of the dense softmax mass inside the kept blocks (mean over queries and "
        f"heads); error = ||O_sparse − O_dense|| / ||O_dense|| over all heads. Both are exact on "
        f"the queries of {sampled} random query tiles of {fid_tiles}. Equal block budget per "
        f"head; the draft modes and the window always keep the own tile, random does not. "
        f"*oracle* keeps, for each query tile, the same number of key tiles chosen by the true "
        f"(dense) mass: an upper bound for a mask with a fixed number of blocks per row. "
        f"*oracle (global)* keeps each head's heaviest blocks of the whole true map, any number "
        f"per row: since mean recall is the kept blocks' true mass over all queries, no mask with "
        f"this block budget can do better (it is scored on the same sampled queries). "
        f"*oracle (shared)* pools the heads' budgets and keeps the heaviest blocks of all heads' "
        f"true maps: the bound for any split of the same total work among the heads (a per-head "
        f"budget schedule).\n\n"
        + markdown_table(["sparsity", "method", "density", "recall", "recall per head", "rel. error"],
                         frows)
        + "\n\nBar at 90% (recall ≥ 0.9, beats window and random in recall and error): "
        + "; ".join(verdict)
        + f". For scale, at 90% the oracle keeps {at90['oracle']['recall']:.3f}, the global "
          f"oracle {at90['oracle (global)']['recall']:.3f} and the shared-budget oracle "
          f"{at90['oracle (shared)']['recall']:.3f}"
        + (": no block mask with this budget reaches 0.9 on this workload, however the heads "
           "split it" if at90["oracle (shared)"]["recall"] < 0.9 else "") + ".\n"
    )

    speed_rows = [
        ["dense SDPA (fused CPU flash)", f"{dense_ms:.0f}", "1.00x"],
        [f"block_sparse_attention, draft mask (density {t['density']:.3f})",
         f"{t['sparse_call'] * 1e3:.0f}", f"{t['dense'] / t['sparse_call']:.2f}x"],
        ["draft_attention (reorder + draft + mask + sparse call)", f"{t['whole'] * 1e3:.0f}",
         f"{t['dense'] / t['whole']:.2f}x"],
    ]
    speed = (
        f"### 3. Speed at {t['n']:,} tokens, 90% sparsity, 1 head, D=128, CPU\n\n"
        + markdown_table(["call", "ms", "speedup vs dense"], speed_rows) + "\n"
    )
    if torch.cuda.is_available():
        speed += "\n" + wan_section("cuda", big_grid, tile, args.quick)
    else:
        speed += ("\nGPU end to end (one denoising step of a Wan-sized layer stack, section 4 of "
                  "the script): no CUDA device on this machine; see the section written by "
                  "`--gpu-only` on a GPU machine.\n")
    body = overhead + "\n" + fidelity_md + "\n" + speed
    print(body)
    if args.write:
        write_section("draft_attention", "DraftAttention (mmspec.video_dit)", body)


if __name__ == "__main__":
    main()
