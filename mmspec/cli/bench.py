"""`mmspec bench`: run the side-by-side benchmarks of a source checkout (`benchmarks/*.py`).

    mmspec bench text vlm video --plot            charts into benchmarks/plots/
    mmspec bench all --plot --write               ... and each section of BENCHMARKS.md

Options after the names go to every script that has them (`--plot`, `--write`, `--threads N`,
...); a script without one runs without it, and says so. The benchmarks are not part of the
installed package: they live beside it in the repository.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from mmspec.interrupt import Interrupted

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = ("kernels", "draft_attention", "engine_overhead", "text", "vlm", "video")


def _groups(argv: list[str]) -> list[list[str]]:
    """["--a", "1", "--b"] -> [["--a", "1"], ["--b"]]: each option with the values after it."""
    groups: list[list[str]] = []
    for arg in argv:
        if arg.startswith("-") or not groups:
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return groups


def _options(script: Path) -> set[str]:
    """The options of `script`'s command line: the module is imported (not run) and its
    `build_parser()` read."""
    spec = importlib.util.spec_from_file_location(f"benchmarks.{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    if not callable(getattr(module, "build_parser", None)):
        raise SystemExit(f"mmspec bench: {script} has no build_parser() to read its options from")
    return {option for action in module.build_parser()._actions
            for option in action.option_strings}


def args_for(script: Path, argv: list[str]) -> tuple[list[str], list[str]]:
    """(the options of `argv` that `script` has, with their values; the others)."""
    accepted = _options(script)
    args: list[str] = []
    left_out: list[str] = []
    for group in _groups(argv):
        (args if group[0].split("=")[0] in accepted else left_out).extend(group)
    return args, left_out


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
    for done, name in enumerate(names):
        script = BENCHMARKS / f"{name}.py"
        if not script.is_file():
            raise SystemExit(f"mmspec bench: {script} does not exist in this checkout")
        args, left_out = args_for(script, argv)
        print(f"[mmspec bench] {name}: python {script.relative_to(BENCHMARKS.parent)} "
              f"{' '.join(args)}" + (f"  (not options of {name}.py: {' '.join(left_out)})"
                                     if left_out else ""), flush=True)
        try:  # its own session: Ctrl-C reaches this process only, which then kills it
            rc = subprocess.call([sys.executable, str(script), *args], cwd=BENCHMARKS.parent,
                                 start_new_session=True)
        except KeyboardInterrupt:
            finished = ", ".join(names[:done]) or "none"
            rest = " ".join([*names[done:], *argv])
            raise Interrupted(f"{name} stopped (nothing of it written); finished before it: "
                              f"{finished}; `mmspec bench {rest}` runs the rest") from None
        if rc:
            return rc
    return 0
