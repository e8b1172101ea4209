"""Tile-major token order for video DiTs (DraftAttention, Shen et al., arXiv 2505.14708, §3).

DraftAttention average-pools each frame's latent tokens in `th x tw` tiles (8 x 16 in the paper) and
reorders Q, K and V so that every tile is one contiguous run of `th*tw` tokens: then one draft
token is exactly one block of the block-sparse kernel, and pooling is a mean over a contiguous
chunk.

Deliberate differences from the official code (`generate_reorg_indices`):
- any frame size works: frames are padded to whole tiles. Padded slots point at a sentinel index
  `N` (one past the last token); padded keys must be masked and padded queries dropped;
- the index tensors are built once per (grid, tile, device) with tensor ops and cached, instead of
  Python lists rebuilt on every attention call in the official code;
- ours: optional query tiles of whole tiles (`query_tile`), nested in the same order, so query
  blocks can be larger than key blocks: the selection as fine as the small key tiles, the
  kernel's query blocks as large as the query tiles (BENCHMARKS.md `draft_attention_tiles`).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, replace

import torch
from einops import rearrange


class TileTooLarge(ValueError):
    """A tile larger than the frame of the grid it is asked to tile."""


def check_tile(tile, name: str = "tile") -> tuple[int, int]:
    # numbers.Integral: numpy ints too (a size read from an array)
    if (not isinstance(tile, (tuple, list)) or len(tile) != 2
            or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t > 0
                       for t in tile)):
        raise ValueError(f"{name} must be two positive ints ({name}_h, {name}_w), got {tile!r}")
    return int(tile[0]), int(tile[1])


def check_query_tile(query_tile, tile) -> tuple[int, int]:
    """A query tile made of whole key tiles: `(a * th, c * tw)` for ints a, c >= 1."""
    qh, qw = check_tile(query_tile, "query_tile")
    th, tw = check_tile(tile)
    if qh % th or qw % tw:
        raise ValueError(f"query_tile must be whole key tiles, a multiple of tile {(th, tw)} in "
                         f"each dimension, got {tuple(query_tile)}")
    return qh, qw


def _check_grid_tile(grid, tile, query_tile=None):
    if (not isinstance(grid, (tuple, list)) or len(grid) != 3
            or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)):
        raise ValueError(f"grid must be three positive ints (frames, height, width), got {grid!r}")
    tile = check_tile(tile)
    query_tile = tile if query_tile is None else check_query_tile(query_tile, tile)
    t, h, w = grid
    for name, (th, tw) in (("tile", tile), ("query_tile", query_tile)):
        if th > h or tw > w:
            raise TileTooLarge(
                f"{name} {(th, tw)} is larger than the frame: grid {tuple(grid)} has frames of "
                f"{h}x{w} tokens; use a {name} of at most ({h}, {w})"
            )
    return (int(t), int(h), int(w)), tile, query_tile


def tile_permutation(grid, tile, query_tile=None) -> torch.Tensor:
    """Token order that makes each `th x tw` tile of one frame a contiguous run.

    Args:
        grid: `(T, H, W)` latent tokens after patchify; tokens are numbered row-major in (t, h, w).
        tile: `(th, tw)` tokens per tile, within one frame.
        query_tile: optional `(qh, qw)`, whole tiles (`qh = a*th`, `qw = c*tw`): each query tile
            is one contiguous run too, its `a x c` tiles in row-major order inside it. Then
            query blocks of `qh*qw` tokens sit over key blocks of `th*tw` tokens in one order.

    Returns:
        LongTensor `perm` of length `T * ceil(H/qh)*qh * ceil(W/qw)*qw` (`query_tile` defaults to
        `tile`), tiles in (t, tile row, tile column) order and row-major inside a tile (with
        query tiles: (t, query tile row, query tile column, tile row and column inside it, then
        row-major inside the tile)). Slots that pad a frame to whole (query) tiles hold the
        sentinel `N = T*H*W`. So `x_tiled = cat([x, pad])[..., perm, :]`, and
        `argsort(perm)[:N]` (the sentinels sort last) gives each token's position, which restores
        the order: `x == x_tiled[..., argsort(perm)[:N], :]`. Without padding `perm` is a
        permutation of `range(N)`.
    """
    (t, h, w), (th, tw), (qh, qw) = _check_grid_tile(grid, tile, query_tile)
    nh, nw, a, c = math.ceil(h / qh), math.ceil(w / qw), qh // th, qw // tw
    rows = torch.arange(nh * qh).view(nh, a, th, 1, 1, 1)  # padded frame row of each slot
    cols = torch.arange(nw * qw).view(1, 1, 1, nw, c, tw)
    # query tile row and column, tile row and column inside it, then row-major inside a tile
    # (a = c = 1 without query tiles)
    shape = (nh, a, th, nw, c, tw)
    rows, cols = (rearrange(x.expand(shape), "nh a th nw c tw -> nh nw a c th tw")
                  for x in (rows, cols))
    inside = (rows < h) & (cols < w)
    in_frame = torch.where(inside, rows * w + cols, -1).reshape(-1)  # [padded frame tokens]
    frames = torch.arange(t).view(t, 1) * (h * w)
    perm = torch.where(in_frame >= 0, frames + in_frame, t * h * w)  # [T, padded frame tokens]
    return perm.reshape(-1)


@dataclass(frozen=True)
class TileLayout:
    """Cached index tensors of one (grid, tile, query tile, device).

    perm:          long `[Np]`  source token of each tiled slot (`N` for padding)
    inverse:       long `[N]`   tiled slot of each original token
    valid:         bool `[Np]`  False on padding slots
    counts:        float `[n_tiles]` real tokens per (key) tile (the pooling divisor; 0 for a
                   tile of padding only, which only query tiles larger than `tile` can make)
    query_counts:  float `[n_query_tiles]` real tokens per query tile
    live:          bool `[n_tiles]`, False on tiles of padding only; None where there are none

    Query and key blocks: a query tile (`query_tile`, default `tile`) is one block of queries and
    a tile one block of keys; both are contiguous runs in the same token order.
    """

    grid: tuple[int, int, int]
    tile: tuple[int, int]
    perm: torch.Tensor
    inverse: torch.Tensor
    valid: torch.Tensor
    counts: torch.Tensor
    query_tile: tuple[int, int] | None = None
    query_counts: torch.Tensor | None = None
    own: torch.Tensor | None = None  # `own_blocks()`, built with the layout where asymmetric
    live: torch.Tensor | None = None
    num_live_tiles: int | None = None  # host int: tiles with a real token

    def __post_init__(self):
        if self.query_tile is None:
            object.__setattr__(self, "query_tile", self.tile)
        if self.query_counts is None:
            object.__setattr__(self, "query_counts", self.counts)
        if self.num_live_tiles is None:
            object.__setattr__(self, "num_live_tiles", self.num_tiles)

    @property
    def num_tokens(self) -> int:
        return self.inverse.numel()

    @property
    def padded_tokens(self) -> int:
        return self.perm.numel()

    @property
    def tile_tokens(self) -> int:
        """Tokens per (key) tile: the kernel's key block size."""
        return self.tile[0] * self.tile[1]

    @property
    def query_tile_tokens(self) -> int:
        """Tokens per query tile: the kernel's query block size."""
        return self.query_tile[0] * self.query_tile[1]

    @property
    def num_tiles(self) -> int:
        """(Key) tiles: draft keys, the key blocks of the video."""
        return self.padded_tokens // self.tile_tokens

    @property
    def num_query_tiles(self) -> int:
        """Query tiles: draft queries, the query blocks of the video."""
        return self.padded_tokens // self.query_tile_tokens

    @property
    def tiles_per_query_tile(self) -> int:
        return self.num_tiles // self.num_query_tiles

    @property
    def asymmetric(self) -> bool:
        return self.query_tile != self.tile

    @property
    def has_padding(self) -> bool:
        return self.padded_tokens != self.num_tokens

    def own_blocks(self) -> torch.Tensor:
        """bool `[n_query_tiles, n_tiles]`: the tiles inside each query tile (its own blocks, the
        diagonal without query tiles), tiles of padding only excluded."""
        if self.own is not None:
            return self.own
        r = self.tiles_per_query_tile
        own = (torch.arange(self.num_tiles, device=self.counts.device)[None] // r
               == torch.arange(self.num_query_tiles, device=self.counts.device)[:, None])
        return own & (self.counts > 0) if self.asymmetric else own

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
def _layout_cached(grid, tile, query_tile, device: str) -> TileLayout:
    with torch.inference_mode(False):  # cached for every later call, grad-enabled ones too
        return _build_layout(grid, tile, query_tile, device)


