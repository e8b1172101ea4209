"""`mmspec kernels`: the block-sparse attention layer's tools.

    mmspec kernels tune [options]    measure backend="auto"'s timing table on this machine
                                     (`python -m mmspec.kernels.tune -h` for the options)
"""

from __future__ import annotations


def main(argv=None) -> int:
    argv = list(argv or [])
    if not argv or argv[0] != "tune":
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown kernels command {argv[0]!r}; expected 'tune'")
            return 2
        return 0
    from mmspec.kernels import tune

    return tune.main(argv[1:])
