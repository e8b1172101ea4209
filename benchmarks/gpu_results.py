"""GPU results a machine can read: `benchmarks/results/gpu/<section>.json` (issue 42 item 2).

One file per GPU section of BENCHMARKS.md, next to it, holding one entry per goal of issue 42's
table with the value as measured (a miss stays a miss; a measurement that failed or did not run
is `null`):

    {"section": "kernels_gpu", "device": "NVIDIA H200", "commit": "1a2b3c4", "date": "...",
     "goals": [{"name": "...", "value": 0.71, "op": ">=", "goal": 0.9}, ...]}

`record` rewrites the file after every goal, so a run cut short keeps the goals it measured.
"""

from __future__ import annotations

import datetime
import json
import math
import numbers
import os
from pathlib import Path

try:
    from report import commit
except ImportError:  # imported as benchmarks.gpu_results
    from benchmarks.report import commit

RESULTS = Path(__file__).resolve().parent / "results" / "gpu"
SECTIONS = ("kernels_gpu", "draft_attention_gpu", "engine_speed_gpu", "engine_compile_gpu")
OPS = (">=", "<=")

# issue 42's table, by section: goal name -> (op, goal)
GOALS = {
    "kernels_gpu": {
        f"{backend} vs best dense, D 128, density {density}": (">=", bar)
        for backend in ("triton", "triton-tma", "triton-tma-persistent")
        for density, bar in (("1.0", 0.9), ("0.1", 8.0))},
    "draft_attention_gpu": {
        "draft side (draft + mask, no reorder), % of a dense call, 32,256 tokens": ("<=", 5.0),
        "Wan step speedup at 90% sparsity, 32,256 tokens": (">=", 2.0),
        "Wan step speedup at 90% sparsity, 75,600 tokens": (">=", 2.5),
    },
    "engine_speed_gpu": {
        "efficiency at tau 4, chain": (">=", 0.9),
        "efficiency at tau 4, tree": (">=", 0.9),
        "engine work per round, % of a verification forward, chain": ("<=", 3.0),
        "engine work per round, % of a verification forward, tree": ("<=", 3.0),
    },
    "engine_compile_gpu": {
        "compiled vs eager rounds, chain": (">=", 1.5),
        "compiled vs eager rounds, tree": (">=", 1.5),
    },
}


def record(section: str, name: str, value, device: str, folder: Path | None = None) -> Path:
    """Set goal `name` of `section` (one of `GOALS[section]`) to `value` (a number, or None for
    a measurement that failed) in `folder/<section>.json`, measured on `device`; the other goals
    of the file stay. `folder`: default MMSPEC_GPU_RESULTS (a GPU session's $OUT/results), else
    benchmarks/results/gpu. Returns the file's path."""
    if section not in GOALS:
        raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
    if name not in GOALS[section]:
        raise ValueError(f"goal name of section {section} must be one of "
                         f"{sorted(GOALS[section])}, got {name!r}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                              or not math.isfinite(value)):
        raise ValueError(f"value of {name!r} must be a finite number or None, got {value!r}")
    op, goal = GOALS[section][name]
    folder = folder or os.environ.get("MMSPEC_GPU_RESULTS") or RESULTS
    path = Path(folder) / f"{section}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if data.get("device") != device:  # another machine's file: start afresh
        data = {}
    goals = {g["name"]: g for g in data.get("goals", [])}
    goals[name] = {"name": name, "value": None if value is None else float(value), "op": op,
                   "goal": goal}
    data = {"section": section, "device": device, "commit": commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "goals": [goals[n] for n in GOALS[section] if n in goals]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # a reader (or a kill) never sees half a file
    return path


def met(entry: dict) -> bool | None:
    """Whether an entry's value meets its goal (None: not measured)."""
    if entry["value"] is None:
        return None
    return entry["value"] >= entry["goal"] if entry["op"] == ">=" else entry["value"] <= entry["goal"]
