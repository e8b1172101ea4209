"""One DraftAttention call: draft map -> block mask -> block-sparse attention (arXiv 2505.14708).

The draft map picks the kept blocks of the video tokens in tile order, and
`mmspec.kernels.block_sparse_attention` computes only those. Tokens in the model's order are not
copied into tile order: the draft pools them through the tile permutation and the kernel reads q,
k and v through it (`token_order=`), leaving out the slots that pad frames to whole tiles and the
keys `key_valid` masks in its loads (`key_valid=`), and writes the output in the model's order.
Only where the kernel would not read through the order (the torch backend, `torch.compile`) and
keys are left out are they copied into tile order and the output back (`_attend_tiled`: padded
keys zeroed and divided out of the softmax, below). A caller may also reorder them once per
forward (`tiled=True`): the kernel then reads the text in place and leaves masked keys out
alike. Text
tokens of joint attention (HunyuanVideo appends them, CogVideoX prepends them) are moved behind the
video tiles and keep dense block rows and columns, as in the official code's all-ones text blocks,
except text blocks that hold only padding (`key_valid`), which are skipped (`_live_blocks`).

Deliberate differences from the official code: padded keys (frames that are not whole tiles, text
padding) are excluded exactly instead of asserted away: zeroed and divided out of the softmax
through the kernel's lse, with a recomputation around mean stand-in keys as the fallback where
that would lose precision (no element masks, static shapes, so `torch.compile` traces it with no
graph break); every sample of a batch (CFG)
gets its own mask in the same kernel call; the kernel is mmspec's (Triton on GPU, torch on CPU)
instead of the CUDA-only Block-Sparse-Attention.
"""

from __future__ import annotations

import functools
import math

import torch

from mmspec.kernels import BlockSparseMask, block_sparse_attention, reads_through_order

from . import fused_draft
from .config import DraftAttentionConfig
from .draft_map import (check_sparsity, draft_probs, live_count, live_tiles, pool_query_tiles,
                        pool_tiles, pool_untiled, select_blocks)
from .tiles import TileLayout


def _fused(draft_kernel: str, device: torch.device, layout: TileLayout) -> bool:
    """Whether the draft side runs fused (`fused_draft.py`): on CUDA by default, where its
    twenty-odd small torch launches cost more than the ops; `"triton"` asks for it anywhere it
    runs (the tests, under TRITON_INTERPRET=1), `"torch"` never. Eager only by default: under
    torch.compile the torch path is traced (and fused by the compiler) instead."""
    if draft_kernel == "torch":  # validated by DraftAttentionConfig
        return False
    why = fused_draft.unsupported(device, layout)
    if draft_kernel == "auto":
        return device.type == "cuda" and why is None and not torch.compiler.is_compiling()
    if why is not None:
        raise ValueError(f"draft_kernel='triton' cannot run here: {why}")
    return True


def _split_text(x, text_len: int, text_first: bool):
    """`[B, H, L, D]` -> (video, text) along tokens."""
    if text_len == 0:
        return x, x[:, :, :0]
    if text_first:
        return x[:, :, text_len:], x[:, :, :text_len]
    return x[:, :, : x.shape[2] - text_len], x[:, :, x.shape[2] - text_len :]


def _kernel_key_valid(layout: TileLayout, key_valid, text_len: int, text_first: bool,
                      tiled: bool) -> torch.Tensor:
    """bool `[B|1, Np + text_len]`: which keys exist, in kernel order (video tiles, then text)."""
    if key_valid is None:
        return torch.cat([layout.valid, layout.valid.new_ones(text_len)])[None]
    video, text = _split_text(key_valid[:, None, :, None], text_len, text_first)
    video, text = video[:, 0, :, 0], text[:, 0, :, 0]  # [B, N or Np], [B, text_len]
    # to_tiles fills padding slots with False, so padded keys are invalid either way
    video = video & layout.valid if tiled else layout.to_tiles(video, dim=1)
    return torch.cat([video, text], dim=1)


def _live_text(valid: torch.Tensor, n_video: int, n_blocks: int, bs: int) -> torch.Tensor:
    """bool `[B|1, n_blocks]`: True on the video blocks and on text blocks (of `bs` tokens,
    after `n_video` video blocks) with a valid token."""
    text = valid[:, n_video * bs :]
    text = torch.nn.functional.pad(text, (0, (n_blocks - n_video) * bs - text.shape[1]))
    return torch.cat([text.new_ones(text.shape[0], n_video),
                      text.view(-1, n_blocks - n_video, bs).any(-1)], 1)


