"""`python -m mmspec` / `mmspec`: the command line.

    mmspec generate    speculative decoding on the zoo VLM (the embedded default, `make run`),
                       the zoo text pair or any HF path (see `mmspec generate --help`)
    mmspec demo        a self-contained tour of the block-sparse attention layer
    mmspec bench       the side-by-side benchmarks, `--plot` for the charts (`mmspec bench -h`)
    mmspec kernels tune  measure backend="auto"'s timing table on this machine
    mmspec --version   mmspec's version, with torch's and the Hugging Face libraries'
"""

import sys


def version_line() -> str:
    """`mmspec X (torch Y, transformers Z, diffusers W)`, the others from their installed
    metadata, for bug reports."""
    from importlib.metadata import PackageNotFoundError, version

    import mmspec

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    others = ", ".join(f"{name} {installed(name)}" for name in ("torch", "transformers",
                                                                "diffusers"))
    return f"mmspec {mmspec.__version__} ({others})"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(version_line())
        return 0
    commands = {
        "demo": "mmspec.demo",
        "generate": "mmspec.cli.generate",
        "bench": "mmspec.cli.bench",
        "kernels": "mmspec.cli.kernels",
    }
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}; expected one of {sorted(commands)}")
            return 2
        return 0
    import importlib

    from mmspec.interrupt import run_command

    # `generate`, `demo` and `kernels tune` keep no state until the end: rerunning is all there
    # is to do
    return run_command(importlib.import_module(commands[argv[0]]).main, argv[1:],
                       default=f"mmspec {argv[0]} stopped; it saves nothing, so rerun it to "
                               f"start again")


if __name__ == "__main__":
    sys.exit(main())
