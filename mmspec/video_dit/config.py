"""`DraftAttentionConfig`: the knobs of DraftAttention (arXiv 2505.14708), defaults from its code.

Deliberate difference from the official code: the dense warm-up is a count or fraction of the
denoising steps, not an absolute timestep threshold (t > 945 / 925 / 975 there), so it means the
same thing under any flow shift and step count.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from mmspec.kernels import available_backends

from .draft_map import check_mass, check_mass_needed, check_mode, check_sparsity
from .tiles import check_query_tile, check_tile

DRAFT_KERNELS = ("auto", "triton", "torch")


def check_draft_kernel(draft_kernel) -> str:
    if draft_kernel not in DRAFT_KERNELS:
        raise ValueError(f"draft_kernel must be one of {DRAFT_KERNELS}, got {draft_kernel!r}")
    return draft_kernel


@dataclass(frozen=True)
class DraftAttentionConfig:
    # paper / official code: 0.9 for HunyuanVideo and HunyuanCustom (0.75 for Wan2.1)
    sparsity: float = 0.9
    # paper §3.1: avg-pool 8x16 latent tokens per frame = one 128x128 kernel block
    tile: tuple[int, int] = (8, 16)
    # ours: query blocks larger than key blocks, whole tiles each (e.g. tile=(4, 8),
    # query_tile=(8, 8): 64-token query blocks over 32-token key blocks). The selection is as
    # fine as the key tiles and the kernel's programs as large as the query tiles. None = tile.
    query_tile: tuple[int, int] | None = None
    # paper: one per-head percentile over the draft map; "row" = per-row top-p at the same budget;
    # "top_p" = per row the fewest tiles holding `mass` of the draft map, no fixed budget
    mode: str = "global"
    # the draft mass kept: per row with mode="top_p", per layer with calibrate=True (XAttention
    # and SVG2 keep 0.9 of the mass); None with a fixed sparsity
    mass: float | None = None
    # ours: the cap of the adaptive budgets, at most this share of a row's blocks (top_p) or of a
    # layer's (calibrate); a flat map would otherwise keep every block
    max_density: float = 0.5
    # ours, after Sparse VideoGen's profiling and SpargeAttn's calibration: the last dense
    # warm-up step drafts the map of each sparse layer and sets that layer's sparsity (for
    # "global" and "row") to the one that keeps `mass` of it; `sparsity` holds until then
    calibrate: bool = False
    # official code: t > 945 (Hunyuan, shift 7) and t > 925 (Wan, shift 5) are about 15 of 50
    # steps, i.e. 30%. An int is a count of steps, a float in [0, 1] a fraction of them.
    dense_steps: int | float = 0.3
    # official code: Wan block 0 dense (HunyuanVideo: the first 2 double-stream blocks)
    dense_layers: int = 1
    # reorder tokens and RoPE once per transformer forward instead of in every layer, where the
    # model allows it and frames are whole tiles
    permute_once: bool = True
    # ours (issue 42): where tokens stay in the model's order (padded frames, permute_once=False,
    # context parallelism), the Triton kernel reads q, k and v through the tile permutation;
    # False copies them into tile order in each sparse layer and the output back instead. Both
    # give the same output; on an H200 the gathered loads cost more than the copies at 32k
    # tokens (BENCHMARKS.md `draft_attention_gpu`), hence the choice
    gathered_loads: bool = True
    # mmspec.kernels backend: "auto" = Triton on CUDA, torch on CPU
    backend: str = "auto"
    # ours (issue 32): pooling, draft map, selection and block index as fused Triton kernels
    # ("auto": on CUDA in eager mode; "triton": wherever Triton runs; "torch": never)
    draft_kernel: str = "auto"

    def __post_init__(self):
        backends = ("auto", *available_backends())
        if self.backend not in backends:  # else it fails at the first sparse step, minutes in
            raise ValueError(f"backend must be one of {list(backends)}, got {self.backend!r}")
        object.__setattr__(self, "sparsity", check_sparsity(self.sparsity))
        check_mode(self.mode)
        check_draft_kernel(self.draft_kernel)
        object.__setattr__(self, "max_density", check_mass(self.max_density, "max_density"))
        if not isinstance(self.calibrate, bool):
            raise ValueError(f"calibrate must be a bool, got {self.calibrate!r}")
        for flag in ("permute_once", "gathered_loads"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        adaptive = self.mode == "top_p" or self.calibrate
        check_mass_needed(self.mode, self.mass, self.calibrate)
        if self.mass is not None:
            if not adaptive:
                raise ValueError(f"mass={self.mass!r} is read by mode='top_p' or calibrate=True "
                                 f"only, got mode={self.mode!r}, calibrate=False")
            object.__setattr__(self, "mass", check_mass(self.mass))
        if self.calibrate and self.mode == "top_p":
            raise ValueError("calibrate=True sets a per-layer sparsity for mode 'global' or "
                             "'row'; mode='top_p' adapts per row already")
        object.__setattr__(self, "tile", check_tile(self.tile))
        if self.query_tile is not None:
            query_tile = check_query_tile(self.query_tile, self.tile)
            object.__setattr__(self, "query_tile", None if query_tile == self.tile else query_tile)
        steps = self.dense_steps  # numpy scalars too, stored as int or float
        if isinstance(steps, numbers.Integral) and not isinstance(steps, bool) and steps >= 0:
            object.__setattr__(self, "dense_steps", int(steps))
        elif isinstance(steps, numbers.Real) and not isinstance(steps, (bool, numbers.Integral)) \
                and 0 <= steps < 1:
            object.__setattr__(self, "dense_steps", float(steps))
        elif isinstance(steps, float) and steps == 1.0:
            raise ValueError("dense_steps=1.0 is the fraction 'every step dense', so "
                             "DraftAttention would never engage; give the int 1 for one dense "
                             "step")
        else:
            raise ValueError(
                f"dense_steps must be a step count (int >= 0) or a fraction of the steps "
                f"(float in [0, 1)), got {steps!r}"
            )
        if self.calibrate and self.dense_steps == 0:
            raise ValueError(f"calibrate=True probes the last dense warm-up step, got "
                             f"dense_steps={self.dense_steps!r}: give at least one dense step")
        layers = self.dense_layers
        if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or layers < 0:
            raise ValueError(f"dense_layers must be an int >= 0, got {layers!r}")
        object.__setattr__(self, "dense_layers", int(layers))
        for name, (th, tw) in (("tile", self.tile), ("query_tile", self.query_tile or self.tile)):
            tokens = th * tw
            if torch.cuda.is_available() and (tokens < 16 or tokens & (tokens - 1)):
                warnings.warn(f"{name} {(th, tw)} is {tokens} tokens a block: the Triton kernel "
                              f"takes powers of two >= 16, so on a GPU these blocks run the "
                              f"slower torch backend", stacklevel=3)
                break

    @property
    def dense_steps_is_fraction(self) -> bool:
        return isinstance(self.dense_steps, float)

    def dense_step_count(self, num_steps: int | None) -> int:
        """Number of leading dense steps for a run of `num_steps` denoising steps."""
        if not self.dense_steps_is_fraction:
            return self.dense_steps
        if num_steps is None:
            raise ValueError(
                f"dense_steps={self.dense_steps} is a fraction of the denoising steps, which needs "
                f"the pipeline's scheduler; with a bare transformer give a step count (int)"
            )
        return math.ceil(self.dense_steps * num_steps - 1e-6)  # a float32 0.3 is 0.30000001