def _live_blocks(valid: torch.Tensor, layout: TileLayout, mq: int, mk: int) -> torch.Tensor:
    """bool `[B|1, 1, Mq, Mk]`: False in the block rows and columns of text blocks with no valid
    token. Such keys add nothing to any softmax, and such queries' outputs are read by no valid
    token (their keys are masked in every layer), so the kernel skips both; their output rows are
    0. Text padding is contiguous: HunyuanVideo pads its prompt at the end, and HunyuanVideo 1.5
    puts the valid image, glyph and prompt tokens first. HunyuanVideo 1.5 at 480p, 121 frames:
    496 video tiles and 1,985 text and image tokens in 16 blocks, of which a prompt fills one or
    two; at 90% sparsity the 16 dense text rows and columns were 40% of the blocks computed."""
    rows = _live_text(valid, layout.num_query_tiles, mq, layout.query_tile_tokens)
    cols = _live_text(valid, layout.num_tiles, mk, layout.tile_tokens)
    return (rows[:, :, None] & cols[:, None, :])[:, None]


def _attend_without_invalid_keys(q, k, v, blocks, valid, query_is_padding, bs, scale, backend,
                                 zeroed=False):
    """Block-sparse attention over `blocks` that ignores the keys where `valid` is False, exactly.

    Invalid keys get k = v = 0, so each adds exp(0) to the softmax denominator of the rows that
    keep its block and nothing to the numerator; with the kernel's lse the true output is
    `out / (1 - n_invalid * exp(-lse))`. This needs no element masks, whose memory grows with
    every kept block that holds padding (tens of thousands of 128x128 masks per layer for Wan at
    480p). Where invalid keys dominate a row's denominator (real logits far below 0) the
    correction would lose precision, and the call is redone by `_attend_with_mean_keys`, whose
    stand-in keys cannot dominate. Under `torch.compile` that choice is a `torch.cond`, so the
    graph has no data-dependent Python branch (diffusers' `compile_repeated_blocks(
    fullgraph=True)`).
    `bs`: (bq, bk), the query and key block sizes (an int: both).
    `zeroed`: k and v are already 0 at the invalid keys (padding slots made by `to_tiles`).
    """
    length, m = q.shape[2], blocks.shape[-1]
    bq, bk = (bs, bs) if isinstance(bs, int) else bs
    keep = valid[:, None, :, None]  # [B|1, 1, L, 1]
    mask = BlockSparseMask.from_dense(blocks, bs, length, length)
    if not zeroed:
        k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
    out, lse = block_sparse_attention(q, k, v, mask, scale=scale, return_lse=True, backend=backend)
    invalid = torch.nn.functional.pad(~valid, (0, m * bk - length)).view(-1, m, bk).sum(-1)
    per_block = blocks.float() @ invalid.float()[:, None, :, None]  # [B, H, Mq, 1] per q block
    n_invalid = per_block[..., 0].repeat_interleave(bq, dim=-1)[..., :length]  # [B, H, L]
    # a row with no kept block (skipped text padding) has lse = -inf and no invalid key
    share = n_invalid * torch.exp(-torch.where(n_invalid > 0, lse, 0.0))  # no 0 * inf
    share = share.masked_fill(query_is_padding, 0.0)

    def corrected(out, share):
        return (out.float() / (1.0 - share)[..., None]).to(out.dtype)

    def redone(out, share):
        return _attend_with_mean_keys(q, k, v, blocks, valid, bs, scale, backend)

    imprecise = (share > 0.99).any()
    if torch.compiler.is_compiling():
        return torch.cond(imprecise, redone, corrected, (out, share))
    return redone(out, share) if bool(imprecise) else corrected(out, share)


