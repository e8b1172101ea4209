"""The engine's own work per round in operations, not seconds (issue 42 item 5): each torch op that
`mmspec.generate` dispatches in its rounds, outside the drafter's calls and the target's forward,
counted on the CPU with a `TorchDispatchMode`. On a GPU each op that is not a view is a kernel
launch, so this count is what the round pays on a GPU's host whatever the target's size, and what
a compiled round (`compile=True`, one graph) removes. The device-to-host reads are counted too
(`aten._local_scalar_dense` and the host copies a `.tolist()` makes, less the copy of
`Draft.parents`, a host tensor that drafters build on the CPU; tests/decoding/test_syncs.py
asserts one per round).

Target: a random 8-layer Llama (hidden 512, fp32, the engine_overhead benchmark's), drafts of fixed
shape with random tokens (every round runs the whole draft-verify-commit path), batch 1, a
64-token prompt; the static-cache rows run `compile=True`'s path without the compiler (the
verification forward eager), as tests/decoding/test_syncs.py does.

    python benchmarks/engine_launches.py [--write] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_overhead import FixedShapeDrafter, small_llama  # noqa: E402
from benchmarks.report import markdown_table, write_section  # noqa: E402
from mmspec import generate  # noqa: E402
from mmspec.decoding import static  # noqa: E402

engine = importlib.import_module("mmspec.decoding.loop")  # the round loop: its build_tree is wrapped

# `aten.item` is what `int(t)` / `.item()` dispatch under `torch.inference_mode` (main runs
# there), `aten._local_scalar_dense` what they dispatch elsewhere
_READS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.nonzero.default",
          "aten.equal.default", "aten.masked_select.default"}


class OpCounter(TorchDispatchMode):
    """Ops by phase ("engine", "drafter", "target"): all of them, those that launch a kernel on
    a GPU (not views), and the reads of the device."""

    def __init__(self):
        super().__init__()
        self.phase = "engine"
        self.ops, self.launches, self.reads = {}, {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for counts, hit in ((self.ops, True),
                            (self.launches, not func.is_view and str(func) not in _READS),
                            (self.reads, str(func) in _READS)):
            if hit:
                counts[self.phase] = counts.get(self.phase, 0) + 1
        return func(*args, **(kwargs or {}))

    def clear(self):
        self.ops, self.launches, self.reads = {}, {}, {}


def _in_phase(counter: OpCounter, name: str, fn):
    def wrapped(*args, **kwargs):
        before, counter.phase = counter.phase, name
        try:
            return fn(*args, **kwargs)
        finally:
            counter.phase = before
    return wrapped


class _HostCopies(torch.overrides.TorchFunctionMode):
    """`.tolist()`, `.cpu()`, `.numpy()`: device reads that dispatch no aten op of their own."""

    def __init__(self, counter: OpCounter):
        super().__init__()
        self.counter, self.host = counter, []  # `Draft.parents` of each round: a host tensor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        host = args and any(args[0] is t for t in self.host)
        if getattr(func, "__name__", "") in ("tolist", "cpu", "numpy") and not host:
            reads = self.counter.reads
            reads[self.counter.phase] = reads.get(self.counter.phase, 0) + 1
        return func(*args, **(kwargs or {}))


def count_round_ops(target, drafter, ids, new_tokens: int, do_sample: bool,
                    compile: bool = False) -> dict:
    """Per round of one `generate` call: ops, launches and reads of each phase (the prefill and
    setup before the first `propose` not counted), and the rounds. The call counted is the
    second of two alike: the engine keeps what a tree shape needs on the device from call to
    call (`tree._shape_tensors`, ...), so the first call's rounds pay for what every later
    call's rounds reuse."""
    counter = OpCounter()
    propose, update, forward = drafter.propose, drafter.update, target.forward
    started = []

    def first_propose(state):
        if not started:  # the rounds start here
            started.append(True)
            counter.clear()
        return _in_phase(counter, "drafter", propose)(state)

    drafter.propose, drafter.update = first_propose, _in_phase(counter, "drafter", update)
    target.forward = _in_phase(counter, "target", forward)
    real_compiled, real_build_tree = static.compiled_forward, engine.build_tree
    if compile:  # the static path, its forward eager (no compiler on the count)
        static.compiled_forward = lambda model, config: model.__call__
    copies = _HostCopies(counter)

    def build_tree(roots, draft, *args, **kwargs):
        copies.host.append(draft.parents)
        return real_build_tree(roots, draft, *args, **kwargs)

    engine.build_tree = build_tree
    try:
        with copies, counter:
            for _ in range(2):  # the counter clears at the first `propose` of each call
                started.clear()
                out = generate(target, drafter, ids, max_new_tokens=new_tokens,
                               do_sample=do_sample, eos_token_id=[], pad_token_id=0,
                               compile=compile, generator=torch.Generator().manual_seed(0))
    finally:
        static.compiled_forward, engine.build_tree = real_compiled, real_build_tree
        drafter.propose, drafter.update = propose, update
        del target.forward  # back to the class's
    rounds = out.stats.rounds
    return {"rounds": rounds,
            **{f"{kind}_{phase}": getattr(counter, kind).get(phase, 0) / rounds
               for kind in ("ops", "launches", "reads") for phase in ("engine", "target")}}


