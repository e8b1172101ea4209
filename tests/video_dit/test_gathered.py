"""DraftAttention without a reorder pass: frames of whole tiles in the model's order are drafted and
attended through the tile permutation (`block_sparse_attention(token_order=)`, the Triton kernel's
index in its loads; the fused draft's pooling likewise), with the blocks and the output of the
reorder path: q, k, v copied into tile order, attended, the output copied back. Under the Triton
interpreter on a CPU, compiled on a GPU (`benchmarks/gpu_session.sh` step draft_tests)."""

from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmspec.video_dit import DraftAttentionConfig, draft_attention, sparse_attention, tile_layout

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = {  # 16-token blocks, the Triton kernel's least
    "square": dict(grid=(2, 8, 8), tile=(4, 4)),
    "query tiles": dict(grid=(2, 8, 16), tile=(4, 4), query_tile=(8, 8)),  # 2x2 tiles each
    # frames that are not whole tiles: 6x10 tokens in 2x3 tiles of 4x4, 72 padding slots
    "padded": dict(grid=(2, 6, 10), tile=(4, 4)),
    # and query tiles of 1x2 tiles past the frame's edge: tiles of padding only
    "padded query tiles": dict(grid=(2, 6, 10), tile=(4, 4), query_tile=(4, 8)),
}


def _inputs(layout, text_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, layout.num_tokens + text_len, 16, generator=g).to(DEVICE)
            for _ in range(3)]


def _tiled(x, layout, text_len, text_first):
    """`[B, H, L, D]` (or `[B, 1, L, 1]`) with the video tokens in tile order, text in place."""
    video = x[:, :, text_len:] if text_first else x[:, :, : layout.num_tokens]
    text = x[:, :, :text_len] if text_first else x[:, :, layout.num_tokens:]
    parts = [text, layout.to_tiles(video)]
    return torch.cat(parts if text_first else parts[::-1], dim=2)


def _reordered(q, k, v, layout, config, text_len, text_first, key_valid=None, **kw):
    """Today's path: the video tokens copied into tile order (`tiled=True`), the output back, and
    in the layer the text moved behind the video and masked keys zeroed (copies)."""
    def video(x):
        return x[:, :, text_len:] if text_first else x[:, :, : layout.num_tokens]

    def text(x):
        return x[:, :, :text_len] if text_first else x[:, :, layout.num_tokens:]

    def tiled(x):
        parts = [text(x), layout.to_tiles(video(x))]
        return torch.cat(parts if text_first else parts[::-1], dim=2)

    if key_valid is not None:  # [B, L] -> [B, 1, L, 1] and back, in tile order
        key_valid = tiled(key_valid[:, None, :, None])[:, 0, :, 0]
    with mock.patch.object(sparse_attention, "reads_through_order", lambda *a: False):
        out, density = draft_attention(*(tiled(x) for x in (q, k, v)), layout, config,
                                       tiled=True, text_len=text_len, text_first=text_first,
                                       key_valid=key_valid, **kw)
    parts = [text(out) if text_first else out[:, :, layout.padded_tokens:],
             layout.from_tiles(out[:, :, text_len:] if text_first
                               else out[:, :, : layout.padded_tokens])]
    return torch.cat(parts if text_first else parts[::-1], dim=2), density


@pytest.mark.parametrize("case,draft_kernel,text_len,text_first", [  # each choice twice
    ("square", "triton", 0, False), ("square", "torch", 16, False),
    ("query tiles", "triton", 16, True), ("query tiles", "torch", 0, False)])
def test_the_blocks_and_the_output_are_the_reorder_paths(case, draft_kernel, text_len,
                                                          text_first, monkeypatch):
    layout = tile_layout(**CASES[case], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, query_tile=layout.query_tile, sparsity=0.6,
                                  backend="triton", draft_kernel=draft_kernel)
    q, k, v = _inputs(layout, text_len)
    kept, untiled = [], []
    draft = sparse_attention._draft

    def recorded(*args):
        untiled.append(args[-1])
        kept.append(draft(*args)[0])
        return draft(*args)

    monkeypatch.setattr(sparse_attention, "_draft", recorded)
    out, density = draft_attention(q, k, v, layout, config, text_len=text_len,
                                   text_first=text_first)
    ref, ref_density = _reordered(q, k, v, layout, config, text_len, text_first)
    assert untiled == [True, False]  # the model's order, then tile order
    assert torch.equal(kept[0], kept[1]) and 0 < int(kept[0].sum()) < kept[0].numel()
    assert float(density) == float(ref_density)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