def _attend_with_mean_keys(q, k, v, blocks, valid, bs, scale, backend):
    """`_attend_without_invalid_keys` for rows where zeroed invalid keys dominate the softmax.

    Each invalid key stands in as the mean of its block's valid keys, with v = 0, and a block
    with no valid key is skipped. By Jensen's inequality such a key weighs at most the mean weight
    of its block's valid keys, so a row's valid share of the softmax is at least
    `valid / block size` of its sparsest kept block: no cancellation. A second kernel call with
    v = 1 on the valid keys (0 elsewhere) returns that share itself, with the same weights, and
    the output is divided by it. Static shapes throughout, so it runs inside `torch.cond`.
    """
    b, hk, length, d = k.shape
    m = blocks.shape[-1]
    bk = bs if isinstance(bs, int) else bs[1]  # (bq, bk)
    keep = valid[:, None, :, None]  # [B|1, 1, L, 1]
    pad = m * bk - length
    counts = torch.nn.functional.pad(valid, (0, pad)).view(-1, m, bk).sum(-1)  # [B|1, Mk]
    sums = torch.nn.functional.pad(k.masked_fill(~keep, 0.0), (0, 0, 0, pad)).view(
        b, hk, m, bk, d).sum(3, dtype=torch.float32)  # [B, Hk, Mk, D]
    means = (sums / counts.clamp_min(1)[:, None, :, None]).to(k.dtype)
    k = torch.where(keep, k, means.repeat_interleave(bk, dim=2)[:, :, :length])
    blocks = blocks & (counts > 0)[:, None, None, :]
    mask = BlockSparseMask.from_dense(blocks, bs, length, length)
    out = block_sparse_attention(q, k, v.masked_fill(~keep, 0.0), mask, scale=scale,
                                 backend=backend)
    ones = keep.to(v.dtype).expand(b, hk, length, d)  # the kernel's D; only column 0 is read
    share = block_sparse_attention(q, k, ones, mask, scale=scale, backend=backend)[..., :1]
    # share > 0 in every row with a valid key in a kept block (a query tile's own blocks have
    # one); a row with no kept block (skipped text padding) has share 0 and output 0
    return (out.float() / share.float().clamp_min(1e-30)).to(out.dtype)


@functools.lru_cache(maxsize=16)
def _default_config(tile, query_tile) -> DraftAttentionConfig:
    return DraftAttentionConfig(tile=tile, query_tile=query_tile)


def _config_for(layout: TileLayout, config) -> DraftAttentionConfig:
    """`config`, or the defaults for the layout's tiles; a config of other tiles is refused."""
    if config is None:
        return _default_config(layout.tile, layout.query_tile)
    if not isinstance(config, DraftAttentionConfig):
        raise TypeError(f"config must be a DraftAttentionConfig or None, got "
                        f"{type(config).__name__}")
    tiles = (config.tile, config.query_tile or config.tile)
    if tiles != (layout.tile, layout.query_tile):
        raise ValueError(f"config's tile {config.tile} and query_tile {config.query_tile} must "
                         f"be the layout's, {layout.tile} and {layout.query_tile}")
    return config


def _check_call(q, video_tokens: int, layout: TileLayout, tiled: bool, text_len: int,
                key_valid) -> None:
    expected = layout.padded_tokens if tiled else layout.num_tokens
    if video_tokens != expected:
        raise ValueError(
            f"grid {layout.grid} has {expected} {'tiled ' if tiled else ''}tokens but the sequence "
            f"has {video_tokens} video tokens ({q.shape[2]} tokens, {text_len} of them text)")
    shapes = ((q.shape[0], q.shape[2]), (1, q.shape[2]))
    if key_valid is not None and (key_valid.dtype != torch.bool
                                  or tuple(key_valid.shape) not in shapes):
        raise ValueError(f"key_valid must be bool [B={q.shape[0]}, L={q.shape[2]}] in the order "
                         f"of q, k, v, got {key_valid.dtype} {list(key_valid.shape)}")


def _allowed_blocks(allowed, layout: TileLayout, text_len: int):
    """(bool `[nQ, nT]` or None, its count or None): the model's mask `allowed` (a tensor, or a
    (tensor, count) pair) checked, with the tiles of padding only left out."""
    nq, nt = layout.num_query_tiles, layout.num_tiles
    allowed, count = allowed if isinstance(allowed, tuple) else (allowed, None)
    if allowed is not None and text_len:
        raise ValueError("allowed (a mask over video tiles) takes no text tokens; got text_len="
                         f"{text_len}")
    if allowed is not None and (not isinstance(allowed, torch.Tensor)
                                or allowed.dtype != torch.bool or tuple(allowed.shape) != (nq, nt)):
        raise ValueError(f"allowed must be a bool tensor [{nq}, {nt}] (query tile, key tile), or "
                         f"such a tensor and its count, got "
                         f"{getattr(allowed, 'dtype', type(allowed).__name__)} "
                         f"{list(getattr(allowed, 'shape', []))}")
    # tiles of padding only (query tiles padding the frames) are no blocks: never drafted, kept,
    # nor counted in the budget or the density
    live = live_tiles(layout)  # bool [1, nT], or None
    if live is not None:
        if allowed is None:
            allowed, count = live.expand(nq, nt), live_count(layout)
        else:  # frame_causal_tiles leaves them out already, so its count stays right
            allowed = allowed & live
    if allowed is not None and count is None:
        count = int(allowed.sum())  # a device sync: pass (allowed, count) to save it
    return allowed, count


