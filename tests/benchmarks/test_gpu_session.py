"""benchmarks/gpu_session.sh on the CPU: its plan fits one device call (600 s, 64 MiB, 8 files back),
and a failing or slow step costs only its own rows."""

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
MIB = 1 << 20


def session(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ, **(env or {})})


def test_the_plan_fits_one_device_call():
    run = session("--plan")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    steps = re.findall(r"^(\w+)\s+(\d+)\s+\$PY", out, re.M)
    assert [name for name, _ in steps] == ["kernels", "draft", "engine", "engine_compile"]
    caps, setup, total, deadline = map(int, re.search(
        r"caps: (\d+) s of steps \+ (\d+) s setup = (\d+) s; deadline (\d+) s", out).groups())
    assert caps == sum(int(cap) for _, cap in steps) and total == caps + setup
    assert total <= deadline < 600
    tree, wheels, carried = map(float, re.search(
        r"carry: tracked tree ([\d.]+) MiB \+ wheels ([\d.]+) MiB .* = ([\d.]+) MiB of 64 MiB",
        out).groups())
    assert tree > 1 and wheels > 1 and carried <= 64
    files = re.search(r"files back under \$OUT: (.*) \(8 at most\)", out).group(1).split()
    assert len(files) <= 8


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path):
    run = session(env={"STEPS": "kernels kernals", "OUT": str(tmp_path / "out")})
    assert run.returncode == 2 and "unknown step kernals" in run.stdout
    assert not (tmp_path / "out").exists()


def _wheels() -> list[tuple[str, int]]:
    lines = (ROOT / "benchmarks" / "gpu_wheels.txt").read_text().splitlines()
    return [(f, int(n)) for f, n in (line.split() for line in lines if line and line[0] != "#")]


def test_the_tracked_tree_and_the_wheels_fit_64_mib():
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT)
    if listed.returncode:
        pytest.skip("not a git checkout")
    files = [ROOT / f for f in listed.stdout.decode().split("\0") if f]
    tree = sum(f.stat().st_size for f in files if f.is_file())
    wheels = _wheels()
    assert sorted(f.split("-")[0] for f, _ in wheels) == ["diffusers", "regex", "transformers"]
    assert all(f.endswith(".whl") and ("cp312" in f or "py3-none-any" in f) for f, _ in wheels)
    total = tree + sum(n for _, n in wheels)
    assert total <= 64 * MIB, f"tree {tree / MIB:.1f} MiB + wheels: {total / MIB:.1f} MiB"


FAKE_PY = """#!/usr/bin/env bash
case "$*" in
  -c*) echo "fake GPU | torch 0";;
  *kernels.py*) echo "<!-- kernels_gpu:start -->rows<!-- kernels_gpu:end -->" >>"$MMSPEC_BENCHMARKS_MD"
                echo '{}' >"$MMSPEC_GPU_RESULTS/kernels_gpu.json";;
  *draft_attention.py*) echo "illegal memory access"; exit 3;;
  *engine_speed.py*) sleep 60;;
esac
"""


def test_a_failing_step_and_a_slow_one_leave_the_others_their_rows(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PY)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    run = session(env={"PY": str(fake), "OUT": str(out), "WHEEL_DIR": str(tmp_path),
                       "DEADLINE": "16", "MIN_STEP": "2"}, timeout=40)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = (out / "session.txt").read_text()
    assert "fake GPU" in summary
    lines = {line.split()[0]: line for line in summary.splitlines()[2:] if line.strip()}
    assert " ok " in lines["kernels"]
    assert "failed (rc 3" in lines["draft"]
    assert "timed out at" in lines["engine"]
    assert "skipped" in lines["engine_compile"]
    assert "illegal memory access" in (out / "steps.log").read_text()
    assert "kernels_gpu:start -->rows" in (out / "BENCHMARKS.md").read_text()
    assert (out / "results" / "kernels_gpu.json").exists()
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8
