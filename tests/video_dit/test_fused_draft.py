"""The fused Triton draft (`mmspec/video_dit/fused_draft.py`) against the torch draft path, under
TRITON_INTERPRET=1 on the CPU (slow: tiny maps, a handful of calls) or compiled on a GPU
(`benchmarks/gpu_session.sh`'s draft_tests step), and the draft side's host syncs (none, either
way)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmspec.kernels import BlockSparseMask
from mmspec.video_dit import DraftAttentionConfig, draft_attention, tile_layout
from mmspec.video_dit.draft_map import (draft_probs, live_count, live_tiles, pool_query_tiles,
                                        pool_tiles, select_blocks)
from mmspec.video_dit.fused_draft import draft_blocks
from mmspec.video_dit.tiles import frame_causal_tiles

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# square: 8 tiles of 8 tokens; asymmetric: 2x4 tiles under 4x8 query tiles, frames of 6 rows
# padded to 8, so a quarter of the tiles hold padding only (dead)
SQUARE = dict(grid=(2, 4, 8), tile=(2, 4), device=DEVICE)
ASYM = dict(grid=(2, 6, 8), tile=(2, 4), query_tile=(4, 8), device=DEVICE)


def _config(layout, draft_kernel):
    return DraftAttentionConfig(tile=layout.tile, query_tile=layout.query_tile,
                                draft_kernel=draft_kernel)


_SYNCS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default",
          "aten.masked_select.default"}


class _SyncCounter(TorchDispatchMode):
    """Device-to-host reads: each is a point where a GPU run waits (tests/decoding/test_syncs)."""

    def __init__(self):
        super().__init__()
        self.hits = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in _SYNCS:
            self.hits.append(str(func))
        return func(*args, **(kwargs or {}))


def _tiled_qk(layout, b, h, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [layout.to_tiles(torch.randn(b, h, layout.num_tokens, d, generator=g).to(DEVICE))
            for _ in range(2)]


def _allowed(layout, causal):
    """(allowed, count) as draft_attention passes them: the frame-causal mask and/or the live
    tiles, or (None, None)."""
    if causal:
        return frame_causal_tiles(layout, 1)
    live = live_tiles(layout)
    return (None, None) if live is None else (live.expand(layout.num_query_tiles, -1),
                                              live_count(layout))


def _torch_draft(qt, kt, layout, mode, allowed, count, **kw):
    probs = draft_probs(pool_query_tiles(qt, layout), pool_tiles(kt, layout),
                        qt.shape[-1] ** -0.5, allowed)
    own = layout.own_blocks() if layout.asymmetric else None
    return select_blocks(probs, 0.7, mode, allowed, count, own=own, **kw), probs


@pytest.mark.parametrize("shape,mode,b,causal", [
    (SQUARE, "global", 2, False),
    (SQUARE, "row", 1, False),
    (ASYM, "row", 1, True),  # frame-causal model mask and dead tiles
    (ASYM, "top_p", 1, False),
])
def test_fused_draft_selects_the_torch_paths_blocks_and_index(shape, mode, b, causal):
    layout = tile_layout(**shape)
    qt, kt = _tiled_qk(layout, b, 1)
    allowed, count = _allowed(layout, causal)
    kw = {"mass": 0.9, "max_density": 0.15} if mode == "top_p" else {}
    kept, probs = _torch_draft(qt, kt, layout, mode, allowed, count, **kw)
    with _SyncCounter() as syncs:
        got = draft_blocks(qt, kt, layout, 0.7, mode, allowed=allowed, allowed_count=count,
                           return_probs=True, **kw)
    assert syncs.hits == []  # no read of the device: a GPU run never waits here
    assert 0 < int(kept.sum()) < kept.numel()  # a real selection, not all or nothing
    assert torch.equal(got.kept, kept)
    ref = BlockSparseMask.from_dense(kept, 1, kept.shape[2], kept.shape[3])
    assert torch.equal(got.counts, ref.full_kv_num_blocks)
    assert torch.equal(got.indices, ref.full_kv_indices)  # the kept blocks first, ascending
    torch.testing.assert_close(got.probs, probs, atol=1e-6, rtol=1e-5)


def test_draft_attention_builds_its_mask_from_the_fused_index():
    layout = tile_layout(**SQUARE)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, layout.num_tokens, 8, generator=g).to(DEVICE) for _ in range(3))
    maps = []
    with _SyncCounter() as syncs:  # whole tiles: no padding correction, no sync at all
        out, density = draft_attention(q, k, v, layout, _config(layout, "triton"), sparsity=0.7,
                                       on_draft_map=maps.append)
    assert syncs.hits == []
    ref, ref_density = draft_attention(q, k, v, layout, _config(layout, "torch"), sparsity=0.7,
                                       on_draft_map=maps.append)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert float(density) == float(ref_density) < 1.0
    torch.testing.assert_close(maps[0], maps[1], atol=1e-6, rtol=1e-5)


def test_a_bad_draft_kernel_is_named():
    layout = tile_layout(**SQUARE)
    q = torch.zeros(1, 1, layout.num_tokens, 8, device=DEVICE)
    with pytest.raises(ValueError, match="draft_kernel must be one of .* got 'cuda'"):
        _config(layout, "cuda")
    with pytest.raises(ValueError, match="draft_kernel must be one of .* got 'fused'"):
        DraftAttentionConfig(draft_kernel="fused")
    big = tile_layout((2, 64, 128), (2, 4), device=DEVICE)  # 2,048 tiles: the torch path's
    q_big = torch.zeros(1, 1, big.num_tokens, 8, device=DEVICE)
    with pytest.raises(ValueError, match="draft_kernel='triton' cannot run here: draft maps of "
                                         "at most 1024 tiles a row .* got 2048 x 2048"):
        draft_attention(q_big, q_big, q_big, big, _config(big, "triton"), sparsity=0.5)
    with pytest.raises(ValueError, match="allowed needs allowed_count"):
        draft_blocks(q, q, layout, 0.5, allowed=torch.ones(8, 8, dtype=torch.bool, device=DEVICE))


@pytest.mark.parametrize("mode", ["global", "row", "top_p"])
def test_the_torch_draft_reads_nothing_back_from_the_device(mode):
    # dead tiles (an allowed mask) and query tiles: every branch of the selection (the fused
    # draft's count is checked where it is compared with this path, above)
    layout = tile_layout(**ASYM)
    qt, kt = _tiled_qk(layout, 1, 1)
    allowed, count = _allowed(layout, False)
    kw = {"mass": 0.9, "max_density": 0.15} if mode == "top_p" else {}
    with _SyncCounter() as syncs:
        _torch_draft(qt, kt, layout, mode, allowed, count, **kw)
    assert syncs.hits == []