def _draft(videos, layout: TileLayout, config, sparsity: float, allowed, allowed_count,
           on_draft_map, untiled: bool):
    """The kept blocks bool `[B, H, nQ, nT]` of the draft map, and the fused draft's result (its
    block index) or None. `videos`: q's and k's video tokens, in tile order or (`untiled`) in
    the model's order, read through the tile permutation without a copy."""
    q, k = videos
    scale = q.shape[-1] ** -0.5
    if _fused(config.draft_kernel, q.device, layout):
        drafted = fused_draft.draft_blocks(
            q, k, layout, sparsity, config.mode, scale, allowed, allowed_count, config.mass,
            config.max_density, return_probs=on_draft_map is not None, untiled=untiled)
        if on_draft_map is not None:
            on_draft_map(drafted.probs)
        return drafted.kept, drafted
    if untiled:
        q_hat, k_hat = pool_untiled(q, layout, query=True), pool_untiled(k, layout)
    else:
        q_hat, k_hat = pool_query_tiles(q, layout), pool_tiles(k, layout)  # [B, H, nQ|nT, D]
    probs = draft_probs(q_hat, k_hat, scale, allowed)  # [B, H, nQ, nT]
    if on_draft_map is not None:
        on_draft_map(probs)
    kept = select_blocks(probs, sparsity, config.mode, allowed, allowed_count,
                         own=layout.own_blocks() if layout.asymmetric else None, mass=config.mass,
                         max_density=config.max_density)  # [B, H, nQ, nT]
    return kept, None


def _with_text(kept, layout: TileLayout, text_len: int):
    """bool `[B, H, Mq, Mk]`: the video blocks, then dense rows and columns of text blocks."""
    b, h, nq, nt = kept.shape
    mq = nq + math.ceil(text_len / layout.query_tile_tokens)
    mk = nt + math.ceil(text_len / layout.tile_tokens)
    if mk == nt:
        return kept
    blocks = torch.ones(b, h, mq, mk, dtype=torch.bool, device=kept.device)
    blocks[:, :, :nq, :nt] = kept
    if layout.live is not None:  # text queries skip the tiles of padding only too
        blocks[:, :, nq:, :nt] &= layout.live
    return blocks


def _token_order(layout: TileLayout, text_len: int, text_first: bool) -> torch.Tensor:
    """long `[Np + text_len]`: the model's token of each kernel row (video tiles, then text),
    -1 in the slots that pad frames to whole tiles (no token: `block_sparse_attention`)."""
    perm = layout.perm
    if layout.has_padding:
        perm = torch.where(layout.valid, perm, -1)
    if not text_len:
        return perm
    text = torch.arange(text_len, device=perm.device)
    if text_first:
        return torch.cat([torch.where(perm >= 0, perm + text_len, -1), text])
    return torch.cat([perm, text + layout.num_tokens])


