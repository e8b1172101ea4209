import math

import pytest
import torch
import torch.nn.functional as F

from mmspec.video_dit import DraftAttentionConfig, draft_attention, draft_block_mask, tile_layout

GRID, TILE = (2, 6, 10), (4, 4)  # frames padded to whole tiles
N = 120


def _qkv(b=2, h=2, length=N, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, length, d, generator=g) for _ in range(3)]


@pytest.mark.parametrize("text_len,text_first", [(0, False), (5, False), (5, True)])
def test_sparsity_zero_equals_dense(text_len, text_first):
    q, k, v = _qkv(length=N + text_len)
    valid = torch.ones(2, N + text_len, dtype=torch.bool)
    if text_len:  # sample 1 pads its last two text tokens
        valid[1, -2:] = False if not text_first else valid[1, -2:]
        if text_first:
            valid[1, 3:5] = False
    out, density = draft_attention(q, k, v, tile_layout(GRID, TILE), sparsity=0.0,
                                   text_len=text_len, text_first=text_first,
                                   key_valid=valid if text_len else None)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert float(density) == 1.0


def _token_mask(kept, layout, text_len, text_first):
    """Token-level bool [B, H, L, L] in model order: query tile of the row, tile of the key."""
    n = layout.num_tokens
    slot = torch.empty(n, dtype=torch.long)
    slot[layout.perm[layout.valid]] = torch.arange(layout.padded_tokens)[layout.valid]
    q_tile, k_tile = slot // layout.query_tile_tokens, slot // layout.tile_tokens
    video = kept[:, :, q_tile][:, :, :, k_tile]  # [B, H, n, n]
    b, h = kept.shape[:2]
    full = torch.ones(b, h, n + text_len, n + text_len, dtype=torch.bool)
    s = slice(text_len, None) if text_first else slice(0, n)
    full[:, :, s, s] = video
    return full


@pytest.mark.parametrize("mode", ["global", "row"])
@pytest.mark.parametrize("text_len,text_first", [(0, False), (7, False), (7, True)])
def test_sparse_output_is_attention_over_the_draft_mask(mode, text_len, text_first):
    q, k, v = _qkv(length=N + text_len, seed=3)
    layout = tile_layout(GRID, TILE)
    out, density = draft_attention(q, k, v, layout, DraftAttentionConfig(tile=TILE, mode=mode),
                                   sparsity=0.7, text_len=text_len,
                                   text_first=text_first)
    s = slice(text_len, None) if text_first else slice(0, N)
    kept = draft_block_mask(q[:, :, s], k[:, :, s], GRID, TILE, 0.7, mode)
    mask = _token_mask(kept, layout, text_len, text_first)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert 0.3 - 1 / layout.num_tiles <= float(density) < 1.0


def test_cfg_batch_gets_one_mask_per_sample_in_one_call():
    q, k, v = _qkv(b=2, seed=4)
    layout = tile_layout(GRID, TILE)
    both, _ = draft_attention(q, k, v, layout, sparsity=0.8)
    for b in range(2):
        alone, _ = draft_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], layout, sparsity=0.8)
        torch.testing.assert_close(both[b : b + 1], alone, atol=1e-6, rtol=1e-6)


def test_tiled_input_gives_the_same_output():
    q, k, v = _qkv(seed=5)
    layout = tile_layout(GRID, TILE)
    out, _ = draft_attention(q, k, v, layout, sparsity=0.6)
    tiled, _ = draft_attention(*(layout.to_tiles(x) for x in (q, k, v)), layout, sparsity=0.6,
                               tiled=True)
    torch.testing.assert_close(layout.from_tiles(tiled), out, atol=1e-6, rtol=1e-6)


def test_grid_not_matching_the_tokens():
    q, k, v = _qkv(length=N + 3)
    with pytest.raises(ValueError, match=r"grid \(2, 6, 10\) has 120 tokens but the sequence has 123"):
        draft_attention(q, k, v, tile_layout(GRID, TILE), sparsity=0.5)


@pytest.mark.parametrize("kwargs,message", [
    ({"sparsity": 1.5}, r"sparsity must be a number in \[0, 1\), got 1.5"),
    ({"sparsity": -3.0}, r"sparsity must be a number in \[0, 1\)"),
])
def test_bad_sparsity_or_config_is_refused(kwargs, message):
    # it used to clamp the sparsity and run row mode for any mode but "global"
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=message):
        draft_attention(q, k, v, tile_layout(GRID, TILE), **kwargs)
    with pytest.raises(ValueError, match=r"mode must be one of \('global', 'row', 'top_p'\), "
                                         r"got 'glob'"):  # in the config, once
        DraftAttentionConfig(tile=TILE, mode="glob")
    with pytest.raises(ValueError, match=r"config's tile \(8, 16\) and query_tile None must be "
                                         r"the layout's, \(4, 4\) and \(4, 4\)"):
        draft_attention(q, k, v, tile_layout(GRID, TILE), DraftAttentionConfig())
    with pytest.raises(TypeError, match="config must be a DraftAttentionConfig or None, got dict"):
        draft_attention(q, k, v, tile_layout(GRID, TILE), {"sparsity": 0.5})