class _Copies(TorchDispatchMode):
    """Ops that read or write a whole `[B, H, L, D]` tensor through an index: token copies."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.hits = shape, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        flat = [x for a in args for x in (a if isinstance(a, (list, tuple)) else [a])]  # cat's
        big = [a for a in flat if isinstance(a, torch.Tensor) and a.shape[:2] == self.shape[:2]
               and a.shape[-1] == self.shape[-1] and a.shape[2] >= 64]
        if big and any(op in name for op in ("index", "gather", "scatter", "cat", "masked_fill")):
            self.hits.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case,padded_text", [("square", False), ("padded", True)])
def test_no_token_is_copied_into_tile_order_or_back(case, padded_text):
    layout = tile_layout(**CASES[case], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, sparsity=0.6, backend="triton",
                                  draft_kernel="triton")
    q, k, v = _inputs(layout, 16)
    key_valid = _text_padding(layout, 16, False) if padded_text else None
    with _Copies(q.shape) as copies:
        draft_attention(q, k, v, layout, config, text_len=16, key_valid=key_valid)
    assert copies.hits == []
    with _Copies(q.shape) as copies:  # the reorder path copies each of q, k, v and the output
        _reordered(q, k, v, layout, config, 16, False, key_valid)
    assert len(copies.hits) >= 4


def _text_padding(layout, text_len, text_first, valid_text=(10, 3)):
    """bool `[2, L]`: every video key valid, then each sample's first `valid_text` text tokens
    (HunyuanVideo pads its prompt at the end); with 32 text tokens sample 1's second text block
    holds padding only, which the kernel skips."""
    text = torch.arange(text_len)[None] < torch.tensor(valid_text)[:, None]  # [2, text_len]
    video = torch.ones(2, layout.num_tokens, dtype=torch.bool)
    return torch.cat([text, video] if text_first else [video, text], dim=1).to(DEVICE)


@pytest.mark.parametrize("case,draft_kernel,text_len,text_first,padded_text", [
    ("padded", "triton", 0, False, False),  # frames of no whole tiles, nothing else
    ("padded", "torch", 16, True, False),  # CogVideoX: text first
    ("padded query tiles", "triton", 20, False, True),  # HunyuanVideo: text last, padded
    ("square", "torch", 32, False, True),  # whole tiles, a text block of padding only
    ("query tiles", "triton", 32, True, True)])
def test_padding_slots_and_masked_keys_are_left_out_in_the_kernels_loads(
        case, draft_kernel, text_len, text_first, padded_text, monkeypatch):
    """Frames padded to whole tiles and masked text keys: drafted in the model's order, attended
    through the permutation with the padding slots and the masked keys left out in the kernel's
    loads, never copied into tile order; the blocks and the output of the reorder path."""
    layout = tile_layout(**CASES[case], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, query_tile=layout.query_tile, sparsity=0.6,
                                  backend="triton", draft_kernel=draft_kernel)
    q, k, v = _inputs(layout, text_len)
    key_valid = _text_padding(layout, text_len, text_first) if padded_text else None
    kept, untiled, copied = [], [], []
    draft, tiled_call = sparse_attention._draft, sparse_attention._attend_tiled

    def recorded(*args):
        untiled.append(args[-1])
        kept.append(draft(*args)[0])
        return draft(*args)

    monkeypatch.setattr(sparse_attention, "_draft", recorded)
    monkeypatch.setattr(sparse_attention, "_attend_tiled",
                        lambda *a: copied.append(a[-1]) or tiled_call(*a))
    out, density = draft_attention(q, k, v, layout, config, text_len=text_len,
                                   text_first=text_first, key_valid=key_valid)
    ref, ref_density = _reordered(q, k, v, layout, config, text_len, text_first, key_valid)
    assert untiled == [True, False] and copied == [True]  # only the reference copies
    assert torch.equal(kept[0], kept[1]) and 0 < int(kept[0].sum()) < kept[0].numel()
    assert float(density) == float(ref_density)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", ["padded", "square"])
def test_the_torch_backend_copies_into_tile_order_where_keys_are_left_out(case, monkeypatch):
    """The torch backend has no index in its loads: frames padded to whole tiles, or masked
    keys, take the reorder path there (a token mask of the whole call otherwise), with the
    same output; frames of whole tiles with every key valid go through `token_order=`."""
    layout = tile_layout(**CASES[case], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, sparsity=0.6, backend="torch",
                                  draft_kernel="torch")
    q, k, v = _inputs(layout, 16)
    copied, tiled_call = [], sparse_attention._attend_tiled
    monkeypatch.setattr(sparse_attention, "_attend_tiled",
                        lambda *a: copied.append(a[-1]) or tiled_call(*a))
    out, _ = draft_attention(q, k, v, layout, config, text_len=16)
    assert copied == ([False] if layout.has_padding else [])  # untiled there, copied in it
    ref, _ = _reordered(q, k, v, layout, config, 16, False)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    key_valid = _text_padding(layout, 16, False)
    copied.clear()
    out, _ = draft_attention(q, k, v, layout, config, text_len=16, key_valid=key_valid)
    assert copied == [False]
    ref, _ = _reordered(q, k, v, layout, config, 16, False, key_valid)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("text_len,text_first", [(32, False), (16, True)])
def test_tokens_reordered_once_per_forward_are_not_copied_in_the_layer(text_len, text_first):
    """`tiled=True` (whole tiles, the video tokens put in tile order once per forward):
    HunyuanVideo's text behind the video with text padding, CogVideoX's in front. The kernel
    reads the text in place and leaves the masked keys out in its loads: no copy of q, k, v or
    the output (the copying path moves the text behind the video and zeroes masked keys)."""
    layout = tile_layout(**CASES["square"], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, sparsity=0.6, backend="triton",
                                  draft_kernel="triton")
    q, k, v = (_tiled(x, layout, text_len, text_first) for x in _inputs(layout, text_len))
    key_valid = _tiled(_text_padding(layout, text_len, text_first)[:, None, :, None], layout,
                       text_len, text_first)[:, 0, :, 0] if not text_first else None
    with _Copies(q.shape) as copies:
        out, density = draft_attention(q, k, v, layout, config, tiled=True, text_len=text_len,
                                       text_first=text_first, key_valid=key_valid)
    assert copies.hits == []
    with _Copies(q.shape) as copies, mock.patch.object(sparse_attention, "reads_through_order",
                                                       lambda *a: False):
        ref, ref_density = draft_attention(q, k, v, layout, config, tiled=True,
                                           text_len=text_len, text_first=text_first,
                                           key_valid=key_valid)
    assert len(copies.hits) >= 3  # the copying path: text behind the video, or masked keys
    assert float(density) == float(ref_density)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case,text_len,text_first,padded_text", [
    ("padded", 0, False, False), ("padded query tiles", 20, False, True),
    ("square", 16, True, False)])
def test_gathered_loads_false_copies_into_tile_order_in_the_layer(case, text_len, text_first,
                                                                   padded_text, monkeypatch):
    """`DraftAttentionConfig(gathered_loads=False)`: the Triton kernel no longer reads through
    the permutation; each layer copies q, k, v into tile order and the output back (the path a
    GPU may find faster, BENCHMARKS.md `draft_attention_gpu`), with the same blocks and output."""
    layout = tile_layout(**CASES[case], device=DEVICE)
    q, k, v = _inputs(layout, text_len)
    key_valid = _text_padding(layout, text_len, text_first) if padded_text else None
    outs, copied, orders = [], [], []
    tiled_call, attention = sparse_attention._attend_tiled, sparse_attention.block_sparse_attention
    monkeypatch.setattr(sparse_attention, "_attend_tiled",
                        lambda *a: copied.append(a[-1]) or tiled_call(*a))
    monkeypatch.setattr(sparse_attention, "block_sparse_attention",
                        lambda *a, **kw: orders.append(kw.get("token_order")) or attention(*a, **kw))
    for gathered in (True, False):
        config = DraftAttentionConfig(tile=layout.tile, query_tile=layout.query_tile,
                                      sparsity=0.6, backend="triton", draft_kernel="triton",
                                      gathered_loads=gathered)
        outs.append(draft_attention(q, k, v, layout, config, text_len=text_len,
                                    text_first=text_first, key_valid=key_valid))
    assert copied == [False]  # the second call only, from the model's order
    assert orders[0] is not None and orders[1] is None  # the kernel's own order in the copy
    assert float(outs[0][1]) == float(outs[1][1])
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-6, rtol=1e-6)


def test_gathered_loads_must_be_a_bool():
    with pytest.raises(ValueError, match="gathered_loads must be a bool, got 'no'"):
        DraftAttentionConfig(gathered_loads="no")
