import pytest
import torch

from mmspec.video_dit import tile_layout, tile_permutation


@pytest.mark.parametrize("grid,tile", [((2, 8, 16), (4, 8)), ((3, 6, 10), (4, 4)), ((1, 5, 7), (2, 3))])
def test_permutation_is_a_bijection_of_tiles(grid, tile):
    t, h, w = grid
    th, tw = tile
    n = t * h * w
    perm = tile_permutation(grid, tile)
    nh, nw = -(-h // th), -(-w // tw)
    assert perm.numel() == t * nh * th * nw * tw
    real = perm[perm < n]
    assert torch.equal(real.sort().values, torch.arange(n))  # every token exactly once
    assert int((perm == n).sum()) == perm.numel() - n  # the rest is the padding sentinel
    # each chunk of th*tw slots is one frame's th x tw patch, row-major, padded outside the frame
    for chunk_id, chunk in enumerate(perm.view(-1, th * tw).tolist()):
        frame, cell = divmod(chunk_id, nh * nw)
        y0, x0 = (cell // nw) * th, (cell % nw) * tw
        for slot, token in enumerate(chunk):
            y, x = y0 + slot // tw, x0 + slot % tw
            if y < h and x < w:
                assert token == frame * h * w + y * w + x
            else:
                assert token == n


def test_argsort_restores_the_order():
    grid, tile = (2, 6, 10), (4, 4)
    n = 120
    x = torch.randn(n, 3)
    perm = tile_permutation(grid, tile)
    tiled = torch.cat([x, torch.zeros(1, 3)])[perm]
    assert torch.equal(tiled[torch.argsort(perm)[:n]], x)
    layout = tile_layout(grid, tile)
    assert torch.equal(layout.to_tiles(x, dim=0), tiled)
    assert torch.equal(layout.from_tiles(layout.to_tiles(x, dim=0), dim=0), x)
    assert layout.counts.tolist() == [16, 16, 8, 8, 8, 4] * 2  # real tokens per tile


def test_layout_is_cached():
    assert tile_layout((2, 8, 16), (4, 8)) is tile_layout((2, 8, 16), [4, 8])


@pytest.mark.parametrize("grid,tile,match", [
    ((2, 4, 8), (8, 16), "larger than the frame"),
    ((2, 8, 8), (4, 16), "larger than the frame"),
    ((2, 8), (4, 4), "grid must be three"),
    ((2, 8, 8), (0, 4), "tile must be two positive"),
])
def test_bad_grid_or_tile(grid, tile, match):
    with pytest.raises(ValueError, match=match):
        tile_permutation(grid, tile)


def test_a_layout_first_built_under_inference_mode_serves_grad_enabled_calls():
    from mmspec.video_dit import tile_layout

    with torch.inference_mode():
        layout = tile_layout((2, 6, 10), (3, 5))
    x = torch.randn(1, 120, 4, requires_grad=True)
    layout.to_tiles(x, dim=1).sum().backward()  # saved the inference-mode index: RuntimeError
    assert x.grad is not None


def test_a_query_tile_layout_first_built_under_inference_mode_serves_grad_enabled_calls():
    # its own-block map is built with the layout, outside inference mode, like its indices: a
    # map made in an inference-mode call and kept would fail every later call with grad
    from mmspec.video_dit import draft_attention, tile_layout

    grid, q = (2, 6, 10), torch.randn(1, 2, 120, 8)
    with torch.inference_mode():
        layout = tile_layout(grid, (2, 2), query_tile=(4, 4))
        draft_attention(q, q, q, layout, sparsity=0.5)
    assert not layout.own_blocks().is_inference()
    q.requires_grad_(True)
    probs = []
    draft_attention(q, q.detach(), q.detach(), layout, sparsity=0.5, on_draft_map=probs.append)
    assert probs[0].requires_grad