def test_tiled_padding_slots_do_not_leak_into_the_draft():
    # with one reorder per forward, padding slots hold whatever the model put there
    q, k, v = _qkv(seed=6)
    layout = tile_layout(GRID, TILE)
    tiled = [layout.to_tiles(x) for x in (q, k, v)]
    garbage = [x.masked_fill(~layout.valid[:, None], 50.0) for x in tiled]
    clean, _ = draft_attention(*tiled, layout, sparsity=0.7, tiled=True)
    dirty, _ = draft_attention(*garbage, layout, sparsity=0.7, tiled=True)
    valid = layout.valid
    torch.testing.assert_close(dirty[:, :, valid], clean[:, :, valid], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("logit_shift", [0.0, -40.0, -120.0])
def test_padding_correction_and_its_fallback(logit_shift, monkeypatch):
    # padded keys are zeroed and divided out through the lse; when real logits sit far below the
    # zero logit of a padded key (at -120 exp underflows to 0 next to it in fp32) the exact
    # mean-key path must take over
    from mmspec.video_dit import sparse_attention

    q, k, v = _qkv(seed=7)
    q, k = q * 0.3, k * 0.3
    if logit_shift:  # one shared direction makes every real logit about logit_shift
        u = torch.zeros(8)
        u[0] = 1.0
        q = q + u * (-logit_shift) ** 0.5 * 8**0.25
        k = k - u * (-logit_shift) ** 0.5 * 8**0.25
    layout = tile_layout(GRID, TILE)
    calls = []
    real = sparse_attention._attend_with_mean_keys
    monkeypatch.setattr(sparse_attention, "_attend_with_mean_keys",
                        lambda *a: calls.append(1) or real(*a))
    for sparsity in (0.0, 0.6):
        out, _ = sparse_attention.draft_attention(q, k, v, layout, sparsity=sparsity)
        kept = draft_block_mask(q, k, GRID, TILE, sparsity)
        mask = _token_mask(kept, layout, 0, False)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    assert len(calls) == (2 if logit_shift else 0)


def test_mean_keys_path_is_exact_with_text_padding():
    # a text block with one valid key among padding: its stand-in keys weigh at most as much as
    # that key, and the share call divides them out
    from mmspec.video_dit.sparse_attention import _attend_with_mean_keys

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 40, 8, generator=g) for _ in range(3))
    valid = torch.ones(2, 40, dtype=torch.bool)
    valid[0, 33:] = False  # sample 0: block 4 (keys 32-39) holds one valid key
    valid[1, 24:32] = False  # sample 1: block 3 has none and must be skipped
    blocks = torch.rand(2, 2, 5, 5, generator=g) > 0.4
    blocks |= torch.eye(5, dtype=torch.bool)
    blocks[..., 4] = True
    out = _attend_with_mean_keys(q, k, v, blocks, valid, 8, 8**-0.5, "auto")
    allowed = blocks.repeat_interleave(8, 2).repeat_interleave(8, 3) & valid[:, None, None]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["text after", "text first", "one mask for the batch",
                                     "tiled", "fallback"])
@pytest.mark.parametrize("sparsity", [0.0, 0.6])
def test_text_blocks_of_padding_only_are_skipped(variant, sparsity, monkeypatch):
    # 37 text tokens = 3 blocks of 16; sample 0 has 5 valid (blocks 2 and 3 all padding),
    # sample 1 has 20 (block 3): those blocks' rows and columns are not computed, their query
    # rows come back 0, and every other row is exact attention over the valid keys: with the
    # text first, a key mask shared by the batch, tokens already in tile order, and in the
    # mean-keys fallback (real logits near -120, where zeroed padded keys would dominate)
    from mmspec.video_dit import sparse_attention

    text_len, layout, text_first = 37, tile_layout(GRID, TILE), variant == "text first"
    q, k, v = _qkv(length=N + text_len, seed=5)
    if variant == "fallback":
        u = torch.zeros(8)
        u[0] = 120**0.5 * 8**0.25
        q, k = q * 0.3 + u, k * 0.3 - u
    valid = torch.ones(2, N + text_len, dtype=torch.bool)
    start = 0 if text_first else N
    valid[0, start + 5 : start + text_len] = False
    valid[1, start + 20 : start + text_len] = False
    if variant == "one mask for the batch":
        valid[0] = valid[1]
    fallbacks = []
    real = sparse_attention._attend_with_mean_keys
    monkeypatch.setattr(sparse_attention, "_attend_with_mean_keys",
                        lambda *a: fallbacks.append(1) or real(*a))
    if variant == "tiled":
        def tiles(x):  # video in tile order with padding slots, text after it
            return torch.cat([layout.to_tiles(x[:, :, :N]), x[:, :, N:]], dim=2)

        key_valid = torch.cat([layout.valid.expand(2, -1), valid[:, N:]], dim=1)
        out, density = draft_attention(*(tiles(x) for x in (q, k, v)), layout, tiled=True,
                                       sparsity=sparsity, text_len=text_len, key_valid=key_valid)
        out = torch.cat([layout.from_tiles(out[:, :, : layout.padded_tokens]),
                         out[:, :, layout.padded_tokens :]], dim=2)
    else:
        key_valid = valid[:1] if variant == "one mask for the batch" else valid
        out, density = draft_attention(q, k, v, layout, sparsity=sparsity, text_len=text_len,
                                       text_first=text_first, key_valid=key_valid)
    assert len(fallbacks) == (variant == "fallback")
    s = slice(text_len, None) if text_first else slice(0, N)
    kept = draft_block_mask(q[:, :, s], k[:, :, s], GRID, TILE, sparsity)
    mask = _token_mask(kept, layout, text_len, text_first) & valid[:, None, None, :]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rows = valid.clone()  # the padded text rows of a block with a valid token are computed too
    rows[:, start + 16 : start + 32] |= valid[:, start + 16 : start + 17]
    rows[:, start : start + 16] = True
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out * rows[:, None, :, None], ref * rows[:, None, :, None],
                               atol=1e-5, rtol=1e-4)
    assert (out[~rows[:, None, :, None].expand_as(out)] == 0).all()
    nt, m = layout.num_tiles, layout.num_tiles + 3
    video = kept.sum((1, 2, 3)).float()  # per sample, over heads
    live = rows[:, start : start + text_len : 16].sum(1)  # text blocks with a valid token
    computed = video + 2 * (2 * live * nt + live * live)
    assert float(density) == pytest.approx(float(computed.sum() / (2 * 2 * m * m)))


