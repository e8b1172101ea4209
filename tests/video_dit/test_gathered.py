"""DraftAttention without a reorder pass: frames of whole tiles in the model's order are drafted and
attended through the tile permutation (`block_sparse_attention(token_order=)`, the Triton kernel's
index in its loads; the fused draft's pooling likewise), with the blocks and the output of the
reorder path: q, k, v copied into tile order, attended, the output copied back. Under the Triton
interpreter on a CPU, compiled on a GPU (`benchmarks/gpu_session.sh` step draft_tests)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmspec.video_dit import DraftAttentionConfig, draft_attention, sparse_attention, tile_layout

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = {  # 16-token blocks, the Triton kernel's least
    "square": dict(grid=(2, 8, 8), tile=(4, 4)),
    "query tiles": dict(grid=(2, 8, 16), tile=(4, 4), query_tile=(8, 8)),  # 2x2 tiles each
}


def _inputs(layout, text_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, layout.num_tokens + text_len, 16, generator=g).to(DEVICE)
            for _ in range(3)]


def _reordered(q, k, v, layout, config, text_len, text_first, **kw):
    """Today's path: the video tokens copied into tile order (`tiled=True`), the output back."""
    def video(x):
        return x[:, :, text_len:] if text_first else x[:, :, : layout.num_tokens]

    def text(x):
        return x[:, :, :text_len] if text_first else x[:, :, layout.num_tokens:]

    def tiled(x):
        parts = [text(x), layout.to_tiles(video(x))]
        return torch.cat(parts if text_first else parts[::-1], dim=2)

    out, density = draft_attention(*(tiled(x) for x in (q, k, v)), layout, config, tiled=True,
                                   text_len=text_len, text_first=text_first, **kw)
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
        big = [a for a in args if isinstance(a, torch.Tensor) and a.shape[:2] == self.shape[:2]
               and a.shape[-1] == self.shape[-1] and a.shape[2] >= 64]
        if big and ("index" in name or "gather" in name or "scatter" in name or "cat" in name):
            self.hits.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("text_len", [16])
def test_no_token_is_copied_into_tile_order_or_back(text_len):
    layout = tile_layout(**CASES["square"], device=DEVICE)
    config = DraftAttentionConfig(tile=layout.tile, sparsity=0.6, backend="triton",
                                  draft_kernel="triton")
    q, k, v = _inputs(layout, text_len)
    with _Copies(q.shape) as copies:
        draft_attention(q, k, v, layout, config, text_len=text_len)
    assert copies.hits == []
    with _Copies(q.shape) as copies:  # the reorder path copies each of q, k, v and the output
        _reordered(q, k, v, layout, config, text_len, False)
    assert len(copies.hits) >= 4
