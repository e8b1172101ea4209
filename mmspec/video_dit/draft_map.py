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
  left empty.

Deliberate differences from the official code: each tile always keeps its own (diagonal) block,
counted inside the budget (the official code can leave a query tile with no visual key); exact
`topk` counts instead of a `>=` threshold, so ties cannot exceed the budget; pooling ignores the
padding of frames that are not whole tiles; one batched selection over all samples and heads
instead of a Python loop over heads, so a CFG batch gets one mask per sample.
"""

from __future__ import annotations

import numbers

import torch

from .tiles import TileLayout, tile_layout

MODES = ("global", "row")


def check_sparsity(sparsity) -> float:
    # numbers.Real: numpy scalars too (a value read from an array or a sweep)
    if (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real)
            or not 0 <= sparsity < 1):
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    return float(sparsity)


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def block_budget(num_tiles: int, sparsity: float, num_query_tiles: int | None = None) -> int:
    """Blocks kept per head: (1 - sparsity) of the map, at least the own blocks (one per tile),
    at most all. The map is `[num_query_tiles, num_tiles]` (square by default)."""
    rows = num_tiles if num_query_tiles is None else num_query_tiles
    total = rows * num_tiles
    return min(total, max(num_tiles, round((1.0 - sparsity) * total)))


def _pool(x_tiled: torch.Tensor, tiles: int, tokens: int, counts: torch.Tensor) -> torch.Tensor:
    b, h, _, d = x_tiled.shape
    # accumulate in fp32 without an fp32 copy of x (bf16 in, ~2x less memory traffic)
    sums = x_tiled.view(b, h, tiles, tokens, d).sum(3, dtype=torch.float32)
    # padding slots are zeros, so only real tokens count; a tile of padding only pools to 0
    return sums / counts.clamp_min(1)[:, None]


def pool_tiles(x_tiled: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Mean of the real tokens of each tile: `[B, H, Np, D]` (tile order) -> fp32
    `[B, H, nT, D]`."""
    return _pool(x_tiled, layout.num_tiles, layout.tile_tokens, layout.counts)


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
                  own: torch.Tensor | None = None) -> torch.Tensor:
    """Kept blocks of a draft map `[B, H, nQ, nT]` -> bool `[B, H, nQ, nT]`, own blocks always
    kept.

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
                     query_tile=None) -> torch.Tensor:
    """Block mask chosen by the draft attention map.

    Args:
        q, k: `[B, H, N, D]` video tokens in original (row-major t, h, w) order, N = T*H*W.
        grid: `(T, H, W)` latent tokens after patchify.
        tile: `(th, tw)` tokens pooled into one draft token (paper: (8, 16)).
        sparsity: share of blocks skipped, in [0, 1).
        mode: `"global"` (paper: per-head percentile) or `"row"` (per-row top-p, same budget).
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
        return select_blocks(probs, sparsity, mode, own=layout.own_blocks())
    allowed = live.expand(layout.num_query_tiles, -1)
    return select_blocks(probs, sparsity, mode, allowed, live_count(layout),
                         own=layout.own_blocks())


def live_tiles(layout: TileLayout) -> torch.Tensor | None:
    """bool `[1, nT]`: False on tiles of padding only (query tiles larger than tiles can pad a
    frame by whole tiles); None where every tile has a real token. Such a tile is no block: it
    is never drafted nor kept, and the budget and the density count the other blocks only."""
    return None if layout.live is None else layout.live[None]


def live_count(layout: TileLayout) -> int:
    """Blocks of the video map that hold a real key: query tiles x tiles with a real token."""
    return layout.num_query_tiles * layout.num_live_tiles
