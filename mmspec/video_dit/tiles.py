"""Tile-major token order for video DiTs (DraftAttention, Shen et al., arXiv 2505.14708, §3).

DraftAttention average-pools each frame's latent tokens in `th x tw` tiles (8 x 16 in the paper) and
reorders Q, K and V so that every tile is one contiguous run of `th*tw` tokens: then one draft
token is exactly one block of the block-sparse kernel, and pooling is a mean over a contiguous
chunk.

Deliberate differences from the official code (`generate_reorg_indices`):
- any frame size works: frames are padded to whole tiles. Padded slots point at a sentinel index
  `N` (one past the last token); padded keys must be masked and padded queries dropped;
- the index tensors are built once per (grid, tile, device) with tensor ops and cached, instead of
  Python lists rebuilt on every attention call (26 ms each in the official code).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


class TileTooLarge(ValueError):
    """A tile larger than the frame of the grid it is asked to tile."""


def check_tile(tile) -> tuple[int, int]:
    if (not isinstance(tile, (tuple, list)) or len(tile) != 2
            or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tile)):
        raise ValueError(f"tile must be two positive ints (tile_h, tile_w), got {tile!r}")
    return int(tile[0]), int(tile[1])


def _check_grid_tile(grid, tile) -> tuple[tuple[int, int, int], tuple[int, int]]:
    if (not isinstance(grid, (tuple, list)) or len(grid) != 3
            or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)):
        raise ValueError(f"grid must be three positive ints (frames, height, width), got {grid!r}")
    check_tile(tile)
    t, h, w = grid
    th, tw = tile
    if th > h or tw > w:
        raise TileTooLarge(
            f"tile {tuple(tile)} is larger than the frame: grid {tuple(grid)} has frames of "
            f"{h}x{w} tokens; use a tile of at most ({h}, {w})"
        )
    return (int(t), int(h), int(w)), (int(th), int(tw))


def tile_permutation(grid, tile) -> torch.Tensor:
    """Token order that makes each `th x tw` tile of one frame a contiguous run.

    Args:
        grid: `(T, H, W)` latent tokens after patchify; tokens are numbered row-major in (t, h, w).
        tile: `(th, tw)` tokens per tile, within one frame.

    Returns:
        LongTensor `perm` of length `T * ceil(H/th)*th * ceil(W/tw)*tw`, tiles in (t, tile row,
        tile column) order and row-major inside a tile. Slots that pad a frame to whole tiles hold
        the sentinel `N = T*H*W`. So `x_tiled = cat([x, pad])[..., perm, :]`, and
        `argsort(perm)[:N]` (the sentinels sort last) gives each token's position, which restores
        the order: `x == x_tiled[..., argsort(perm)[:N], :]`. Without padding `perm` is a
        permutation of `range(N)`.
    """
    (t, h, w), (th, tw) = _check_grid_tile(grid, tile)
    nh, nw = math.ceil(h / th), math.ceil(w / tw)
    rows = torch.arange(nh * th).view(nh, th, 1, 1)  # padded frame row of each slot
    cols = torch.arange(nw * tw).view(1, 1, nw, tw)
    # [nh, th, nw, tw] -> [nh, nw, th, tw]: tile row, tile column, then row-major inside a tile
    rows = rows.expand(nh, th, nw, tw).permute(0, 2, 1, 3)
    cols = cols.expand(nh, th, nw, tw).permute(0, 2, 1, 3)
    inside = (rows < h) & (cols < w)
    in_frame = torch.where(inside, rows * w + cols, -1).reshape(-1)  # [nh*nw*th*tw]
    frames = torch.arange(t).view(t, 1) * (h * w)
    perm = torch.where(in_frame >= 0, frames + in_frame, t * h * w)  # [T, tiles*tile tokens]
    return perm.reshape(-1)


@dataclass(frozen=True)
class TileLayout:
    """Cached index tensors of one (grid, tile, device).

    perm:      long `[Np]`  source token of each tiled slot (`N` for padding)
    inverse:   long `[N]`   tiled slot of each original token
    valid:     bool `[Np]`  False on padding slots
    counts:    float `[n_tiles]` real tokens per tile (the pooling divisor)
    """

    grid: tuple[int, int, int]
    tile: tuple[int, int]
    perm: torch.Tensor
    inverse: torch.Tensor
    valid: torch.Tensor
    counts: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.inverse.numel()

    @property
    def padded_tokens(self) -> int:
        return self.perm.numel()

    @property
    def tile_tokens(self) -> int:
        return self.tile[0] * self.tile[1]

    @property
    def num_tiles(self) -> int:
        return self.padded_tokens // self.tile_tokens

    @property
    def has_padding(self) -> bool:
        return self.padded_tokens != self.num_tokens

    def to_tiles(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """`x` with N tokens along `dim` -> Np tokens in tile order, zeros in padding slots."""
        dim = dim % x.ndim
        if not self.has_padding:
            return x.index_select(dim, self.perm)
        shape = list(x.shape)
        shape[dim] = self.padded_tokens
        return x.new_zeros(shape).index_copy_(dim, self.inverse, x)

    def from_tiles(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Inverse of `to_tiles`: drops padding slots, restores the original token order."""
        return x.index_select(dim % x.ndim, self.inverse)


@functools.lru_cache(maxsize=64)
def _layout_cached(grid, tile, device: str) -> TileLayout:
    with torch.inference_mode(False):  # cached for every later call, grad-enabled ones too
        return _build_layout(grid, tile, device)


def _build_layout(grid, tile, device: str) -> TileLayout:
    perm = tile_permutation(grid, tile)
    n = grid[0] * grid[1] * grid[2]
    valid = perm < n
    inverse = torch.argsort(perm, stable=True)[:n]
    counts = valid.view(-1, tile[0] * tile[1]).sum(1).float()
    dev = torch.device(device)
    return TileLayout(grid, tile, perm.to(dev), inverse.to(dev), valid.to(dev), counts.to(dev))


def tile_layout(grid, tile, device="cpu") -> TileLayout:
    """The `TileLayout` of (grid, tile) on `device`, built once and cached."""
    grid, tile = _check_grid_tile(grid, tile)
    return _layout_cached(grid, tile, str(torch.device(device)))


def frame_causal_tiles(layout: TileLayout, frames_per_block: int) -> tuple[torch.Tensor, int]:
    """SkyReels-V2's diffusion-forcing mask at tile level: (bool `[nT, nT]`, its True count).

    A query may see a key when the key's block of `frames_per_block` frames is not later than
    its own (diffusers' `causal_mask`, row-major over (t, h, w) tokens). Tiles never span
    frames, so the token mask is constant on every (query tile, key tile) block and this is
    exact. Tiles are in frame order (`tile_permutation`), the same count per frame. Cached.
    """
    return _frame_causal_cached(layout.grid, layout.tile, str(layout.valid.device),
                                int(frames_per_block))


@functools.lru_cache(maxsize=16)
def _frame_causal_cached(grid, tile, device: str, frames_per_block: int):
    layout = tile_layout(grid, tile, device)
    frames = grid[0]
    block = torch.arange(frames, device=layout.valid.device).repeat_interleave(
        layout.num_tiles // frames) // frames_per_block
    allowed = block[None, :] <= block[:, None]
    return allowed, int(allowed.sum())
