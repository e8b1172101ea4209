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
        "| dense (SDPA)", "| DraftAttention 75%", "| DraftAttention 90%",
        "| dense, blocks compiled (aot_eager)", "| DraftAttention 75%, blocks compiled",
        "| DraftAttention 90%, blocks compiled"]
    assert rows[1].split(" | ")[1] == rows[4].split(" | ")[1]  # same density compiled or not


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