def _build_layout(grid, tile, query_tile, device: str) -> TileLayout:
    perm = tile_permutation(grid, tile, query_tile)
    n = grid[0] * grid[1] * grid[2]
    valid = perm < n
    inverse = torch.argsort(perm, stable=True)[:n]
    counts = valid.view(-1, tile[0] * tile[1]).sum(1).float()
    dev = torch.device(device)
    if query_tile == tile:
        return TileLayout(grid, tile, perm.to(dev), inverse.to(dev), valid.to(dev),
                          counts.to(dev))
    query_counts = valid.view(-1, query_tile[0] * query_tile[1]).sum(1).float()
    layout = TileLayout(grid, tile, perm.to(dev), inverse.to(dev), valid.to(dev), counts.to(dev),
                        query_tile, query_counts.to(dev))
    # once, outside inference mode like the rest (read by every sparse call)
    live = counts > 0
    dead = not bool(live.all())
    return replace(layout, own=layout.own_blocks(), live=live.to(dev) if dead else None,
                   num_live_tiles=int(live.sum()))


def tile_layout(grid, tile, device="cpu", query_tile=None) -> TileLayout:
    """The `TileLayout` of (grid, tile, query_tile) on `device`, built once and cached.
    `query_tile`: whole tiles per query block (`tile_permutation`), default `tile`."""
    if isinstance(device, (tuple, list)):  # tile_permutation takes query_tile third
        raise TypeError(f"tile_layout: device must be a device, got {device!r}; pass the query "
                        f"tile by keyword, query_tile={tuple(device)!r}")
    grid, tile, query_tile = _check_grid_tile(grid, tile, query_tile)
    return _layout_cached(grid, tile, query_tile, str(torch.device(device)))


