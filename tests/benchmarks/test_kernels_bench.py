"""benchmarks/kernels.py's GPU table, run on the CPU at a tiny size: every row is written as it is
measured, a failing backend is a "failed" row, and issue 42's goals land in the JSON."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import kernels  # noqa: E402


def test_the_table_is_written_row_by_row_with_failed_backends(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPEC_GPU_RESULTS", str(tmp_path))
    attention = kernels.block_sparse_attention

    def compile_fails(q, k, v, mask, backend):  # as a Triton compile error would
        if backend == "triton-tma":
            raise RuntimeError("PassManager::run failed")
        return attention(q, k, v, mask, backend=backend)

    monkeypatch.setattr(kernels, "block_sparse_attention", compile_fails)
    seen = []
    body, points = kernels.gpu_table(
        1, head_dims=(128,), densities=(1.0, 0.1), backends=("triton", "triton-tma"), n=256,
        h=1, block=128, device="cpu", progress=lambda body, points: seen.append(len(points)))
    assert seen == [1, 2, 3, 4]  # random 1.0, 0.1, causal 1.0, 0.1
    assert [set(p["backends_ms"]) for p in points] == [{"triton"}] * 4
    rows = [line for line in body.splitlines() if line.startswith("| 128 |") and "x |" in line]
    assert len(rows) == 4 and all("| failed |" in row for row in rows)
    goals = {g["name"]: g["value"] for g in
             json.loads((tmp_path / "kernels_gpu.json").read_text())["goals"]}
    for point, density in zip(points, ("1.0", "0.1")):  # the ratio, as measured
        ratio = min(point["dense"].values()) / point["backends_ms"]["triton"]
        assert goals[f"triton vs best dense, D 128, density {density}"] == pytest.approx(ratio)
    assert goals["triton-tma vs best dense, D 128, density 0.1"] is None
    assert set(goals) == set(kernels.record.__globals__["GOALS"]["kernels_gpu"])
