"""`PixelWanPipeline`: text-to-video with the zoo's pixel-space Wan DiT (no VAE).

    pipe = mmspec.zoo.load("video-dit").model
    frames = pipe("a red circle moving right", num_frames=4, height=32, width=32,
                  num_inference_steps=20, generator=torch.Generator().manual_seed(0)).frames
    # numpy [B, F, H, W, 3] in [0, 1]

A diffusers `DiffusionPipeline` (components `tokenizer`, `text_encoder`, `transformer`,
`scheduler`) that samples like `WanPipeline` (Euler steps of `FlowMatchEulerDiscreteScheduler`,
classifier-free guidance with the empty caption as negative), but denoises pixels directly, so
`WanPipeline`'s VAE, its 4k+1 frame rule and its 16-pixel size rule do not apply: any frame count
and any even height and width run, but the zoo entry was trained on a few sizes (its card's
`training.grids`; the first is the call's default) and warns, once per size, at others, where it
may make noise. `apply_draft_attention(pipe, config)` finds `pipe.transformer`
and `pipe.scheduler` as it does on a `WanPipeline`. The conditional and unconditional branches run
as one batch of 2 (a CFG batch), not two forwards as in `WanPipeline`. diffusers' step caches
(`pipe.transformer.enable_cache(FirstBlockCacheConfig(...))`) work as on its own pipelines.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from diffusers import DiffusionPipeline
from diffusers.pipelines.wan.pipeline_output import WanPipelineOutput

from mmspec.zoo.video_model import encode_prompts

logger = logging.getLogger(__name__)


def cast_keeping_fp32(module: torch.nn.Module, dtype: torch.dtype,
                      device: torch.device | str | None = None) -> torch.nn.Module:
    """`module` in `dtype` (and on `device`) as `from_pretrained(..., dtype=dtype)` would load it:
    parameters and buffers whose dotted name has a part in the class's `_keep_in_fp32_modules`
    (diffusers' rule: Wan's rope, time embedder, norms and `scale_shift_table`; UMT5's `wo`) stay
    float32, with their float32 values (never rounded through `dtype`). A plain `.to(dtype)` casts
    those too, which diffusers warns against. Returns `module`, cast in place."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    for prefix, sub in module.named_modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(sub, kind).items():
                if t is None:
                    continue
                full = f"{prefix}.{name}" if prefix else name
                kept = bool(keep & set(full.split(".")))
                to = (torch.float32 if kept else dtype) if t.is_floating_point() else t.dtype
                if kind == "_parameters":
                    t.data = t.data.to(device=device, dtype=to)
                else:
                    sub._buffers[name] = t.to(device=device, dtype=to)
    return module


class PixelWanPipeline(DiffusionPipeline):
    model_cpu_offload_seq = "text_encoder->transformer"

    def __init__(self, tokenizer, text_encoder, transformer, scheduler):
        super().__init__()
        self.register_modules(tokenizer=tokenizer, text_encoder=text_encoder,
                              transformer=transformer, scheduler=scheduler)
        # set by `mmspec.zoo.load` from the card: the (frames, height, width) it was trained on
        self.trained_grids: tuple[tuple[int, int, int], ...] = ()
        self.card_path: Path | None = None
        self._warned: set = set()

    def off_grid_message(self, grid: tuple[int, int, int]) -> str | None:
        """The line a call at (frames, height, width) `grid` warns with, None at a trained size
        (or for a pipeline no card has set sizes on); the demo shows it too."""
        if not self.trained_grids or tuple(grid) in self.trained_grids:
            return None
        trained = ", ".join(f"{f} frames of {h}x{w}" for f, h, w in self.trained_grids)
        return (f"{grid[0]} frames of {grid[1]}x{grid[2]}: this video DiT was trained on "
                f"{trained} only ({self.card_path}, training.grids); expect noise at other sizes")

    def _warn_off_grid(self, grid: tuple[int, int, int]) -> None:
        """One line, once per size: away from its training sizes the zoo DiT may make noise (a
        DiT trained on 4 frames of 32x32 made dark noise at 9 frames of 64x64, without a word)."""
        message = self.off_grid_message(grid)
        if message is not None and grid not in self._warned:
            self._warned.add(grid)
            logger.warning(message)

    @property
    def current_timestep(self):
        """The timestep being denoised (None outside a call), as diffusers pipelines expose it
        for `PyramidAttentionBroadcastConfig(current_timestep_callback=...)`."""
        return getattr(self, "_current_timestep", None)

    @property
    def training(self) -> bool:  # ZooModel convention: entries load in eval mode
        return self.transformer.training

    @torch.no_grad()
    def __call__(self, prompt: str | list[str], negative_prompt: str | list[str] | None = None,
                 num_frames: int = 4, height: int = 32, width: int = 32,
                 num_inference_steps: int = 20, guidance_scale: float = 3.0,
                 generator: Optional[torch.Generator] = None, latents: torch.Tensor | None = None,
                 output_type: str = "np", return_dict: bool = True,
                 callback_on_step_end: Optional[Callable] = None):
        """Sample videos; returns `WanPipelineOutput(frames)`.

        frames: `output_type="np"`: numpy `[B, F, H, W, 3]` in [0, 1]; `"pt"`: the raw tensor
        `[B, 3, F, H, W]` in [-1, 1]. The initial noise is drawn on the CPU from `generator` (or
        passed as `latents`), so a seed gives the same noise with and without DraftAttention.
        `callback_on_step_end(pipe, step, timestep, {})` runs after each step, as in diffusers.
        """
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if height % 2 or width % 2:
            raise ValueError(f"height and width must be even (patch 2), got {height}x{width}")
        self._warn_off_grid((num_frames, height, width))
        negative = negative_prompt if negative_prompt is not None else ""
        negatives = [negative] * len(prompts) if isinstance(negative, str) else list(negative)
        if len(negatives) != len(prompts):
            raise ValueError(f"negative_prompt must be a string or {len(prompts)} strings (one "
                             f"per prompt), got {len(negatives)}")
        shape = (len(prompts), 3, num_frames, height, width)
        if latents is not None and tuple(latents.shape) != shape:
            raise ValueError(f"latents must be [prompts, 3, num_frames, height, width] = "
                             f"{list(shape)}, got {list(latents.shape)}")
        device, dtype = self.transformer.device, self.transformer.dtype
        cfg = guidance_scale > 1.0
        text = encode_prompts(self.tokenizer, self.text_encoder, prompts + (negatives if cfg else []))
        text = text.to(device, dtype)
        if latents is None:
            latents = torch.randn(shape, generator=generator)
        latents = latents.to(device, torch.float32)
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        for i, t in enumerate(self.progress_bar(self.scheduler.timesteps)):
            self._current_timestep = t
            model_in = torch.cat([latents, latents]) if cfg else latents
            # diffusers' step caches (`transformer.enable_cache`) keep their state per context;
            # one batch holds both branches, as in CogVideoXPipeline
            with self.transformer.cache_context("cond_uncond" if cfg else "cond"):
                v = self.transformer(model_in.to(dtype), timestep=t.expand(model_in.shape[0]),
                                     encoder_hidden_states=text, return_dict=False)[0].float()
            if cfg:
                v_cond, v_uncond = v.chunk(2)
                v = v_uncond + guidance_scale * (v_cond - v_uncond)
            latents = self.scheduler.step(v, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                callback_on_step_end(self, i, t, {})
        self._current_timestep = None
        video = latents.clamp(-1, 1)
        if output_type == "np":
            video = ((video + 1) / 2).permute(0, 2, 3, 4, 1).cpu().numpy().astype(np.float32)
        elif output_type != "pt":
            raise ValueError(f"output_type must be 'np' or 'pt', got {output_type!r}")
        self.maybe_free_model_hooks()
        return WanPipelineOutput(frames=video) if return_dict else (video,)