CASES = (("chain of 5", dict(n=5), False, False), ("tree of 16, 4 wide", dict(n=16, width=4),
                                                   False, False),
         ("chain of 5, sampled", dict(n=5), True, False),
         ("tree of 16, 4 wide, sampled", dict(n=16, width=4), True, False),
         ("chain of 5, static cache", dict(n=5), False, True),
         ("tree of 16, 4 wide, static cache", dict(n=16, width=4), False, True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    target = small_llama()
    ids = torch.randint(3, 32000, (1, 64), generator=torch.Generator().manual_seed(1))
    rows = []
    with torch.inference_mode():
        for name, shape, do_sample, compile in CASES:
            r = count_round_ops(target, FixedShapeDrafter(**shape), ids, args.new_tokens,
                                do_sample, compile)
            rows.append([name, r["rounds"], f"{r['ops_engine']:.1f}", f"{r['launches_engine']:.1f}",
                         f"{r['reads_engine']:.2f}", f"{r['launches_target']:.1f}",
                         f"{100 * r['launches_engine'] / r['launches_target']:.0f}%"])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)
    body = (
        "Per round of `mmspec.generate`, outside the drafter's calls and the target's forward: "
        "the torch ops the engine dispatches (counted with a `TorchDispatchMode` on the CPU), "
        "those that are no view (each a kernel launch on a GPU), and its reads of the device; "
        "the target's verification forward's launches beside them. Target: random Llama, 8 "
        f"layers, hidden 512, fp32, a 64-token prompt, {args.new_tokens} new tokens, batch 1; "
        "random drafts of fixed shape (every round runs the whole path); the second of two "
        "calls alike is counted (the first makes the device tensors of each tree shape, which "
        "later calls reuse). Static cache: "
        "`compile=True`'s path with the forward left eager. A launch costs the host some "
        "microseconds on a GPU whatever the target's size, so at a 7B target's ~20 ms forward "
        "the engine's launches are its share of a round that CUDA graphs of the whole round "
        "would remove; a 32-layer target has about four times the target launches here. The "
        "static cache's engine rows include the commit's write of each layer's cache (one launch "
        "a layer; tests/benchmarks/test_engine_launches_bench.py).\n\n"
        + markdown_table(["draft", "rounds", "engine ops / round", "engine launches / round",
                          "engine device reads / round", "target forward launches / round",
                          "engine launches / target launches"], rows) + "\n")
    print(body)
    if args.write:
        write_section("engine_launches", "The engine's own work per round, in launches "
                      "(`benchmarks/engine_launches.py`)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
