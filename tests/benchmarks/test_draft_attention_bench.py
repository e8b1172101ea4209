"""benchmarks/draft_attention.py's GPU report, on the CPU with its parts stubbed: a part that
raises is its own line, its traceback goes to stderr, the parts after it still run, and the goal
it measures is recorded as not measured (null) in the results JSON."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import draft_attention as da  # noqa: E402

WAN_32K = "Wan step speedup at 90% sparsity, 32,256 tokens"
WAN_75K = "Wan step speedup at 90% sparsity, 75,600 tokens"


def test_a_failing_wan_step_is_a_line_a_traceback_and_a_null_goal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MMSPEC_GPU_RESULTS", str(tmp_path))
    monkeypatch.setattr(da, "device_name", lambda device: "Fake GPU")
    monkeypatch.setattr(da.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(da, "overhead_report", lambda device, grid, tile: "### overhead\n")

    def wan_section(device, grid, tile, quick, compile=None, draft_kernels=None):
        if grid == (21, 32, 48):  # as on the H200 of 2026-11-28: an import deep in diffusers
            try:
                raise ImportError("cannot import name 'Dinov2WithRegistersModel'")
            except ImportError as err:
                raise RuntimeError("Failed to import diffusers.pipelines.pipeline_utils") from err
        da.record("draft_attention_gpu", WAN_75K, 2.12, "Fake GPU")
        return "### 4. 75,600 tokens\n"

    monkeypatch.setattr(da, "wan_section", wan_section)
    body = da.gpu_report("cuda", (21, 32, 48), (8, 16), quick=False, extra_grids=((21, 45, 80),))
    assert body.splitlines()[0] == "### overhead"
    assert "(a part failed: RuntimeError: Failed to import diffusers.pipelines" in body
    assert "### 4. 75,600 tokens" in body  # the part after the failure still ran
    # the cause, which the part's one line leaves out, is in stderr (steps.log on a GPU)
    assert "Dinov2WithRegistersModel" in capsys.readouterr().err
    data = json.loads((tmp_path / "draft_attention_gpu.json").read_text())
    assert {g["name"]: g["value"] for g in data["goals"]} == {WAN_32K: None, WAN_75K: 2.12}
