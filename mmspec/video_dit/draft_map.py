"""The draft attention map and its block mask (DraftAttention, arXiv 2505.14708, §3.1-3.2).

For each head, queries and keys are average-pooled per tile (one draft token per `th x tw` tile of
one frame) and the draft map `softmax(q_hat k_hat^T / sqrt(D))` over tiles is computed. Its kept
entries become the kept blocks of full attention, in tile order (see `tiles.py`).

With query tiles (`TileLayout.query_tile`, whole tiles each), queries are pooled per query tile
and keys per tile: the map is `[n_query_tiles, n_tiles]`, and a query tile's own blocks are the
tiles inside it. Two selection rules at the same budget of
`round((1 - sparsity) * n_query_tiles * n_tiles)` blocks per head:
- `mode="global"` (the paper): one per-head percentile over the whole map, i.e. the top entries
  of the row-normalised map, wherever they are;
- `mode="row"` (ours, after XAttention and SVG2): per-row cumulative-mass top-p, with one `p` per
  head chosen so that the head keeps the same number of blocks. A block's priority is the draft
  mass that precedes it in its row, so every row keeps its heaviest blocks first and no row is
  left empty;
- `mode="top_p"` (ours, after XAttention's and SVG2's thresholds): no fixed budget; each row
  keeps the fewest key tiles, heaviest first, whose draft mass reaches `mass`, at most
  `max_density` of the row (the cap bounds the worst case: a flat row would keep every block).
  The budget then follows the map: a peaked head or layer keeps few blocks, a diffuse one many.

Deliberate differences from the official code: each tile always keeps its own (diagonal) block,
counted inside the budget (the official code can leave a query tile with no visual key); exact
`topk` counts instead of a `>=` threshold, so ties cannot exceed the budget; pooling ignores the
padding of frames that are not whole tiles; one batched selection over all samples and heads
instead of a Python loop over heads, so a CFG batch gets one mask per sample.
"""

from __future__ import annotations

import math
import numbers

import torch
from einops import rearrange

from .tiles import TileLayout, tile_layout

MODES = ("global", "row", "top_p")


def check_sparsity(sparsity) -> float:
    # numbers.Real: numpy scalars too (a value read from an array or a sweep)
    if (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real)
            or not 0 <= sparsity < 1):
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    return float(sparsity)


def check_mass(mass, name: str = "mass") -> float:
    if isinstance(mass, bool) or not isinstance(mass, numbers.Real) or not 0 < mass <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {mass!r}")
    return float(mass)


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def check_mass_needed(mode: str, mass, calibrate: bool = False) -> None:
    """The one place that says an adaptive budget needs `mass`: `mode="top_p"` keeps it per row,
    `calibrate=True` per layer (`DraftAttentionConfig`, `select_blocks`, the fused draft)."""
    if (mode == "top_p" or calibrate) and mass is None:
        raise ValueError(f"mode={mode!r}, calibrate={calibrate} needs mass, the draft mass to "
                         f"keep (e.g. 0.9), got None")


def block_budget(num_tiles: int, sparsity: float, num_query_tiles: int | None = None) -> int:
    """Blocks kept per head: (1 - sparsity) of the map, at least the own blocks (one per tile),
    at most all. The map is `[num_query_tiles, num_tiles]` (square by default)."""
    rows = num_tiles if num_query_tiles is None else num_query_tiles
    total = rows * num_tiles
    return min(total, max(num_tiles, round((1.0 - sparsity) * total)))


def _pool(x_tiled: torch.Tensor, tiles: int, tokens: int, counts: torch.Tensor) -> torch.Tensor:
    # accumulate in fp32 without an fp32 copy of x (bf16 in, ~2x less memory traffic)
    sums = rearrange(x_tiled, "b h (n t) d -> b h n t d", t=tokens).sum(3, dtype=torch.float32)
    # padding slots are zeros, so only real tokens count; a tile of padding only pools to 0
    return sums / counts.clamp_min(1)[:, None]


