"""DraftAttention on a video DiT: dense and sparse videos side by side, and the draft map.

The draft map is what chose the blocks (Shen et al., arXiv 2505.14708).

A prompt goes to the video pipeline twice with the same seed: once dense, once with
`apply_draft_attention` (sparsity from the slider). The page shows both videos with their wall
times, the mean attention density, the PSNR between them, and for a selected step, layer and head
the tile-level draft map (`on_draft_map`: softmax of tile-pooled q and k) next to the block mask
that `select_blocks` keeps from it at the slider's sparsity (moving the slider redraws the mask
without generating again).

    python demos/video_draft.py [--port 7860]          # the zoo video model (video-dit)
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # `python demos/video_draft.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demos.extras import require_demo_extras

require_demo_extras("demos/video_draft.py")  # one line naming `.[demo]`, not a ModuleNotFoundError

import matplotlib

matplotlib.use("Agg")
import gradio as gr
import matplotlib.pyplot as plt
import numpy as np
import torch

from demos.common import parser, run, warn
from mmspec import zoo
from mmspec.video_dit import (
    DraftAttentionConfig,
    apply_draft_attention,
    remove_draft_attention,
)
from mmspec.video_dit.compare import psnr
from mmspec.video_dit.draft_map import select_blocks
from mmspec.video_dit.video_io import to_uint8, write_mp4

# latent tokens per tile, and per query tile where queries are pooled coarser (query_tile)
TILES = {"2 x 2": ((2, 2), None), "2 x 4": ((2, 4), None), "4 x 4": ((4, 4), None),
         "4 x 4 queries over 2 x 2 keys": ((2, 2), (4, 4)), "8 x 16 (paper)": ((8, 16), None)}
FPS = 8


@dataclass
class Comparison:
    dense: np.ndarray  # uint8 [F, H, W, 3]
    sparse: np.ndarray
    dense_seconds: float
    sparse_seconds: float
    density: float  # mean share of attention blocks computed in the sparse run
    maps: dict = field(default_factory=dict)  # (step, layer) -> fp32 [H, nQ, nT], first sample
    tiles_per_frame: int = 0  # tiles of one latent frame (nT = latent frames x this)
    query_tiles_per_frame: int = 0  # query tiles of one latent frame (= tiles_per_frame without)
    own: torch.Tensor | None = None  # bool [nQ, nT] with query tiles: the tiles inside each


def load_zoo_pipeline():
    if "video-dit" not in zoo.available():
        raise SystemExit("the zoo has no video-dit yet (assets/zoo/); see mmspec.zoo.available()")
    return zoo.load("video-dit").model


def _frames(result) -> np.ndarray:
    """A pipeline's output (diffusers `.frames` batch, or frames) -> uint8 `[F, H, W, 3]`."""
    frames = result.frames[0] if hasattr(result, "frames") else result
    if isinstance(frames, torch.Tensor):
        frames = frames.float().cpu().numpy()
    return to_uint8(np.stack([np.asarray(f) for f in frames]))


def compare(pipe, prompt: str, sparsity: float, tile: tuple[int, int], *, num_frames: int,
            size: int, steps: int, seed: int, query_tile=None) -> Comparison:
    """Run `pipe` dense, then with DraftAttention at `sparsity`, same seed; keep the draft maps."""
    call = {"num_frames": num_frames, "height": size, "width": size,
            "num_inference_steps": steps}

    def timed():
        start = time.perf_counter()
        with torch.no_grad():
            out = pipe(prompt, generator=torch.Generator().manual_seed(seed), **call)
        return _frames(out), time.perf_counter() - start

    dense, dense_seconds = timed()
    maps = {}

    def keep_map(step, layer, probs):  # probs [B, H, nQ, nT]; B > 1 under CFG: keep the first
        maps.setdefault((step, layer), probs[0].cpu())

    config = DraftAttentionConfig(sparsity=sparsity, tile=tile, query_tile=query_tile)
    state = apply_draft_attention(pipe, config, on_draft_map=keep_map)
    try:
        sparse, sparse_seconds = timed()
    finally:
        remove_draft_attention(pipe)
    layout = state.layout
    if layout is None:
        return Comparison(dense, sparse, dense_seconds, sparse_seconds, state.mean_density(),
                          maps)
    frames = layout.grid[0]
    return Comparison(dense, sparse, dense_seconds, sparse_seconds, state.mean_density(), maps,
                      layout.num_tiles // frames, layout.num_query_tiles // frames,
                      layout.own_blocks().cpu() if layout.asymmetric else None)