def frame_causal_tiles(layout: TileLayout, frames_per_block: int) -> tuple[torch.Tensor, int]:
    """SkyReels-V2's diffusion-forcing mask at tile level: (bool `[nQ, nT]` (query tiles, tiles),
    its True count).

    A query may see a key when the key's block of `frames_per_block` frames is not later than
    its own (diffusers' `causal_mask`, row-major over (t, h, w) tokens). Tiles never span
    frames, so the token mask is constant on every (query tile, key tile) block and this is
    exact. Tiles are in frame order (`tile_permutation`), the same count per frame. Cached.
    """
    return _frame_causal_cached(layout.grid, layout.tile, layout.query_tile,
                                str(layout.valid.device), int(frames_per_block))


@functools.lru_cache(maxsize=16)
def _frame_causal_cached(grid, tile, query_tile, device: str, frames_per_block: int):
    layout = tile_layout(grid, tile, device, query_tile)
    frames = torch.arange(grid[0], device=layout.valid.device)
    q_block = frames.repeat_interleave(layout.num_query_tiles // grid[0]) // frames_per_block
    k_block = frames.repeat_interleave(layout.num_tiles // grid[0]) // frames_per_block
    allowed = k_block[None, :] <= q_block[:, None]
    if layout.live is not None:  # tiles of padding only are no block to allow
        allowed &= layout.live
    return allowed, int(allowed.sum())