def pool_tiles(x_tiled: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Mean of the real tokens of each tile: `[B, H, Np, D]` (tile order) -> fp32
    `[B, H, nT, D]`."""
    return _pool(x_tiled, layout.num_tiles, layout.tile_tokens, layout.counts)


def _tile_sums(x: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """fp32 `[B, H, T, R, C, D]`: the sum of each tile's tokens, `x` `[B, H, N, D]` in the
    model's row-major (t, h, w) order; R x C tiles per frame padded to whole query tiles (the
    tiles past the frame's edge sum to 0). Four reductions over views of `x`, no copy: whole
    tiles, the short last tile column, the short last tile row, and their corner."""
    t, height, width = layout.grid
    (th, tw), (qh, qw) = layout.tile, layout.query_tile
    frames = x.unflatten(2, (t, height, width))  # [B, H, T, height, width, D]
    # (start, tokens, tokens per tile) of the whole tiles and of the short last one
    spans = [[(0, n // run * run, run), (n // run * run, n % run, n % run)]
             for n, run in ((height, th), (width, tw))]
    rows = []
    for r0, rn, rrun in (span for span in spans[0] if span[1]):
        part = frames.narrow(3, r0, rn).unflatten(3, (rn // rrun, rrun))
        cols = [part.narrow(5, c0, cn).unflatten(5, (cn // crun, crun)).sum((4, 6),
                                                                            dtype=torch.float32)
                for c0, cn, crun in spans[1] if cn]
        rows.append(torch.cat(cols, 4))  # [B, H, T, rows of tiles, tile columns, D]
    sums = torch.cat(rows, 3)
    # tiles of padding only, where query tiles reach past the frame
    pad_r = math.ceil(height / qh) * (qh // th) - sums.shape[3]
    pad_c = math.ceil(width / qw) * (qw // tw) - sums.shape[4]
    return torch.nn.functional.pad(sums, (0, 0, 0, pad_c, 0, pad_r))


def pool_untiled(x: torch.Tensor, layout: TileLayout, query: bool = False) -> torch.Tensor:
    """`pool_tiles(layout.to_tiles(x), layout)` (`query`: `pool_query_tiles`) read from `x`
    `[B, H, N, D]` in the model's row-major (t, h, w) order, with no copy into tile order (frames
    padded to whole tiles or not). -> fp32 `[B, H, nT or nQ, D]`."""
    b, heads, _, d = x.shape
    sums = _tile_sums(x, layout)  # [B, H, T, R, C, D]
    a, c = layout.query_tile[0] // layout.tile[0], layout.query_tile[1] // layout.tile[1]
    # [B, H, T, query tile row, tile row in it, query tile column, tile column in it, D]
    sums = sums.unflatten(4, (-1, c)).unflatten(3, (-1, a))
    if query:  # a query tile's tiles
        sums = sums.sum((4, 6)).reshape(b, heads, -1, d)
        return sums / layout.query_counts.clamp_min(1)[:, None]
    # tile order: query tile row and column, then the tiles inside it (`tile_permutation`)
    sums = sums.permute(0, 1, 2, 3, 5, 4, 6, 7).reshape(b, heads, -1, d)
    return sums / layout.counts.clamp_min(1)[:, None]


def pool_query_tiles(x_tiled: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Mean of the real tokens of each query tile: `[B, H, Np, D]` -> fp32 `[B, H, nQ, D]`
    (`pool_tiles` when the layout has no query tiles of its own)."""
    if not layout.asymmetric:
        return pool_tiles(x_tiled, layout)
    return _pool(x_tiled, layout.num_query_tiles, layout.query_tile_tokens, layout.query_counts)


