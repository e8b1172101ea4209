"""The GPU end-to-end benchmark (benchmarks/draft_attention.py section 4) runs on any device: run it
here on CPU at a tiny Wan size, so the code a lent GPU runs is exercised in CI."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.draft_attention import wan_step

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
