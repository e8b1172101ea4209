"""benchmarks/gpu_results.py: the schema of benchmarks/results/gpu/<section>.json, on the CPU."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu_results import GOALS, SECTIONS, met, record  # noqa: E402


def test_a_goal_is_written_as_measured_and_the_others_stay(tmp_path):
    record("kernels_gpu", "triton vs best dense, D 128, density 0.1", 5.3, "cpu", tmp_path)
    path = record("kernels_gpu", "triton vs best dense, D 128, density 1.0", 0.63, "cpu", tmp_path)
    data = json.loads(path.read_text())
    assert path == tmp_path / "kernels_gpu.json"
    assert set(data) == {"section", "device", "commit", "date", "goals"}
    assert data["section"] == "kernels_gpu" and data["device"] == "cpu"
    assert data["commit"] and data["date"].endswith("+00:00")
    # in the table's order, misses kept as measured
    assert data["goals"] == [
        {"name": "triton vs best dense, D 128, density 1.0", "value": 0.63, "op": ">=",
         "goal": 0.9},
        {"name": "triton vs best dense, D 128, density 0.1", "value": 5.3, "op": ">=",
         "goal": 8.0}]
    assert [met(g) for g in data["goals"]] == [False, False]
    record("kernels_gpu", "triton vs best dense, D 128, density 0.1", None, "cpu", tmp_path)
    goals = json.loads(path.read_text())["goals"]
    assert [g["value"] for g in goals] == [0.63, None] and met(goals[1]) is None


def test_another_device_starts_the_file_afresh(tmp_path):
    record("engine_speed_gpu", "efficiency at tau 4, chain", 0.85, "NVIDIA H100", tmp_path)
    path = record("engine_speed_gpu", "efficiency at tau 4, tree", 0.93, "NVIDIA H200", tmp_path)
    data = json.loads(path.read_text())
    assert data["device"] == "NVIDIA H200"
    assert [(g["name"], met(g)) for g in data["goals"]] == [("efficiency at tau 4, tree", True)]


def test_every_section_names_the_issue_table_goals():
    assert tuple(GOALS) == SECTIONS == ("kernels_gpu", "draft_attention_gpu",
                                        "engine_speed_gpu", "engine_compile_gpu")
    ops = {op for goals in GOALS.values() for op, _ in goals.values()}
    assert ops == {">=", "<="}
    assert GOALS["draft_attention_gpu"][
        "draft side (draft + mask, no reorder), % of a dense call, 32,256 tokens"] == ("<=", 5.0)


@pytest.mark.parametrize("args, word", [
    (("kernel_gpu", "triton vs best dense, D 128, density 1.0", 1.0), "section"),
    (("kernels_gpu", "triton at density 1", 1.0), "goal name"),
    (("kernels_gpu", "triton vs best dense, D 128, density 1.0", float("nan")), "value"),
    (("kernels_gpu", "triton vs best dense, D 128, density 1.0", "0.9"), "value"),
])
def test_bad_input_names_the_argument(tmp_path, args, word):
    with pytest.raises(ValueError, match=word):
        record(*args, "cpu", tmp_path)
    assert not list(tmp_path.iterdir())