def draft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TileLayout,
                    config: DraftAttentionConfig | None = None, *, sparsity: float | None = None,
                    text_len: int = 0, text_first: bool = False,
                    key_valid: torch.Tensor | None = None, tiled: bool = False,
                    on_draft_map=None, allowed=None):
    """DraftAttention over video tokens plus optional dense text tokens.

    Args:
        q, k, v: `[B, H, L, D]`; L = video tokens + `text_len`. Video tokens are in row-major
            (t, h, w) order, or already in tile order with padding (`tiled=True`, L = Np + text).
        layout: the `TileLayout` of the video grid and tile (and query tile: query blocks of
            `layout.query_tile_tokens` over key blocks of `layout.tile_tokens`).
        config: the `DraftAttentionConfig` (validated when made): `mode`, `mass`, `max_density`,
            `backend` and `draft_kernel` are read here, its tiles must be the layout's; None for
            the defaults at the layout's tiles.
        sparsity: this call's sparsity, default `config.sparsity` (calibration sets one per layer).
        text_len: text tokens, after the video (HunyuanVideo) or before it (`text_first`, CogVideoX).
        key_valid: optional bool `[B, L]` in the order of q, k, v (model order; tile order with
            padding slots when `tiled`), False for keys to ignore (text padding). A text block
            with no valid token is skipped as keys and as queries: its output rows are 0
            (padding whose output no valid token reads).
        on_draft_map: optional `callback(probs)` with the draft map fp32 `[B, H, nQueryTiles,
            nTiles]` (tile order; square without query tiles) before the blocks are selected,
            e.g. to plot it.
        allowed: optional bool `[nQueryTiles, nTiles]` (tile order), or such a tensor and its
            number of True entries as a host int (no device sync; `frame_causal_tiles` returns
            both, tiles of padding only left out): the video blocks the model's own mask allows
            (SkyReels-V2's frame-causal diffusion forcing); the draft map and the selection stay
            inside it, and the budget and density count its blocks only.

    Tokens in the model's order (`tiled=False`) are never copied into tile order where the kernel
    reads through the order (Triton, eager): the draft pools and the kernel attends through the
    tile permutation (`block_sparse_attention(token_order=, key_valid=)`), padding slots and
    invalid keys left out in its loads, and the output comes back in the model's order.

    Returns:
        (out `[B, H, L, D]` in the input order, density: 0-d tensor, share of blocks computed).
    """
    config = _config_for(layout, config)
    sparsity = config.sparsity if sparsity is None else check_sparsity(sparsity)
    parts = [_split_text(x, text_len, text_first) for x in (q, k, v)]
    _check_call(q, parts[0][0].shape[2], layout, tiled, text_len, key_valid)
    allowed, allowed_count = _allowed_blocks(allowed, layout, text_len)
    if not tiled:  # the model's order, read through the permutation: no copy
        videos = [p[0] for p in parts]
    elif layout.has_padding:
        # reordered once per forward: the padding slots carry hidden states of their own (the
        # model's shifts and biases), which must not enter the pooled draft tokens
        videos = [p[0].masked_fill(~layout.valid[:, None], 0.0) for p in parts]
    else:
        videos = [p[0] for p in parts]
    kept, drafted = _draft(videos[:2], layout, config, sparsity, allowed, allowed_count,
                           on_draft_map, not tiled)
    blocks = _with_text(kept, layout, text_len)
    if key_valid is not None and blocks.shape[-1] > kept.shape[-1]:  # text blocks of padding
        valid = _kernel_key_valid(layout, key_valid, text_len, text_first, tiled)
        blocks = blocks & _live_blocks(valid, layout, *blocks.shape[2:])
    out = _attend((q, k, v), parts, videos, blocks, drafted, layout, config.backend,
                  (text_len, text_first), key_valid, tiled, config.gathered_loads)
    # no fp32 copy of the block map; with a model mask, the share of the blocks it allows
    if allowed is None:
        return out, torch.count_nonzero(blocks) / blocks.numel()
    b, h, mq, mk = blocks.shape
    count = allowed_count
    if mk > kept.shape[3]:  # the text rows and columns, over the tiles with a real token
        nq, nt = kept.shape[2:]
        count += mq * mk - nq * nt - (mq - nq) * (nt - layout.num_live_tiles)
    return out, torch.count_nonzero(blocks) / (count * b * h)


def _fused_mask(drafted, blocks, layout: TileLayout, length: int):
    """The kernel's mask from the fused draft's block index (no text blocks), else None."""
    if drafted is None or blocks.shape[-1] != layout.num_tiles:
        return None
    return BlockSparseMask.from_full_lists(drafted.counts, drafted.indices,
                                           (layout.query_tile_tokens, layout.tile_tokens),
                                           length, length)


def _tiled_order(layout: TileLayout, text_len: int, text_first: bool, identity: bool):
    """long `[Np + text_len]`: the input's token of each kernel row for tokens already in tile
    order (`tiled`), where it is not the input's own order (text first); else `arange` where
    `identity` is asked for (`key_valid` needs an order), else None."""
    length = layout.padded_tokens + text_len
    rows = torch.arange(length, device=layout.perm.device)
    if text_len and text_first:
        return torch.cat([rows[text_len:], rows[:text_len]])
    return rows if identity else None