def draft_probs(q_hat: torch.Tensor, k_hat: torch.Tensor, scale: float,
                allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The draft map softmax(q_hat k_hat^T * scale): fp32 `[B, H, nQ, nT]`, rows sum to 1;
    over the `allowed` (bool `[nQ, nT]`, or `[1, nT]`) key tiles of each row only, when given."""
    logits = q_hat @ k_hat.transpose(-1, -2) * scale
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1)


def select_blocks(probs: torch.Tensor, sparsity: float, mode: str = "global",
                  allowed: torch.Tensor | None = None, allowed_count: int | None = None,
                  own: torch.Tensor | None = None, mass: float | None = None,
                  max_density: float = 1.0) -> torch.Tensor:
    """Kept blocks of a draft map `[B, H, nQ, nT]` -> bool `[B, H, nQ, nT]`, own blocks always
    kept.

    `mode="top_p"` takes `mass` and `max_density` instead of `sparsity` (`top_p_blocks`).

    `allowed`: bool `[nQ, nT]` of the blocks the model's own mask lets a query tile see (a
    frame-causal mask), own blocks included; only those are kept, and the budget is
    `1 - sparsity` of them (`allowed_count` of them: pass it, a host-side int, to save a device
    sync).
    `own`: bool `[nQ, nT]`, each query tile's own blocks (`TileLayout.own_blocks()`: the tiles
    inside it); default the diagonal of a square map.
    """
    sparsity, mode = check_sparsity(sparsity), check_mode(mode)  # a typo must not run row mode
    b, h, nq, n = probs.shape
    if own is None:
        if nq != n:
            raise ValueError(f"a draft map of {nq} query tiles by {n} tiles needs own=[{nq}, {n}] "
                             f"(TileLayout.own_blocks()), the blocks each query tile keeps")
        own = torch.eye(n, dtype=torch.bool, device=probs.device)
    check_mass_needed(mode, mass)
    if mode == "top_p":
        kept = top_p_blocks(probs, mass, max_density, own)
        return kept if allowed is None else kept & allowed
    if allowed is None:
        budget = block_budget(n, sparsity, nq)
        total = nq * n
    else:
        total = int(allowed.sum()) if allowed_count is None else allowed_count
        budget = min(total, max(n, round((1.0 - sparsity) * total)))
    if budget == total:
        full = torch.ones(b, h, nq, n, dtype=torch.bool, device=probs.device)
        return full if allowed is None else full & allowed
    eye = own
    if mode == "global":
        priority = probs.masked_fill(eye, 2.0)  # probabilities are <= 1, so the diagonal wins
    else:  # "row"
        # sort each row by probability, the own block first; priority = -(mass before the entry)
        order = probs.masked_fill(eye, 2.0).argsort(dim=-1, descending=True)
        ranked = probs.gather(-1, order)  # [B, H, nQ, nT]
        mass_before = ranked.cumsum(-1) - ranked
        priority = torch.empty_like(probs).scatter_(-1, order, -mass_before)
        priority = priority.masked_fill(eye, 1.0)
    if allowed is not None:
        priority = priority.masked_fill(~allowed, float("-inf"))
    top = priority.reshape(b, h, nq * n).topk(budget, dim=-1, sorted=False).indices
    kept = torch.zeros(b, h, nq * n, dtype=torch.bool, device=probs.device)
    return kept.scatter_(-1, top, True).view(b, h, nq, n)


def top_p_blocks(probs: torch.Tensor, mass: float, max_density: float,
                 own: torch.Tensor) -> torch.Tensor:
    """Per row of `probs` `[B, H, nQ, nT]`, the fewest key tiles (own tiles first, then by
    probability) whose mass reaches `mass`, at most `ceil(max_density * nT)` of them (never fewer
    than the row's own tiles) -> bool `[B, H, nQ, nT]`. Blocks outside a model mask have
    probability 0: the caller ands the result with it."""
    mass, max_density = check_mass(mass), check_mass(max_density, "max_density")
    n = probs.shape[-1]
    # per row, a tensor: no device sync
    cap = own.sum(-1, keepdim=True).clamp(min=math.ceil(max_density * n - 1e-9))  # [nQ, 1]
    order = probs.masked_fill(own, 2.0).argsort(dim=-1, descending=True)  # own tiles first
    ranked = probs.gather(-1, order)  # [B, H, nQ, nT]
    mass_before = ranked.cumsum(-1) - ranked
    rank = torch.arange(n, device=probs.device)
    keep = (mass_before < mass) & (rank < cap)  # the entry that reaches `mass` is kept
    return torch.zeros_like(keep).scatter_(-1, order, keep) | own


def calibrated_sparsity(probs: torch.Tensor, mass: float, max_density: float = 1.0,
                        allowed_count: int | None = None) -> torch.Tensor:
    """The sparsity at which `mode="global"` keeps `mass` of a draft map `[B, H, nQ, nT]` (rows
    sum to 1, 0 outside a model mask of `allowed_count` blocks): per sample and head the fewest
    entries, heaviest first, whose mass over the rows reaches `mass`, averaged over samples and
    heads, at most `max_density` of the blocks. A 0-d fp32 tensor (no device sync)."""
    mass, max_density = check_mass(mass), check_mass(max_density, "max_density")
    b, h, nq, n = probs.shape
    total = nq * n if allowed_count is None else allowed_count
    ranked = probs.flatten(2).sort(-1, descending=True).values  # [B, H, nQ * nT]
    short = (ranked.cumsum(-1) / nq < mass).sum(-1)  # entries before the one that reaches mass
    blocks = (short + 1).clamp(max=total).float().mean()
    return (1.0 - blocks / total).clamp(min=1.0 - max_density, max=1.0 - 1.0 / total)


def check_video_qk(q, k, grid) -> None:
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-D tensor [B, H, N, D], got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    tokens = grid[0] * grid[1] * grid[2]
    if q.shape[2] != tokens:
        raise ValueError(
            f"grid {tuple(grid)} has {tokens} tokens but the sequence has {q.shape[2]} video tokens"
        )


def draft_block_mask(q: torch.Tensor, k: torch.Tensor, grid, tile, sparsity: float,
                     mode: str = "global", scale: float | None = None,
                     query_tile=None, mass: float | None = None,
                     max_density: float = 1.0) -> torch.Tensor:
    """Block mask chosen by the draft attention map.

    Args:
        q, k: `[B, H, N, D]` video tokens in original (row-major t, h, w) order, N = T*H*W.
        grid: `(T, H, W)` latent tokens after patchify.
        tile: `(th, tw)` tokens pooled into one draft token (paper: (8, 16)).
        sparsity: share of blocks skipped, in [0, 1).
        mode: `"global"` (paper: per-head percentile), `"row"` (per-row top-p, same budget) or
            `"top_p"` (per row the fewest tiles holding `mass` of the draft map, at most
            `max_density` of the row; `sparsity` is not read).
        scale: softmax scale of the draft map, default `D ** -0.5`.
        query_tile: optional `(qh, qw)`, whole tiles pooled into one draft query (query blocks
            larger than key blocks, `tile_permutation`); default `tile`.

    Returns:
        bool `[B, H, nQueryTiles, nTiles]` in tile order (`tile_permutation`): True = compute the
        block (square, `[B, H, nTiles, nTiles]`, without query tiles).
    """
    sparsity, mode = check_sparsity(sparsity), check_mode(mode)
    layout = tile_layout(grid, tile, q.device, query_tile)
    check_video_qk(q, k, layout.grid)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q_hat = pool_query_tiles(layout.to_tiles(q), layout)  # [B, H, nQ, D]
    k_hat = pool_tiles(layout.to_tiles(k), layout)  # [B, H, nT, D]
    live = live_tiles(layout)
    probs = draft_probs(q_hat, k_hat, scale, live)
    if live is None:
        return select_blocks(probs, sparsity, mode, own=layout.own_blocks(), mass=mass,
                             max_density=max_density)
    allowed = live.expand(layout.num_query_tiles, -1)
    return select_blocks(probs, sparsity, mode, allowed, live_count(layout),
                         own=layout.own_blocks(), mass=mass, max_density=max_density)


def live_tiles(layout: TileLayout) -> torch.Tensor | None:
    """bool `[1, nT]`: False on tiles of padding only (query tiles larger than tiles can pad a
    frame by whole tiles); None where every tile has a real token. Such a tile is no block: it
    is never drafted nor kept, and the budget and the density count the other blocks only."""
    return None if layout.live is None else layout.live[None]


def live_count(layout: TileLayout) -> int:
    """Blocks of the video map that hold a real key: query tiles x tiles with a real token."""
    return layout.num_query_tiles * layout.num_live_tiles
