"""Write one benchmark's section into BENCHMARKS.md, between its own markers.

Each benchmark owns a section `<!-- NAME:start --> ... <!-- NAME:end -->`; rerunning it replaces
only that section, so benchmarks never overwrite each other's results.
"""

import importlib.metadata
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def markdown_file() -> Path:
    """Where sections are written: BENCHMARKS.md, or MMSPEC_BENCHMARKS_MD (a GPU session writes
    its copy under $OUT, row by row, so that what a cut-short call measured comes back)."""
    return Path(os.environ.get("MMSPEC_BENCHMARKS_MD") or BENCHMARKS_MD)


def timed_interleaved(fns: dict, repeats: int, sync=lambda: None,
                      reduce=statistics.median) -> dict:
    """Seconds per call of each of `fns` (name -> function): one warm-up call each, then
    `repeats` rounds that call every function once in turn, so that each gets the same count and
    a load change on a shared machine moves all of them alike."""
    for fn in fns.values():
        fn()
    sync()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: reduce(t) for name, t in times.items()}


def best_of(names, call, repeats: int, seconds) -> dict:
    """name -> the fastest of `repeats` results of `call(name)` (`seconds(result)` its time), the
    names called in turn within each repeat, so that a load change moves all of them alike."""
    best = {}
    for _ in range(repeats):
        for name in names:
            result = call(name)
            if name not in best or seconds(result) < seconds(best[name]):
                best[name] = result
    return best


def versions() -> str:
    """torch and the Hugging Face libraries whose internals mmspec reaches into (see
    constraints.txt): a figure can move with any of them."""
    parts = [f"torch {torch.__version__}"]
    for name in ("transformers", "diffusers"):
        try:
            parts.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)


def machine() -> str:
    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name()}, {versions()}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {torch.get_num_threads()} threads, {versions()}"


def command() -> str:
    """The command line, quoted so that it can be pasted again; the script relative to the repo."""
    script = Path(sys.argv[0]).resolve()
    root = BENCHMARKS_MD.parent.resolve()
    if script.is_relative_to(root):
        script = script.relative_to(root)
    return "python " + shlex.join([script.as_posix(), *sys.argv[1:]])


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=BENCHMARKS_MD.parent).stdout.strip()
    except OSError:
        return "unknown"


def write_section(name: str, title: str, body: str) -> None:
    """Replace (or append) section `name` of BENCHMARKS.md (`markdown_file()`) with `body` plus
    provenance."""
    block = (
        f"<!-- {name}:start -->\n## {title}\n\n"
        f"Command: `{command()}`  \nMachine: {machine()}  \nCommit: {commit()}\n\n"
        f"{body.rstrip()}\n<!-- {name}:end -->"
    )
    path = markdown_file()
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.rstrip() + "\n")
    os.replace(tmp, path)  # a run killed at its cap never leaves half a file


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def check_plot_deps(plot: bool) -> None:
    """`--plot` needs matplotlib: say so before the run, not after it (a run takes minutes)."""
    if not plot:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise SystemExit("--plot needs matplotlib: install it into the venv with .venv/bin/pip "
                         "install -c constraints.txt -e '.[bench]' (or drop --plot)") from e