def _attend(q_k_v, parts, videos, blocks, drafted, layout: TileLayout, backend: str, text,
            key_valid, tiled: bool, gathered_loads: bool = True):
    """Block-sparse attention over `blocks`, the output in the input's order. The kernel reads
    q, k, v through the order of its rows (the tile permutation; text behind the video) and
    leaves the padding slots of frames that are not whole tiles and the keys `key_valid` marks
    out in its loads (`block_sparse_attention(token_order=, key_valid=)`): no copy. Where keys
    are left out and the kernel would not read through the order (`reads_through_order`: the
    torch backend, `torch.compile`), the video tokens are copied into tile order instead
    (`_attend_tiled`; the torch backend's own gathered call would build a token mask of the
    whole call), as are tiled inputs with padding slots, and every input in the model's order
    when `gathered_loads` is False (`DraftAttentionConfig.gathered_loads`). `text`: (text_len,
    text_first)."""
    text_len, text_first = text
    length = layout.padded_tokens + text_len
    mask = _fused_mask(drafted, blocks, layout, length)
    if mask is None:
        mask = BlockSparseMask.from_dense(
            blocks, (layout.query_tile_tokens, layout.tile_tokens), length, length)
    if tiled:  # the input is the kernel's order but for text in front
        order = _tiled_order(layout, text_len, text_first, key_valid is not None)
        plain = order is None and key_valid is None
    else:
        order = _token_order(layout, text_len, text_first)
        plain = not layout.has_padding and key_valid is None  # a gather on any backend
    copy = not tiled and not gathered_loads  # into tile order in this layer, and back
    if not copy and not (tiled and layout.has_padding) and (
            plain or reads_through_order(*q_k_v, mask, backend)):
        return block_sparse_attention(*q_k_v, mask, scale=q_k_v[0].shape[-1] ** -0.5,
                                      backend=backend, token_order=order, key_valid=key_valid)
    if not tiled:
        videos = [layout.to_tiles(p[0]) for p in parts]  # [B, H, Np, D], zeros in padding slots
    return _attend_tiled(parts, videos, blocks, drafted, layout, backend, text_len, text_first,
                         key_valid, tiled)


def _attend_tiled(parts, videos, blocks, drafted, layout: TileLayout, backend: str,
                  text_len: int, text_first: bool, key_valid, tiled: bool):
    """Block-sparse attention over `blocks` on the video tokens in tile order (`videos`) and the
    text (`parts`), the output restored to the input's order."""
    bs = (layout.query_tile_tokens, layout.tile_tokens)
    length = layout.padded_tokens + text_len
    scale = videos[0].shape[-1] ** -0.5
    mask = _fused_mask(drafted, blocks, layout, length)
    valid = _kernel_key_valid(layout, key_valid, text_len, text_first, tiled)  # [B|1, length]
    # no .contiguous(): every backend takes strided q, k, v (a copy costs ~5% of a layer on a GPU)
    q_k_v = [torch.cat([vid, p[1]], dim=2) if text_len else vid for vid, p in zip(videos, parts)]
    # without key_valid or padding every key is valid: no device sync to find that out
    # (under torch.compile the exact path runs instead of a data-dependent branch)
    if (key_valid is None and not layout.has_padding) or (
            not torch.compiler.is_compiling() and bool(valid.all())):
        if mask is None:
            mask = BlockSparseMask.from_dense(blocks, bs, length, length)
        out = block_sparse_attention(*q_k_v, mask, scale=scale, backend=backend)  # kernel order
    else:
        query_is_padding = torch.cat([~layout.valid, layout.valid.new_zeros(text_len)])
        # without key_valid, the invalid keys are the padding slots, zero-filled by to_tiles
        # (or by the masked_fill above when tiled)
        out = _attend_without_invalid_keys(*q_k_v, blocks, valid, query_is_padding, bs, scale,
                                           backend, zeroed=key_valid is None)
    out_video, out_text = out[:, :, : layout.padded_tokens], out[:, :, layout.padded_tokens :]
    if not tiled:
        out_video = layout.from_tiles(out_video)
    if not text_len:
        return out_video
    return torch.cat([out_text, out_video] if text_first else [out_video, out_text], dim=2)
