"""Query tiles larger than key tiles: query blocks of whole tiles over finer key blocks."""

import math

import pytest
import torch
import torch.nn.functional as F

from mmspec.video_dit import (DraftAttentionConfig, apply_draft_attention, draft_attention,
                              draft_block_mask, remove_draft_attention, tile_layout,
                              tile_permutation)
from mmspec.video_dit.tiles import TileTooLarge, frame_causal_tiles

from .test_sparse_attention import _token_mask

# 6x10 frames: 4x4 query tiles pad them to 8x12, which leaves 2x2 key tiles of padding only
GRID, TILE, QTILE = (2, 6, 10), (2, 2), (4, 4)
N = 120


def _qkv(b=2, h=2, length=N, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, length, d, generator=g) for _ in range(3)]


def _layout():
    return tile_layout(GRID, TILE, query_tile=QTILE)


@pytest.mark.parametrize("grid,tile,query_tile", [((2, 8, 16), (2, 4), (4, 8)),
                                                  ((3, 6, 10), (2, 2), (4, 4)),
                                                  ((1, 5, 7), (1, 2), (3, 4))])
def test_each_query_tile_is_a_run_of_whole_tiles(grid, tile, query_tile):
    t, h, w = grid
    perm = tile_permutation(grid, tile, query_tile)
    n = t * h * w
    assert sorted(perm[perm < n].tolist()) == list(range(n))  # a bijection on the real tokens
    qh, qw = query_tile
    th, tw = tile
    assert perm.numel() == t * math.ceil(h / qh) * qh * math.ceil(w / qw) * qw
    # the coordinates of each slot, padding slots included: invert the construction by hand
    nh, nw = math.ceil(h / qh), math.ceil(w / qw)
    slots = []
    for f in range(t):
        for a in range(nh):
            for c in range(nw):
                for i in range(qh // th):
                    for j in range(qw // tw):
                        for y in range(th):
                            for x in range(tw):
                                row, col = a * qh + i * th + y, c * qw + j * tw + x
                                inside = row < h and col < w
                                slots.append(f * h * w + row * w + col if inside else n)
    assert perm.tolist() == slots
    # each key tile is one th x tw patch of one frame, each query tile one qh x qw patch
    real = perm.clone()
    for size, (ph, pw) in ((th * tw, tile), (qh * qw, query_tile)):
        for run in real.view(-1, size):
            tokens = run[run < n]
            if size == qh * qw:  # a query tile always holds a real token; a tile may not
                assert len(tokens)
            frames, rows, cols = tokens // (h * w), tokens % (h * w) // w, tokens % w
            assert frames.unique().numel() <= 1
            assert not len(tokens) or (rows.max() - rows.min() < ph
                                       and cols.max() - cols.min() < pw)
    # with query_tile == tile the order is the square one
    assert torch.equal(tile_permutation(grid, tile, tile), tile_permutation(grid, tile))


def test_layout_counts_and_own_blocks():
    layout = _layout()
    assert (layout.query_tile_tokens, layout.tile_tokens) == (16, 4)
    assert (layout.num_query_tiles, layout.num_tiles) == (2 * 2 * 3, 2 * 2 * 3 * 4)
    assert layout.query_counts.sum() == N and layout.counts.sum() == N
    # per frame 4x6 tiles of 2x2 over the padded 8x12; rows 6-7 and columns 10-11 are padding
    assert (layout.counts == 0).sum() == 2 * (4 * 6 - 3 * 5)
    own = layout.own_blocks()
    assert own.shape == (12, 48)
    assert (own.sum(1) >= 1).all() and not own[:, layout.counts == 0].any()
    assert torch.equal(own.nonzero()[:, 0], (own.nonzero()[:, 1] // 4))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(tile=(2, 4), query_tile=(3, 4)), ValueError, r"query_tile must be whole key tiles"),
    (dict(tile=(2, 2), query_tile=(8, 4)), TileTooLarge, r"query_tile \(8, 4\) is larger"),
    (dict(tile=(2, 2), query_tile=(4,)), ValueError, r"^query_tile must be two positive ints"),
    (dict(tile=(2, 2), query_tile=(0, 4)), ValueError, r"^query_tile must be two positive ints"),
])
def test_bad_query_tile(kwargs, error, match):
    with pytest.raises(error, match=match):
        tile_layout(GRID, **kwargs)


def test_query_tile_in_the_device_place_is_named():
    # tile_permutation takes the query tile third; tile_layout takes the device there
    with pytest.raises(TypeError, match=r"device must be a device, got \(4, 4\); pass the query "
                                        r"tile by keyword, query_tile=\(4, 4\)"):
        tile_layout(GRID, TILE, (4, 4))


def test_config_takes_a_query_tile():
    import numpy as np

    cfg = DraftAttentionConfig(tile=(4, 8), query_tile=(8, 8))
    assert cfg.query_tile == (8, 8)
    numpy = DraftAttentionConfig(tile=(np.int64(4), 8), query_tile=(np.int32(8), np.int64(8)))
    assert numpy.query_tile == (8, 8) and type(numpy.query_tile[0]) is int
    assert DraftAttentionConfig(tile=(4, 8), query_tile=[4, 8]).query_tile is None  # = tile
    with pytest.raises(ValueError, match=r"query_tile must be whole key tiles, a multiple of "
                                         r"tile \(4, 8\) in each dimension, got \(6, 8\)"):
        DraftAttentionConfig(tile=(4, 8), query_tile=(6, 8))


def test_draft_map_pools_queries_by_query_tile_and_keys_by_tile():
    q, k, _ = _qkv(seed=1)
    layout = _layout()
    maps = []
    draft_attention(q, k, k, layout, sparsity=0.5, on_draft_map=maps.append)
    probs = maps[0]
    assert probs.shape == (2, 2, 12, 48)

    def means(x, tokens):  # mean of each run's real tokens, by hand
        out = []
        for run in layout.perm.view(-1, tokens):
            real = run[run < N]
            out.append(x[:, :, real].mean(2) if len(real) else torch.full_like(x[:, :, 0], 0.0))
        return torch.stack(out, 2)

    logits = means(q, 16) @ means(k, 4).transpose(-1, -2) * 8**-0.5
    logits[..., layout.counts == 0] = float("-inf")  # tiles of padding only are never drafted
    torch.testing.assert_close(probs, torch.softmax(logits, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["global", "row"])
@pytest.mark.parametrize("sparsity", [0.2, 0.5, 0.8])
def test_mask_keeps_own_tiles_and_the_budget(mode, sparsity):
    # tiles of padding only (18 of 48) are no blocks: never kept, and the budget is a share of
    # the 12 x 30 blocks with a real key (at 0.2 a budget over all 48 columns would keep them)
    q, k, v = _qkv(seed=2)
    kept = draft_block_mask(q, k, GRID, TILE, sparsity, mode, query_tile=QTILE)
    layout = _layout()
    assert kept.shape == (2, 2, 12, 48)
    assert kept[..., layout.own_blocks()].all()
    assert not kept[..., layout.counts == 0].any()
    budget = round((1 - sparsity) * 12 * 30)
    assert (kept.sum((-1, -2)) == budget).all()
    _, density = draft_attention(q, k, v, layout, DraftAttentionConfig(
        tile=TILE, query_tile=QTILE, mode=mode), sparsity=sparsity)
    assert float(density) == pytest.approx(budget / (12 * 30))


@pytest.mark.parametrize("text_len,text_first", [(0, False), (7, False), (7, True)])
@pytest.mark.parametrize("sparsity", [0.0, 0.7])
def test_output_is_attention_over_the_asymmetric_mask(text_len, text_first, sparsity):
    q, k, v = _qkv(length=N + text_len, seed=3)
    layout = _layout()
    out, density = draft_attention(q, k, v, layout, sparsity=sparsity, text_len=text_len,
                                   text_first=text_first)
    s = slice(text_len, None) if text_first else slice(0, N)
    kept = draft_block_mask(q[:, :, s], k[:, :, s], GRID, TILE, sparsity, query_tile=QTILE)
    mask = _token_mask(kept, layout, text_len, text_first)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if sparsity == 0:
        dense = F.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    # text rows and columns are dense over the 30 tiles with a real token, not the 18 others
    mq, mk = 12 + math.ceil(text_len / 16), 48 + math.ceil(text_len / 4)
    text_blocks = mq * mk - 12 * 48 - (mq - 12) * 18
    assert float(density) == pytest.approx(float(
        (kept.sum() + 2 * 2 * text_blocks) / (2 * 2 * mq * (mk - 18))))


def test_tiled_input_and_its_padding_slots():
    q, k, v = _qkv(seed=5)
    layout = _layout()
    out, _ = draft_attention(q, k, v, layout, sparsity=0.6)
    tiled = [layout.to_tiles(x).masked_fill(~layout.valid[:, None], 50.0) for x in (q, k, v)]
    again, _ = draft_attention(*tiled, layout, sparsity=0.6, tiled=True)
    torch.testing.assert_close(layout.from_tiles(again), out, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fallback", [False, True])
def test_text_padding_is_skipped_by_query_and_key_blocks(fallback, monkeypatch):
    # 37 text tokens: 3 query blocks of 16 and 10 key blocks of 4. Sample 0 has 5 valid text
    # tokens (query blocks 1-2 and key blocks 2-9 hold padding only), sample 1 has 20.
    from mmspec.video_dit import sparse_attention

    text_len, layout = 37, _layout()
    q, k, v = _qkv(length=N + text_len, seed=6)
    if fallback:  # real logits near -120: zeroed padded keys would dominate the softmax
        u = torch.zeros(8)
        u[0] = 120**0.5 * 8**0.25
        q, k = q * 0.3 + u, k * 0.3 - u
    valid = torch.ones(2, N + text_len, dtype=torch.bool)
    valid[0, N + 5 :] = False
    valid[1, N + 20 :] = False
    calls = []
    real = sparse_attention._attend_with_mean_keys
    monkeypatch.setattr(sparse_attention, "_attend_with_mean_keys",
                        lambda *a: calls.append(1) or real(*a))
    out, density = draft_attention(q, k, v, layout, sparsity=0.6, text_len=text_len,
                                   key_valid=valid)
    assert len(calls) == fallback
    kept = draft_block_mask(q[:, :, :N], k[:, :, :N], GRID, TILE, 0.6, query_tile=QTILE)
    mask = _token_mask(kept, layout, text_len, False) & valid[:, None, None, :]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rows = torch.ones(2, N + text_len, dtype=torch.bool)  # query rows computed
    rows[0, N + 16 :] = False  # query blocks of padding only
    rows[1, N + 32 :] = False
    torch.testing.assert_close(out * rows[:, None, :, None], ref * rows[:, None, :, None],
                               atol=1e-5, rtol=1e-4)
    assert (out[~rows[:, None, :, None].expand_as(out)] == 0).all()
    live_q = torch.tensor([1, 2])  # text query blocks with a valid token
    live_k = torch.tensor([2, 5])  # text key blocks with a valid token
    video = kept.sum((1, 2, 3)).float()
    computed = video + 2 * (live_q * 30 + live_k * 12 + live_q * live_k)  # 30 real tiles
    assert float(density) == pytest.approx(float(computed.sum() / (2 * 2 * 15 * (58 - 18))))


def test_frame_causal_mask_over_query_tiles():
    grid = (4, 6, 10)
    layout = tile_layout(grid, TILE, query_tile=QTILE)
    allowed, count = frame_causal_tiles(layout, 2)
    per_q, per_k = layout.num_query_tiles // 4, layout.num_tiles // 4
    assert allowed.shape == (4 * per_q, 4 * per_k)
    live = layout.num_live_tiles // 4  # 15 of the 24 tiles a frame hold a real token
    assert live == 15 and not allowed[:, layout.counts == 0].any()
    assert count == int(allowed.sum()) == per_q * live * (2 * 2 + 2 * 4)
    q, k, v = _qkv(length=math.prod(grid), seed=8)
    kept_maps = []
    out, _ = draft_attention(q, k, v, layout, sparsity=0.5, allowed=(allowed, count),
                             on_draft_map=kept_maps.append)
    assert (kept_maps[0][..., ~allowed] == 0).all()
    dense, _ = draft_attention(q, k, v, layout, sparsity=0.0, allowed=allowed)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_token_mask(
        allowed.expand(2, 2, -1, -1), layout, 0, False))
    torch.testing.assert_close(dense, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["wan", "wan_vace", "skyreels_df", "hunyuan", "hunyuan_i2v",
                                  "hunyuan15", "cogvideox"])
@torch.no_grad()
def test_models_run_query_tiles_once_or_per_layer(name):
    # every family with query tiles: sparsity 0 is dense, and a sparse run is the same whether
    # the tokens (and RoPE tables) are reordered once per forward or in each layer. 6 x 10
    # tokens per frame: 2 x 2 query tiles over 1 x 2 tiles are whole, 4 x 4 over 2 x 2 pad.
    from .test_processors import FIRST_ATTENTION, MODELS

    build, inputs = MODELS[name]
    model = build()
    args, kwargs = inputs()
    dense = model(*args, **kwargs).sample
    for tile, query_tile, reordered_once in (((1, 2), (2, 2), True), ((2, 2), (4, 4), False)):
        outs, seen = [], []
        for sparsity, once in ((0.0, True), (0.6, True), (0.6, False)):
            state = apply_draft_attention(model, DraftAttentionConfig(
                sparsity=sparsity, tile=tile, query_tile=query_tile, dense_steps=0,
                dense_layers=0, permute_once=once))
            hook = FIRST_ATTENTION[name](model).register_forward_pre_hook(
                lambda *_, state=state: seen.append(state.tiled))
            outs.append(model(*args, **kwargs).sample)
            hook.remove()
            assert state.layout.query_tile == query_tile and state.records
            assert all(r.density < 1.0 for r in state.records) or sparsity == 0.0
            remove_draft_attention(model)
        assert seen[1:] == [reordered_once and name != "skyreels_df", False]
        torch.testing.assert_close(outs[0], dense, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(outs[1]).all() and not torch.allclose(outs[1], dense, atol=1e-4)
        torch.testing.assert_close(outs[1], outs[2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_the_triton_kernel_runs_query_tiles(padded):
    # the GPU path (interpreted here): 32-token query blocks over 16-token key blocks, with text
    # padding, and frames padded to whole query tiles (the exact padded-key path)
    grid = (2, 6, 14) if padded else (2, 8, 16)
    layout = tile_layout(grid, (4, 4), query_tile=(4, 8))
    n = math.prod(grid)
    q, k, v = _qkv(length=n + 9, d=16, seed=9)
    valid = torch.ones(2, n + 9, dtype=torch.bool)
    valid[0, n + 4 :] = False
    kw = dict(sparsity=0.5, text_len=9, key_valid=valid)
    config = {name: DraftAttentionConfig(tile=(4, 4), query_tile=(4, 8), backend=name)
              for name in ("triton", "reference")}
    out, density = draft_attention(q, k, v, layout, config["triton"], **kw)
    ref, ref_density = draft_attention(q, k, v, layout, config["reference"], **kw)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert float(density) == float(ref_density) < 1.0
