import pytest
import torch

from mmspec.video_dit import draft_block_mask, tile_layout
from mmspec.video_dit.draft_map import pool_tiles


def _qk(b=2, h=3, grid=(2, 8, 16), d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] * grid[2]
    return torch.randn(b, h, n, d, generator=g) * 2, torch.randn(b, h, n, d, generator=g) * 2


@pytest.mark.parametrize("mode", ["global", "row"])
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.75, 0.9, 0.97])
def test_density_within_one_block_per_row(mode, sparsity):
    q, k = _qk(grid=(4, 8, 16))
    kept = draft_block_mask(q, k, (4, 8, 16), (4, 4), sparsity, mode)  # 32 tiles
    n = kept.shape[-1]
    assert kept.shape == (2, 3, n, n) and n == 32
    density = kept.float().mean((-1, -2))  # per sample and head
    assert (density - (1 - sparsity)).abs().max() <= 1 / n
    assert kept.diagonal(dim1=-2, dim2=-1).all()  # own block always kept


def test_global_mode_is_a_per_head_percentile():
    q, k = _qk()
    kept = draft_block_mask(q, k, (2, 8, 16), (4, 4), 0.8, "global")
    layout = tile_layout((2, 8, 16), (4, 4))
    qh, kh = pool_tiles(layout.to_tiles(q), layout), pool_tiles(layout.to_tiles(k), layout)
    probs = torch.softmax(qh @ kh.transpose(-1, -2) / 8**0.5, -1)
    off = ~torch.eye(kept.shape[-1], dtype=torch.bool)
    for b in range(2):
        for h in range(3):
            p, m = probs[b, h], kept[b, h]
            # every kept off-diagonal entry outweighs every dropped entry of the same head
            assert p[m & off].min() >= p[~m].max()


def test_row_mode_is_cumulative_mass_top_p():
    q, k = _qk(seed=1)
    kept = draft_block_mask(q, k, (2, 8, 16), (4, 4), 0.8, "row")
    layout = tile_layout((2, 8, 16), (4, 4))
    qh, kh = pool_tiles(layout.to_tiles(q), layout), pool_tiles(layout.to_tiles(k), layout)
    probs = torch.softmax(qh @ kh.transpose(-1, -2) / 8**0.5, -1)
    n = kept.shape[-1]
    eye = torch.eye(n, dtype=torch.bool)
    for b in range(2):
        for h in range(3):
            last_kept, first_dropped = [], []
            for r in range(n):
                p, m = probs[b, h, r], kept[b, h, r]
                rest = ~eye[r]
                # kept blocks of a row are its heaviest (besides its own block)
                if (m & rest).any() and (~m).any():
                    assert p[m & rest].min() >= p[~m].max()
                ranked = torch.cat([p[r : r + 1], p[rest].sort(descending=True).values])
                before = ranked.cumsum(0) - ranked  # mass before each block, own block first
                c = int(m.sum())
                last_kept.append(before[c - 1])
                if c < n:
                    first_dropped.append(before[c])
            # one p per head: no row stops below a mass at which another row keeps going
            assert max(last_kept) <= min(first_dropped) + 1e-6


def test_pooling_matches_avg_pool2d_order():
    # the official code pools with avg_pool2d per frame; tile i of our order must be its cell i
    grid, tile = (2, 8, 16), (4, 8)
    q, _ = _qk(b=1, h=2, grid=grid)
    layout = tile_layout(grid, tile)
    ours = pool_tiles(layout.to_tiles(q), layout)  # [1, 2, nT, D]
    frames = q[0].view(2, grid[0], grid[1], grid[2], -1).permute(1, 0, 4, 2, 3)  # [T, H, D, h, w]
    pooled = torch.nn.functional.avg_pool2d(frames.flatten(1, 2), tile)  # [T, H*D, h', w']
    ref = pooled.view(grid[0], 2, -1, 2, 2).permute(1, 0, 3, 4, 2).reshape(2, -1, q.shape[-1])
    torch.testing.assert_close(ours[0], ref)


def test_pooling_ignores_padding():
    grid, tile = (1, 6, 10), (4, 4)
    q, _ = _qk(b=1, h=1, grid=grid)
    layout = tile_layout(grid, tile)
    pooled = pool_tiles(layout.to_tiles(q), layout)
    frame = q[0, 0].view(6, 10, -1)
    torch.testing.assert_close(pooled[0, 0, 2], frame[0:4, 8:10].reshape(-1, 8).mean(0))
    torch.testing.assert_close(pooled[0, 0, 5], frame[4:6, 8:10].reshape(-1, 8).mean(0))


