"""The GPU end-to-end benchmarks (benchmarks/draft_attention.py sections 4 and 5) run on any device:
run them here on CPU at tiny Wan and CogVideoX sizes, so the code a lent GPU runs is exercised in
CI. Also the fidelity measure's global and shared oracles, which bound every mask of their block
budget."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.draft_attention import cogvideox_step, fidelity, wan_step

TINY = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 32, "ffn_dim": 64, "text_dim": 32,
            "freq_dim": 32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wan_step_times_dense_and_sparse_at_the_requested_density(dtype):
    rows, dense_ms = wan_step("cpu", dtype, (2, 8, 16), (0.5, 0.75), reps=1, tile=(4, 4),
                              text_tokens=8, **TINY)
    assert dense_ms > 0
    assert [r["sparsity"] for r in rows] == [0.5, 0.75]
    tiles = 2 * (8 // 4) * (16 // 4)  # 16 tiles: one block per row is 1/16 of the density
    for r in rows:
        assert abs(r["density"] - (1 - r["sparsity"])) <= 1 / tiles + 1e-6
        assert r["ms"] > 0 and r["speedup"] == pytest.approx(dense_ms / r["ms"])


def test_step_section_with_compiled_blocks():
    from torch._dynamo.utils import counters

    from benchmarks.draft_attention import step_section

    torch._dynamo.reset()
    counters.clear()
    try:
        text = step_section("cpu", (2, 8, 16), (4, 4), wan_step,
                            {**TINY, "text_tokens": 8, "reps": 1}, "### title", "Wan {dtype}",
                            compile="aot_eager")
    finally:
        torch._dynamo.reset()
    assert counters["stats"]["unique_graphs"] >= 2  # dense and sparse blocks compiled
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| dense (SDPA)", "| DraftAttention 90%",  # the goals' first
        "| DraftAttention 90%, permute_once=False",  # frames of whole tiles: no reorder too
        "| DraftAttention 75%", "| DraftAttention 75%, permute_once=False",
        "| dense, blocks compiled (aot_eager)", "| DraftAttention 90%, blocks compiled",
        "| DraftAttention 75%, blocks compiled"]
    assert [r.split(" | ")[-1] for r in rows] == [
        " |", "once per forward |", "none |", "once per forward |", "none |", " |",
        "once per forward |", "once per forward |"]
    assert rows[1].split(" | ")[1] == rows[2].split(" | ")[1] == rows[6].split(" | ")[1]


def test_step_section_on_padded_frames_times_gathered_loads_and_the_per_layer_copy():
    # 6x10 frames in 4x4 tiles: no reorder once per forward; each sparsity read through the
    # permutation (the default) and copied into tile order in each layer (gathered_loads=False)
    from benchmarks.draft_attention import step_section

    text = step_section("cpu", (2, 6, 10), (4, 4), wan_step,
                        {**TINY, "text_tokens": 8, "reps": 1}, "### title", "Wan {dtype}")
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == [
        "| dense (SDPA)", "| DraftAttention 90%", "| DraftAttention 90%, gathered_loads=False",
        "| DraftAttention 75%", "| DraftAttention 75%, gathered_loads=False"]
    assert [r.split(" | ")[-1] for r in rows] == [
        " |", "none |", "per layer |", "none |", "per layer |"]
    assert rows[1].split(" | ")[1] == rows[2].split(" | ")[1]  # the same blocks either way


def test_cogvideox_step_keeps_text_dense_and_times_both():
    rows, dense_ms = cogvideox_step("cpu", torch.float32, (3, 8, 12), (0.75,), reps=1,
                                    tile=(4, 4), num_layers=2, num_attention_heads=2,
                                    attention_head_dim=16)
    # 3 frames x 2 x 3 = 18 video tiles, and 226 text tokens = 15 blocks of 16 whose rows and
    # columns stay dense: (81 video blocks + 33^2 - 18^2 text blocks) / 33^2 of the blocks
    assert dense_ms > 0 and rows[0]["ms"] > 0
    assert rows[0]["density"] == pytest.approx((81 + 33**2 - 18**2) / 33**2, abs=1e-4)


def test_global_oracle_bounds_every_mask_of_its_budget():
    rows, _, sampled, tiles = fidelity((2, 8, 16), (4, 4), (0.75, 0.9), query_tiles=64)
    assert sampled == tiles  # exact over all queries, where the bound is exact too
    for s in (0.75, 0.9):
        at = {r["method"]: r for r in rows if r["sparsity"] == s}
        best, shared = at["oracle (global)"], at["oracle (shared)"]
        for name, r in at.items():
            # per-head budgets: the global oracle bounds them; pooled: the shared one bounds all
            if r["density"] <= best["density"] + 1e-6:
                assert r["recall"] <= shared["recall"] + 1e-5, name
                if name != "oracle (shared)":
                    assert r["recall"] <= best["recall"] + 1e-5, name
        assert shared["density"] == pytest.approx(best["density"])


@pytest.mark.parametrize("query_tile", [None, (4, 8)])
def test_fidelity_recall_and_error_against_a_dense_softmax(query_tile):
    # the fidelity measure scores a mask by its kept share of the dense softmax and the error of
    # attention restricted to it: check both for the draft and window masks against SDPA over a
    # token mask, with square tiles and with query tiles over them, exact over all queries
    import torch.nn.functional as F

    from benchmarks.draft_attention import fidelity_of, structured_heads, window_blocks
    from mmspec.video_dit import draft_block_mask, tile_layout

    grid, tile = (2, 8, 16), (2, 4)
    layout = tile_layout(grid, tile, query_tile=query_tile)
    q, k, v, _ = structured_heads(grid, 64)
    rows, sampled, nq = fidelity_of(q, k, v, layout, [0.75], query_tiles=1000)
    assert sampled == nq == layout.num_query_tiles
    at = {r["method"]: r for r in rows}
    slot = layout.inverse  # tiled slot of each token
    q_tile, k_tile = slot // layout.query_tile_tokens, slot // layout.tile_tokens
    probs = torch.softmax(q @ k.transpose(-1, -2) / 8, -1)  # D = 64
    dense = probs @ v
    budget = round(0.25 * layout.num_query_tiles * layout.num_tiles)
    masks = {"draft-global": draft_block_mask(q, k, grid, tile, 0.75, query_tile=query_tile)[0],
             "local window": window_blocks(layout, grid, tile, budget)[None].expand(4, -1, -1)}
    own = layout.own_blocks()
    assert masks["local window"][0][own].all()  # the window holds each query tile's own tiles
    for name, kept in masks.items():
        token = kept[:, q_tile][:, :, k_tile]  # [H, N, N]
        recall = (probs[0] * token).sum(-1).mean()
        assert at[name]["recall"] == pytest.approx(float(recall), abs=1e-5)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=token[None])
        error = (out - dense).norm() / dense.norm()
        assert at[name]["error"] == pytest.approx(float(error), rel=1e-3)
        assert at[name]["density"] == pytest.approx(budget / own.numel(), abs=1e-6)


def test_overhead_and_speed_times_dense_and_sparse_in_turn(monkeypatch):
    # dense was timed first, the fastest of 2, and the sparse calls later, the fastest of 3: on
    # a shared CPU a load change between the two moved the ratio. Now every call gets the same
    # count, in turn within each round
    import torch.nn.functional as F

    import benchmarks.draft_attention as bench

    calls = []

    def logged(name, fn):
        def call(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        logged("dense", F.scaled_dot_product_attention))
    monkeypatch.setattr(bench, "block_sparse_attention",
                        logged("sparse", bench.block_sparse_attention))
    monkeypatch.setattr(bench, "draft_attention", logged("whole", bench.draft_attention))
    t = bench.overhead_and_speed((2, 8, 16), (4, 4), heads=1, dim=32, sparsity=0.5, reps=2)
    # after the mask's own call: a first call of each (a call that raises is left out), warm-up
    # + 2; the sparse call in tile order and through the permutation, the whole call without a
    # reorder, with one, and with the torch draft
    # then the no-reorder and the reorder path once more, their outputs compared
    assert calls[1:] == ["dense", "sparse", "sparse", "whole", "whole", "whole"] * 4 + [
        "whole", "whole"]
    assert t["agree"] < 1e-5
    assert t["dense"] > 0 and t["sparse_call"] > 0 and t["whole"] > 0
    assert t["sparse_call_gathered"] > 0 and t["whole_reorder"] > 0
    assert t["whole_torch_draft"] > 0 and t["fused"] == {}  # no fused timing off CUDA


def test_run_speedup_counts_the_dense_warm_up_steps():
    from benchmarks.draft_attention import run_speedup

    # the default warm-up: 15 of 50 steps dense (dense_steps=0.3)
    assert run_speedup(1.0) == pytest.approx(1.0)
    assert run_speedup(2.0) == pytest.approx(50 / (15 + 35 / 2))
    assert run_speedup(2.19) == pytest.approx(1.61, abs=0.005)  # BENCHMARKS.md's estimate


def test_the_gpu_report_writes_each_part_and_a_failing_part_costs_only_itself(monkeypatch):
    import benchmarks.draft_attention as bench

    def wan(device, grid, tile, quick, compile=None, draft_kernels=None):
        if grid == (2, 8, 16):
            raise RuntimeError("Triton compile failed")
        return f"wan {grid}"

    monkeypatch.setattr(bench, "overhead_report", lambda device, grid, tile: "overhead")
    monkeypatch.setattr(bench, "wan_section", wan)
    bodies = []
    body = bench.gpu_report("cpu", (2, 8, 16), (4, 4), True, extra_grids=[(2, 8, 32)],
                            progress=bodies.append)
    assert bodies[-1] == body and len(bodies) == 3
    assert body.split("\n") == ["overhead", "(a part failed: RuntimeError: Triton compile "
                                "failed)", "", "wan (2, 8, 32)"]
