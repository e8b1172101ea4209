"""`mmspec kernels tune` (`python -m mmspec.kernels.tune`): measure `backend="auto"`'s timing table on this machine.

Every registered backend that accepts the inputs is timed side by side on random
block masks, per dtype, head dim and density, and the table (`backends/timings.py`) is written to
the per-machine cache beside the CPU kernel's build. `auto` reads it from then on. Left out: the
dense `"reference"` (the readable definition, for tests), and off CUDA Triton's interpreter and
FlexAttention's eager path, which are comparators for tests, not ways to run a model (eager flex
materialises every score: ~10x the torch backend's time on a 2-core CPU at N=1024).

    python -m mmspec.kernels.tune                      # this machine's default device: a GPU if any
    python -m mmspec.kernels.tune --device cpu         # a few seconds
    python -m mmspec.kernels.tune --from-points P.json # convert benchmarks/kernels.py --points
    python -m mmspec.kernels.tune --show               # print the table in use

Defaults: on CUDA bf16, N=16384, H=16, 128-token blocks, D 64 and 128, densities 1 to 0.05; on
the CPU fp32, N=1024, H=4, 64-token blocks, D 64 and 128, densities 1, 0.25 and 0.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from .attention import block_sparse_attention
from .backends import timings
from .backends.registry import available_backends, get_backend
from .mask import BlockSparseMask

_NOT_TUNED = {"reference"}
# off CUDA: the Triton kernels' interpreter, and the eager comparator
_GPU_ONLY = {"triton", "triton-tma", "triton-tma-persistent", "flex"}


def random_block_mask(heads: int, n: int, block: int, density: float, device,
                      seed: int = 0) -> BlockSparseMask:
    """The same number of random kept key blocks in every query block's row, per head."""
    g = torch.Generator().manual_seed(seed)
    nb = n // block
    keep = max(1, round(density * nb))
    order = torch.rand(1, heads, nb, nb, generator=g).argsort(-1)[..., :keep]
    blocks = torch.zeros(1, heads, nb, nb, dtype=torch.bool).scatter_(-1, order, True)
    return BlockSparseMask.from_dense(blocks.to(device), block, n, n)


def candidates(device: torch.device) -> list[str]:
    skip = _NOT_TUNED | (_GPU_ONLY if device.type != "cuda" else set())
    return [name for name in available_backends() if name not in skip]


def timed(fn, repeats: int, sync=lambda: None, reduce=statistics.median) -> float:
    """Seconds per call of `fn`: `reduce` (median; `min` where the machine is shared and the
    fastest call is the least noisy estimate) of `repeats` calls after one warm-up call (compiles,
    plans, builds). `sync` waits for a GPU's queued work. The benchmarks time with it too."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return reduce(times)


def measure(device, dtypes, head_dims, densities, n: int, heads: int, block: int,
            repeats: int, log=print) -> list[dict]:
    """One table entry per (dtype, head dim, density): ms of every backend that ran."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    name = timings.device_name(device)
    entries = []
    for dtype in dtypes:
        for d in head_dims:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, heads, n, d, generator=g).to(device, dtype)
                       for _ in range(3))
            for density in densities:
                mask = random_block_mask(heads, n, block, density, device)
                ms = {}
                for backend in candidates(device):
                    problems = get_backend(backend).problems(q, k, v, mask)
                    if problems:
                        log(f"  {backend}: skipped ({'; '.join(problems)})")
                        continue
                    try:
                        ms[backend] = 1e3 * timed(
                            lambda b=backend: block_sparse_attention(q, k, v, mask, backend=b),
                            repeats, sync)
                    except Exception as err:  # a compile or plan failure: not a candidate here
                        log(f"  {backend}: failed ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:120] if str(err) else ''})")
                if ms:
                    entry = {"device": name, "dtype": str(dtype).removeprefix("torch."),
                             "head_dim": d, "density": mask.density(), "ms": ms}
                    entries.append(entry)
                    log(f"{entry['dtype']} D={d} density {entry['density']:.3f}: "
                        + ", ".join(f"{b} {t:.3f} ms" for b, t in sorted(ms.items(),
                                                                       key=lambda x: x[1])))
    return entries


def from_points(data: dict) -> list[dict]:
    """Table entries from `benchmarks/kernels.py --gpu-only --points` (bf16 unless a point names
    its dtype); points where no backend ran are left out."""
    if not isinstance(data, dict) or not isinstance(data.get("points"), list) or not isinstance(
            data.get("device"), str):
        raise ValueError(f"points must be {{'device': name, 'points': [...]}}, got "
                         f"{str(data)[:100]}")
    return [{"device": data["device"], "dtype": p.get("dtype", "bfloat16"),
             "head_dim": p["head_dim"], "density": p["density"], "ms": p["backends_ms"]}
            for p in data["points"] if p.get("backends_ms")]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mmspec.kernels.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--from-points", default=None, metavar="P.json",
                        help="convert measured points instead of measuring")
    parser.add_argument("--out", default=None,
                        help=f"write here instead of the cache ({timings.TABLE_NAME} in torch's "
                             f"extension folder)")
    parser.add_argument("--show", action="store_true", help="print the table in use and exit")
    parser.add_argument("--dtypes", default=None, help="comma-separated, e.g. bfloat16,float16")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--densities", default=None)
    parser.add_argument("--n", type=int, default=None, help="tokens (q and kv)")
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.show:
        path = timings.table_path()
        print(path.read_text() if path.is_file() else f"no table at {path}")
        return 0
    if args.from_points:
        try:
            with open(args.from_points) as f:
                entries = from_points(json.load(f))
        except (OSError, ValueError, KeyError) as err:
            parser.error(f"--from-points {args.from_points}: {err}")
    else:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda needs a CUDA device; none is visible")
        gpu = device.type == "cuda"
        try:
            dtypes = [timings._DTYPES[s] for s in (args.dtypes or (
                "bfloat16" if gpu else "float32")).split(",")]
        except KeyError as err:
            parser.error(f"--dtypes must name {sorted(timings._DTYPES)}, got {err}")
        densities = [float(x) for x in (args.densities or (
            "1,0.5,0.25,0.1,0.05" if gpu else "1,0.25,0.1")).split(",")]
        entries = measure(device, dtypes, [int(x) for x in args.head_dims.split(",")], densities,
                          n=args.n or (16384 if gpu else 1024), heads=args.heads or (16 if gpu else 4),
                          block=args.block or (128 if gpu else 64),
                          repeats=args.repeats or (10 if gpu else 3))
    if not entries:
        print("no backend ran: nothing to write", file=sys.stderr)
        return 1
    path = timings.write_table(entries, args.out)
    print(f"wrote {len(entries)} entries to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