def test_one_mask_per_sample():
    q, k = _qk(b=2)
    both = draft_block_mask(q, k, (2, 8, 16), (4, 4), 0.75)
    for b in range(2):
        alone = draft_block_mask(q[b : b + 1], k[b : b + 1], (2, 8, 16), (4, 4), 0.75)
        assert torch.equal(both[b], alone[0])
    assert not torch.equal(both[0], both[1])


@pytest.mark.parametrize("kwargs,match", [
    ({"grid": (2, 8, 8)}, r"grid \(2, 8, 8\) has 128 tokens but the sequence has 256 video tokens"),
    ({"sparsity": 1.0}, r"sparsity must be a number in \[0, 1\), got 1.0"),
    ({"sparsity": -0.1}, r"sparsity must be a number in \[0, 1\)"),
    ({"mode": "topk"}, "mode must be one of"),
    ({"tile": (16, 16)}, "larger than the frame"),
])
def test_bad_input(kwargs, match):
    q, k = _qk()
    args = {"grid": (2, 8, 16), "tile": (4, 4), "sparsity": 0.5, "mode": "global", **kwargs}
    with pytest.raises(ValueError, match=match):
        draft_block_mask(q, k, args["grid"], args["tile"], args["sparsity"], args["mode"])


def _probs(q, k, grid, tile):
    layout = tile_layout(grid, tile)
    qh, kh = pool_tiles(layout.to_tiles(q), layout), pool_tiles(layout.to_tiles(k), layout)
    return torch.softmax(qh @ kh.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)


@pytest.mark.parametrize("mass", [0.5, 0.9])
def test_top_p_keeps_the_fewest_tiles_reaching_the_mass(mass):
    q, k = _qk(grid=(4, 8, 16))
    kept = draft_block_mask(q, k, (4, 8, 16), (4, 4), 0.0, "top_p", mass=mass)
    probs = _probs(q, k, (4, 8, 16), (4, 4))
    n = kept.shape[-1]
    eye = torch.eye(n, dtype=torch.bool)
    assert kept.diagonal(dim1=-2, dim2=-1).all()
    kept_mass = (probs * kept).sum(-1)
    assert (kept_mass >= mass - 1e-6).all()
    # dropping the lightest kept tile other than the own one falls short: no row keeps more
    lightest = probs.masked_fill(~kept | eye, 2.0).min(-1).values
    extra = (kept & ~eye).any(-1)
    assert (kept_mass - lightest < mass)[extra].all()
    # and the kept tiles are the heaviest of their row
    off = kept & ~eye
    assert (probs.masked_fill(~off, 2.0).min(-1).values[extra]
            >= probs.masked_fill(kept, -1.0).max(-1).values[extra]).all()


def test_top_p_cap_and_budget_that_follows_the_map():
    from mmspec.video_dit.draft_map import select_blocks

    logits = torch.randn(1, 2, 32, 32, generator=torch.Generator().manual_seed(0))
    logits[0, 0] *= 6  # head 0 peaked, head 1 nearly flat
    probs = torch.softmax(logits, -1)
    kept = select_blocks(probs, 0.0, "top_p", mass=0.9, max_density=0.25)
    per_row = kept.sum(-1)  # [1, 2, 32]
    assert per_row.max() <= 8  # the cap: 25% of 32 tiles
    assert (per_row[0, 1] == 8).all()  # a flat row needs about 29 tiles for 0.9: capped
    assert per_row[0, 0].float().mean() < 4
    with pytest.raises(ValueError, match="needs mass"):
        select_blocks(probs, 0.0, "top_p")


def test_calibrated_sparsity_keeps_the_mass_under_global_selection():
    from mmspec.video_dit.draft_map import calibrated_sparsity

    q, k = _qk(grid=(4, 8, 16))
    probs = _probs(q, k, (4, 8, 16), (4, 4))  # [2, 3, 32, 32]
    kept_mass = []
    for mass in (0.5, 0.8):
        s = float(calibrated_sparsity(probs, mass))
        kept = draft_block_mask(q, k, (4, 8, 16), (4, 4), s, "global")
        kept_mass.append(float((probs * kept).sum(-1).mean()))
        assert kept_mass[-1] == pytest.approx(mass, abs=0.05)
    assert kept_mass[0] < kept_mass[1]
    assert float(calibrated_sparsity(probs, 0.99, max_density=0.3)) == pytest.approx(0.7)