def test_key_valid_of_another_length_is_named():
    # with tiled=True the keys are the padded tile order (Np + text), not the model order
    q, k, v = _qkv(length=N + 5)
    layout = tile_layout(GRID, TILE)
    with pytest.raises(ValueError, match=r"key_valid must be bool \[B=2, L=125\] in the order of "
                                         r"q, k, v, got torch.bool \[2, 120\]"):
        draft_attention(q, k, v, layout, sparsity=0.5, text_len=5,
                        key_valid=torch.ones(2, N, dtype=torch.bool))
    tiled = [torch.cat([layout.to_tiles(x[:, :, :N]), x[:, :, N:]], 2) for x in (q, k, v)]
    valid = torch.ones(2, layout.padded_tokens + 5, dtype=torch.bool)
    out, _ = draft_attention(*tiled, layout, sparsity=0.0, text_len=5, tiled=True,
                             key_valid=valid)
    ref, _ = draft_attention(q, k, v, layout, sparsity=0.0, text_len=5)
    torch.testing.assert_close(out[:, :, layout.valid.nonzero()[:, 0]],
                               layout.to_tiles(ref[:, :, :N])[:, :, layout.valid], atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("mode", ["global", "row"])
def test_a_frame_causal_mask_bounds_the_selection(mode):
    # SkyReels-V2 diffusion forcing: key frames of a later block are never kept, the budget is
    # a share of the allowed blocks, and the output is attention over kept & allowed blocks
    from mmspec.video_dit.draft_map import draft_probs, pool_tiles, select_blocks
    from mmspec.video_dit.tiles import frame_causal_tiles

    grid = (4, 6, 10)  # 4 frames in blocks of 2; 4x4 tiles pad the frames
    layout = tile_layout(grid, TILE)
    allowed, count = frame_causal_tiles(layout, 2)
    per_frame = layout.num_tiles // 4
    assert count == per_frame**2 * (2 * 2 + 4 * 2)  # block 0 sees 2 frames, block 1 sees 4
    q, k, v = _qkv(length=math.prod(grid), seed=8)
    out, density = draft_attention(q, k, v, layout, DraftAttentionConfig(tile=TILE, mode=mode),
                                   sparsity=0.5, allowed=(allowed, count))
    assert abs(float(density) - 0.5) <= 1 / layout.num_tiles
    qt, kt = (pool_tiles(layout.to_tiles(x), layout) for x in (q, k))
    kept = select_blocks(draft_probs(qt, kt, 8**-0.5, allowed), 0.5, mode, allowed, count)
    assert not (kept & ~allowed).any() and kept.diagonal(dim1=-2, dim2=-1).all()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_token_mask(kept, layout, 0, False))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    dense, full = draft_attention(q, k, v, layout, sparsity=0.0, allowed=allowed)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_token_mask(
        allowed.expand(2, 2, -1, -1), layout, 0, False))
    torch.testing.assert_close(dense, ref, atol=1e-5, rtol=1e-5)
    assert float(full) == 1.0
    with pytest.raises(ValueError, match=r"allowed must be a bool tensor \[24, 24\]"):
        draft_attention(q, k, v, layout, sparsity=0.5, allowed=allowed[:-1])
    with pytest.raises(ValueError, match="allowed must be a bool tensor"):
        draft_attention(q, k, v, layout, sparsity=0.5, allowed=allowed.float())
