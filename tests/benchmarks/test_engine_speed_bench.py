"""benchmarks/engine_speed.py on the CPU: its section is written after every row, and on a GPU run
issue 42's goals (efficiency and the engine's share at tau 4, compiled rounds) go to the JSON."""

import json
import sys
from argparse import Namespace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import engine_speed  # noqa: E402


def test_a_small_run_writes_its_rows_as_it_goes(tmp_path, monkeypatch):
    md = tmp_path / "BENCHMARKS.md"
    monkeypatch.setenv("MMSPEC_BENCHMARKS_MD", str(md))
    sections, profiled = [], []
    generate = engine_speed.generate

    def generate_(*args, profile=False, **kwargs):  # on CUDA, phases timed with events
        out = generate(*args, profile=profile, **kwargs)
        if profile:
            profiled.append(out.stats)
        return out

    monkeypatch.setattr(engine_speed, "generate", generate_)
    write = engine_speed.write_section
    monkeypatch.setattr(engine_speed, "write_section",
                        lambda *a: (sections.append(a[2]), write(*a)))
    assert engine_speed.main(["--small", "--taus", "4", "--new-tokens", "12",
                              "--prompt-tokens", "24", "--write"]) == 0
    # after the chain row, after the tree row, then the whole section with the lookup table
    assert [("| chain | 4 |" in b, "| tree | 4 |" in b, "HF prompt lookup" in b)
            for b in sections] == [(True, False, False), (True, True, False), (True, True, True)]
    # each row's phases come from a profiled call of its own
    forward_ms = [f"{s.target_forward_time / s.rounds * 1e3:.2f}" for s in profiled]
    assert len(forward_ms) == 2
    assert f"| chain | 4 | {profiled[0].mean_accepted:.2f} | {profiled[0].rounds} | " in sections[0]
    assert all(f" | {ms} | " in sections[-1] for ms in forward_ms)
    assert "<!-- engine_speed:start -->" in md.read_text()


ROW = ["chain", "4", "3.90", 33, "20.00", "22.00", "23.00", "0.10", "12.6%", "3.00x", "3.55x",
       "0.85", "yes"]


def test_a_gpu_run_records_the_goals_at_tau_4(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPEC_GPU_RESULTS", str(tmp_path))
    monkeypatch.setenv("MMSPEC_BENCHMARKS_MD", str(tmp_path / "BENCHMARKS.md"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    args = Namespace(gpu=True, write=True, prompt_tokens=128)
    tree = ["tree", "4"] + ROW[2:8] + ["2.0%"] + ROW[9:11] + ["0.93", "yes"]
    engine_speed._write_speed(args, [ROW, tree], None, "a 7B", 128, 128, 3)
    goals = json.loads((tmp_path / "engine_speed_gpu.json").read_text())
    assert goals["device"] == "NVIDIA H200"
    assert {g["name"]: g["value"] for g in goals["goals"]} == {
        "efficiency at tau 4, chain": 0.85, "efficiency at tau 4, tree": 0.93,
        "engine work per round, % of a verification forward, chain": 12.6,
        "engine work per round, % of a verification forward, tree": 2.0}
    compiled = [["chain", "3.90", 33, "30.00", "20.00", "1.50x", "2x", "3x", "40.0", "yes"],
                ["tree", "3.90", 33, "30.00", "25.00", "1.20x", "2x", "2.5x", "41.0", "yes"]]
    engine_speed._write_compiled(args, compiled, "a 7B", 128, 3, torch.device("cuda"))
    goals = json.loads((tmp_path / "engine_compile_gpu.json").read_text())["goals"]
    assert [(g["name"], g["value"]) for g in goals] == [
        ("compiled vs eager rounds, chain", 1.5), ("compiled vs eager rounds, tree", 1.2)]
    assert "chain 1.50x, tree 1.20x: missed" in (tmp_path / "BENCHMARKS.md").read_text()