def map_figure(probs: torch.Tensor, sparsity: float, title: str, tiles_per_frame: int = 0,
               query_tiles_per_frame: int | None = None, own: torch.Tensor | None = None):
    """probs `[nQ, nT]` of one head -> figure: the draft map and the blocks kept at `sparsity`;
    thin lines separate the latent frames. With query tiles (`own`: the tiles inside each query
    tile, which are always kept) the rows are query tiles, fewer than the key tiles."""
    query_tiles_per_frame = tiles_per_frame if query_tiles_per_frame is None else (
        query_tiles_per_frame)
    kept = select_blocks(probs[None, None], sparsity, own=own)[0, 0]  # [nQ, nT]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6), dpi=90)
    im = left.imshow(probs.numpy(), cmap="viridis", norm=matplotlib.colors.LogNorm(
        vmin=max(float(probs.min()), 1e-6), vmax=float(probs.max())))
    left.set_title("draft map softmax(q̂ k̂ᵀ/√d) (log scale)", fontsize=9)
    fig.colorbar(im, ax=left, fraction=0.046)
    right.imshow(kept.numpy(), cmap="Greys", vmin=0, vmax=1)
    right.set_title(f"block mask, sparsity {sparsity:.2f}: {int(kept.sum())} of {kept.numel()} "
                    f"blocks computed (black)", fontsize=9)
    nq, n = probs.shape
    for ax in (left, right):
        ax.set_xlabel("key tile (frame by frame)")
        ax.set_ylabel("query tile")
        ax.set_aspect("auto" if nq != n else "equal")
        for edge in range(query_tiles_per_frame, nq, query_tiles_per_frame or nq):
            ax.axhline(edge - 0.5, color="#e8590c", lw=0.6)
        for edge in range(tiles_per_frame, n, tiles_per_frame or n):
            ax.axvline(edge - 0.5, color="#e8590c", lw=0.6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def enlarged(frames: np.ndarray, at_least: int = 192) -> np.ndarray:
    """uint8 `[F, H, W, 3]` -> nearest-neighbour enlarged so the player shows at least
    `at_least` pixels (the zoo model makes 32 x 32 clips)."""
    k = max(1, at_least // max(frames.shape[1:3]))
    return frames.repeat(k, axis=1).repeat(k, axis=2)


def size_name(frames: int, size: int) -> str:
    return f"{frames} frames of {size} x {size}"


def trained_sizes(pipe) -> dict[str, tuple[int, int]]:
    """The square sizes the zoo video model was trained on (its card's `training.grids`, which
    `zoo.load` sets on the pipeline), by name -> (frames, height = width); none for other
    pipelines."""
    return {size_name(f, h): (f, h) for f, h, w in getattr(pipe, "trained_grids", ()) if h == w}


# the zoo model's default size (the first of its card's training.grids): 4 frames of 32 x 32,
# i.e. 16 x 16 tokens per frame = 32 tiles of 2 x 4 tokens (the zoo's, ZOO_VIDEO_TILE)
def build_app(pipe=None, *, prompt: str = "a red circle moving right", num_frames: int = 4,
              size: int = 32, steps: int = 20, tile: str = "2 x 4") -> gr.Blocks:
    """The page; `pipe` defaults to the zoo video model (the defaults are its training size)."""
    pipe = pipe if pipe is not None else load_zoo_pipeline()
    # warm-up, dense and sparse, in the background so that the page is up at once (the first
    # sparse call may build the CPU kernel, ~30 s once per machine); the first comparison waits
    # for it, so its timings are not skewed by either
    warmed = threading.Event()

    def warm_up():
        warm = {"num_frames": num_frames, "height": size, "width": size,
                "num_inference_steps": 1, "generator": torch.Generator().manual_seed(0)}
        config = DraftAttentionConfig(tile=TILES[tile][0], query_tile=TILES[tile][1],
                                      dense_steps=0, dense_layers=0)
        try:
            with torch.no_grad():
                pipe("warm-up", **warm)
                apply_draft_attention(pipe, config)
                try:
                    pipe("warm-up", **warm)
                finally:
                    remove_draft_attention(pipe)
        finally:  # a failed warm-up must not block the page; its error shows in the log
            warmed.set()

    threading.Thread(target=warm_up, daemon=True).start()
    out_dir = Path(tempfile.mkdtemp(prefix="mmspec-video-draft-"))
    counter = itertools.count()

    def on_run(text, sparsity, tile_name, frames, px, n_steps, seed):
        """-> dense video, sparse video, status, state, step, layer, head, figure."""
        problem = None
        if not text or not text.strip():
            problem = "Please enter a prompt."
        elif None in (frames, px, n_steps, seed) or min(frames, px, n_steps) < 1 or px % 2:
            problem = ("Frames and steps must be at least 1, height = width a positive even "
                       "number, and the seed set.")
        if problem:
            return gr.skip(), gr.skip(), warn(problem), *[gr.skip()] * 5
        warmed.wait()
        try:
            result = compare(pipe, text, float(sparsity), TILES[tile_name][0],
                             num_frames=int(frames), size=int(px), steps=int(n_steps),
                             seed=int(seed), query_tile=TILES[tile_name][1])
        except ValueError as error:  # e.g. a tile larger than the latent frame
            return gr.skip(), gr.skip(), warn(str(error)), *[gr.skip()] * 5
        off_grid = getattr(pipe, "off_grid_message", lambda grid: None)(
            (int(frames), int(px), int(px)))
        run_id = next(counter)
        paths = [out_dir / f"{run_id}-{name}.mp4" for name in ("dense", "draft")]
        write_mp4(paths[0], enlarged(result.dense), fps=FPS)
        write_mp4(paths[1], enlarged(result.sparse), fps=FPS)
        status = (f"dense **{result.dense_seconds:.2f} s**, DraftAttention "
                  f"**{result.sparse_seconds:.2f} s** "
                  f"({result.dense_seconds / result.sparse_seconds:.2f}x), mean attention density "
                  f"{result.density:.2f}, PSNR {psnr(result.dense, result.sparse):.1f} dB")
        if not result.maps:
            status += " (no sparse step or layer in this run: no draft map to show)"
        if off_grid:  # the zoo model outside the sizes it was trained on
            status += f"\n\n⚠️ {off_grid}"
        if not result.maps:
            return str(paths[0]), str(paths[1]), status, None, *[gr.skip()] * 4
        keys = sorted(result.maps)
        steps_seen = sorted({s for s, _ in keys})
        layers_seen = sorted({layer for _, layer in keys})
        heads = result.maps[keys[0]].shape[0]
        step, layer = keys[0]
        view = (result.maps, result.tiles_per_frame, result.query_tiles_per_frame, result.own)
        return (str(paths[0]), str(paths[1]), status, view,
                gr.Dropdown(choices=steps_seen, value=step, interactive=True),
                gr.Dropdown(choices=layers_seen, value=layer, interactive=True),
                gr.Slider(0, max(heads - 1, 1), value=0, step=1, interactive=heads > 1),
                draw(view, step, layer, 0, sparsity))

    def draw(view, step, layer, head, sparsity):
        if not view:
            return gr.skip()
        maps, tiles_per_frame, query_tiles_per_frame, own = view
        probs = maps.get((int(step), int(layer)))
        if probs is None:
            return gr.skip()
        head = min(int(head), probs.shape[0] - 1)
        return map_figure(probs[head], float(sparsity),
                          f"denoising step {int(step)}, layer {int(layer)}, head {head}",
                          tiles_per_frame, query_tiles_per_frame, own)

    with gr.Blocks(title="mmspec: DraftAttention") as app:
        gr.Markdown("## DraftAttention on a video DiT\nThe same prompt and seed, dense and with "
                    "DraftAttention: tile-pooled queries and keys give a small draft attention "
                    "map; its top entries pick which attention blocks are computed. On a CPU "
                    "the sparse path only gets faster on large token grids (BENCHMARKS.md: "
                    "16 frames of 64 x 64 with 8 x 16 tiles); at the zoo model's 32 x 32 the "
                    "gain is small (1.1-1.2x measured on a shared 2-core machine) and moves with "
                    "machine load. The zoo model was trained on the sizes the 'trained sizes' "
                    "list offers; at other sizes the page says so, and it may make noise.")
        # (draft maps by (step, layer), tiles and query tiles per latent frame, own blocks)
        maps = gr.State(None)
        with gr.Row():
            with gr.Column(scale=2):
                prompt_box = gr.Textbox(value=prompt, label="Prompt", elem_id="prompt")
                button = gr.Button("Generate dense and DraftAttention videos", variant="primary",
                                   elem_id="run")
            with gr.Column(scale=1):
                sparsity = gr.Slider(0.5, 0.95, value=0.9, step=0.05, elem_id="sparsity",
                                     label="sparsity (share of attention blocks skipped)")
                tile_choice = gr.Dropdown(list(TILES), value=tile, label="tile (latent tokens)",
                                          elem_id="tile")
                sizes = trained_sizes(pipe)
                if sizes:  # the zoo model: the sizes it was trained on (others warn)
                    size_choice = gr.Dropdown(
                        list(sizes), label="trained sizes (frames, height = width)",
                        value=size_name(num_frames, size) if (num_frames, size) in
                        sizes.values() else None, elem_id="trained-size")
                with gr.Row():
                    frames = gr.Number(num_frames, label="frames", precision=0)
                    px = gr.Number(size, label="height = width", precision=0, elem_id="size")
                    n_steps = gr.Number(steps, label="steps", precision=0)
                    seed = gr.Number(0, label="seed", precision=0)
        status = gr.Markdown(elem_id="status")
        with gr.Row():
            dense_video = gr.Video(label="dense", elem_id="dense", autoplay=True, loop=True,
                                   height=320)
            sparse_video = gr.Video(label="DraftAttention", elem_id="draft", autoplay=True,
                                    loop=True, height=320)
        with gr.Row():
            step = gr.Dropdown([], label="denoising step", elem_id="step")
            layer = gr.Dropdown([], label="layer", elem_id="layer")
            head = gr.Slider(0, 1, value=0, step=1, label="head", interactive=False)
        figure = gr.Plot(label="draft map and block mask", elem_id="map")
        if sizes:
            size_choice.input(lambda name: sizes[name], size_choice, [frames, px])
        button.click(on_run, [prompt_box, sparsity, tile_choice, frames, px, n_steps, seed],
                     [dense_video, sparse_video, status, maps, step, layer, head, figure])
        for control in (step, layer, head, sparsity):
            control.change(draw, [maps, step, layer, head, sparsity], figure)
    return app


def main(argv=None) -> None:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    run(build_app, args)


if __name__ == "__main__":
    main()
