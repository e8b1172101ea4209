"""Print the mask builders' examples: `python -m mmspec.kernels.masks [causal|prefix_block|tree]`
(all three without a name). One entry point for the package: `python -m
mmspec.kernels.masks.tree` would run tree.py a second time after the package imported it (Python
warns so)."""

import argparse

from . import causal, prefix_block, tree

BUILDERS = {"causal": causal.main, "prefix_block": prefix_block.main, "tree": tree.main}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mmspec.kernels.masks",
                                     description="print a mask builder's example mask")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"one or more of {', '.join(BUILDERS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BUILDERS]
    if unknown:
        parser.error(f"NAME must be one of {', '.join(BUILDERS)}, got {', '.join(unknown)}")
    print("Block pictures: a character per block of the mask (block_size in the line above):\n"
          "█ every query attends every key of the block, ░ some do, ' ' none (skipped).")
    for name in args.names or BUILDERS:
        print(f"== {name} ==")
        BUILDERS[name]()


if __name__ == "__main__":
    main()
