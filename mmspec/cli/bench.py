"""`mmspec bench`: run the side-by-side benchmarks of a source checkout (`benchmarks/*.py`).

    mmspec bench text vlm video --plot            charts into benchmarks/plots/
    mmspec bench all --plot --write               ... and each section of BENCHMARKS.md

Arguments after the names go to every script (`--plot`, `--write`, `--threads N`, ...). The
benchmarks are not part of the installed package: they live beside it in the repository.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = ("kernels", "draft_attention", "engine_overhead", "text", "vlm", "video")
PLOTTING = ("text", "vlm", "video")  # the others print tables only


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + f"\n\nnames: {', '.join(SCRIPTS)}, all")
        return 0
    names = []
    while argv and not argv[0].startswith("-"):
        names.append(argv.pop(0))
    names = list(SCRIPTS) if names == ["all"] else names
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown or not names:
        raise SystemExit(f"mmspec bench: expected benchmark names from {', '.join(SCRIPTS)} or "
                         f"'all', got {unknown or 'none'}")
    if not BENCHMARKS.is_dir():
        raise SystemExit(f"mmspec bench needs a source checkout: {BENCHMARKS} does not exist")
    for name in names:
        script = BENCHMARKS / f"{name}.py"
        if not script.is_file():
            raise SystemExit(f"mmspec bench: {script} does not exist in this checkout")
        args = [a for a in argv if a != "--plot" or name in PLOTTING]
        print(f"[mmspec bench] {name}: python {script.relative_to(BENCHMARKS.parent)} "
              f"{' '.join(args)}", flush=True)
        rc = subprocess.call([sys.executable, str(script), *args], cwd=BENCHMARKS.parent)
        if rc:
            return rc
    return 0
