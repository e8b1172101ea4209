"""`auto`'s timing table: the backends measured on this machine, fastest first, per (device name,
dtype, head dim, mask density).

The table is a small JSON file beside the fused CPU kernel's build, in torch's per-machine
extension folder (`~/.cache/torch_extensions` unless `TORCH_EXTENSIONS_DIR` says otherwise):

    {"version": 1, "entries": [
        {"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "head_dim": 128,
         "density": 0.1, "ms": {"triton": 1.52, "flex": 2.61}}, ...]}

`python -m mmspec.kernels.tune` measures it on this machine; `--from-points P.json` converts the
points of `benchmarks/kernels.py --gpu-only --points P.json` instead. The registry's `auto` asks
`ranking` for its order and keeps its fixed one where this returns None.

Choosing by density reads the mask's density, one device sync on a GPU. So it is read only where
the table's rankings for the call's (device, dtype, head dim) differ between densities (where
they agree, that ranking holds at any density), at most once per mask object, and never while
`torch.compile` traces (the fixed order there). Density matches the nearest measured point
within a factor of 2; none that near means no ranking.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import weakref
from pathlib import Path

import torch

from ..mask import BlockSparseMask

TABLE_NAME = "mmspec_auto_backends.json"
VERSION = 1
_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.float32, torch.float16, torch.bfloat16)}
_NEAR = 2.0  # a measured density stands for those within this factor of it

_log = logging.getLogger(__name__)


def table_path() -> Path:
    """Where the table lives: the per-machine folder of the CPU kernel's build."""
    from torch.utils import cpp_extension

    return Path(cpp_extension.get_default_build_root()) / TABLE_NAME


def _check_entry(entry) -> None:
    ok = (isinstance(entry, dict) and isinstance(entry.get("device"), str)
          and entry.get("dtype") in _DTYPES
          and isinstance(entry.get("head_dim"), int) and entry["head_dim"] > 0
          and isinstance(entry.get("density"), (int, float)) and 0 < entry["density"] <= 1
          and isinstance(entry.get("ms"), dict) and entry["ms"]
          and all(isinstance(n, str) and isinstance(t, (int, float)) and t > 0
                  and math.isfinite(t) for n, t in entry["ms"].items()))
    if not ok:
        raise ValueError(f"an entry must hold device, dtype (one of {sorted(_DTYPES)}), "
                         f"head_dim > 0, density in (0, 1] and ms {{backend: ms > 0}}, got "
                         f"{entry!r}"[:300])


def parse_table(data) -> dict[tuple[str, str, int], list[tuple[float, tuple[str, ...]]]]:
    """{(device, dtype, head dim): [(density, backends fastest first), ...]} from the JSON."""
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(
            data.get("entries"), list):
        raise ValueError(f"expected {{'version': {VERSION}, 'entries': [...]}}, got "
                         f"{str(data)[:100]}")
    table: dict = {}
    for entry in data["entries"]:
        _check_entry(entry)
        order = tuple(sorted(entry["ms"], key=entry["ms"].get))
        key = (entry["device"], entry["dtype"], entry["head_dim"])
        table.setdefault(key, []).append((float(entry["density"]), order))
    return table


@functools.cache
def _table() -> dict:
    """The parsed table, read once per process ({} when there is none or it is unreadable)."""
    path = table_path()
    if not path.is_file():
        return {}
    try:
        return parse_table(json.loads(path.read_text()))
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        _log.warning("mmspec: ignoring the backend timing table %s (%s); backend='auto' keeps "
                     "its fixed order. Rerun `python -m mmspec.kernels.tune` to rebuild it",
                     path, str(err).splitlines()[0][:200])
        return {}


def forget() -> None:
    """Read the table again at the next call (after `tune` wrote it)."""
    _table.cache_clear()


def write_table(entries: list[dict], path: Path | None = None) -> Path:
    """Check `entries` and write them as the table, atomically (a reader never sees half). They
    replace the table's entries for their devices; entries for other devices (this machine's CPU
    next to its GPU) stay, unless the file is unreadable."""
    for entry in entries:
        _check_entry(entry)
    path = table_path() if path is None else Path(path)
    devices = {entry["device"] for entry in entries}
    try:
        old = json.loads(path.read_text())
        parse_table(old)
        entries = [e for e in old["entries"] if e["device"] not in devices] + list(entries)
    except (OSError, ValueError):  # none yet, or unreadable: replaced whole
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1))
    partial.replace(path)
    forget()
    return path


@functools.cache
def device_name(device: torch.device) -> str:
    """The name the table files a device under: the GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
        except OSError:  # not Linux
            pass
        return f"cpu: {platform.processor() or platform.machine()}"
    return device.type


# one density per mask object: a mask's tensors are not edited in place in practice, and a stale
# value would only cost speed (constraints are still checked on the chosen backend)
_DENSITY: "weakref.WeakKeyDictionary[BlockSparseMask, float]" = weakref.WeakKeyDictionary()


def _density(mask: BlockSparseMask) -> float:
    if mask not in _DENSITY:
        _DENSITY[mask] = mask.density()
    return _DENSITY[mask]


def ranking(q: torch.Tensor, mask: BlockSparseMask) -> tuple[str, ...] | None:
    """The measured backends for this call, fastest first, or None where the table has nothing
    near it (see the module docstring)."""
    if torch.compiler.is_compiling():
        return None
    table = _table()
    if not table:
        return None
    points = table.get((device_name(q.device), str(q.dtype).removeprefix("torch."),
                        q.shape[-1]))
    if not points:
        return None
    if len({order for _, order in points}) == 1:
        return points[0][1]
    density = _density(mask)
    if density <= 0:
        return None
    near, order = min(points, key=lambda p: abs(math.log(p[0] / density)))
    return order if abs(math.log(near / density)) <= math.log(_NEAR) else None
