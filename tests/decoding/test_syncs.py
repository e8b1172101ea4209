"""A round reads the device exactly once: counted on the CPU, where every tensor-to-Python conversion
(`.item()`, `int(t)`, `bool(t)`, `.tolist()`, `.cpu()`, data-dependent shapes such as `nonzero` and
boolean indexing) is a point where a GPU run would wait for the device.

The engine's count excludes the drafter's `propose`/`update` and the target's forward (counted
apart and printed with `-s`), and the one read of `Draft.parents` a round makes to learn the tree's
shape, which is a host list's copy when the drafter builds its parents on the CPU (`Draft.chain`
does) and so no device wait.
"""

import importlib

import pytest
import torch
from spec_helpers import tiny_llama
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmspec import ModelDrafter, generate
from mmspec.decoding import static
from mmspec.decoding import tree as tree_module
from mmspec.decoding.tree import build_tree as mmspec_build_tree

engine = importlib.import_module("mmspec.decoding.loop")  # the round loop, which builds the trees

_DISPATCH = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.equal.default",
             "aten.masked_select.default", "aten._unique2.default", "aten.unique_dim.default",
             "aten.unique_consecutive.default"}


class SyncCounter:
    """Counts host syncs per phase; `phase` names where the code runs now."""

    def __init__(self):
        self.counts, self.phase, self.host_shape = {}, "engine", set()

    def hit(self, what):
        key = (self.phase, what)
        self.counts[key] = self.counts.get(key, 0) + 1

    def total(self, phase):
        return sum(n for (p, _), n in self.counts.items() if p == phase)


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in _DISPATCH or (name.startswith("aten.index") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for a in args if isinstance(a, (list, tuple)) for i in a)):
            self.counter.hit(name)
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, counter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("tolist", "cpu", "numpy") and not any(a is t for a in args[:1]
                                                           for t in self.counter.host_shape):
            self.counter.hit(name)
        return func(*args, **(kwargs or {}))


def _phase(counter, name, fn):
    def wrapped(*args, **kwargs):
        before, counter.phase = counter.phase, name
        try:
            out = fn(*args, **kwargs)
        finally:
            counter.phase = before
        return out
    return wrapped


_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("compile", [False, True], ids=["dynamic_cache", "static_cache"])
def test_a_round_reads_the_device_once(do_sample, device, compile, monkeypatch):
    if compile:  # the static path (test_static.py), without the compiler
        monkeypatch.setattr(static, "compiled_forward", lambda target, config: target.__call__)
    count_round_reads(ModelDrafter(tiny_llama(1).to(device), num_tokens=4), device, do_sample,
                      compile, monkeypatch)


@pytest.mark.parametrize("device", ["cpu", _CUDA])
def test_a_tree_round_reads_the_device_once(device, monkeypatch):
    # on the CPU a tree's verification mask sizes its partial lists with a read (free there);
    # pad them as on a GPU: one read a round, and the tokens of the unpadded mask
    monkeypatch.setattr(tree_module, "pads_partials", lambda device: True)
    out = count_round_reads(ModelDrafter(tiny_llama(1).to(device), 4, top_k=2, depth=3), device,
                            False, False, monkeypatch)
    monkeypatch.undo()
    ids = torch.tensor([[5, 9, 11, 4, 7, 3]], device=device)
    plain = generate(tiny_llama(0).to(device), ModelDrafter(tiny_llama(1).to(device), 4, top_k=2,
                                                            depth=3),
                     ids, max_new_tokens=16, do_sample=False, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)


def count_round_reads(drafter, device, do_sample, compile, monkeypatch):
    """`generate` on a tiny Llama with `drafter`; asserts one engine read a round."""
    target = tiny_llama(0).to(device)
    counter = SyncCounter()
    drafter.propose = _phase(counter, "drafter", drafter.propose)
    drafter.update = _phase(counter, "drafter", drafter.update)
    target.forward = _phase(counter, "target", target.forward)
    started = []

    def first_propose(state, propose=drafter.propose):
        if not started:  # the rounds start here: the setup's and prefill's reads are not theirs
            started.append(True)
            counter.counts.clear()
        return propose(state)

    drafter.propose = first_propose

    def build_tree(roots, draft, *args, **kwargs):  # a CPU tensor's copy, no device wait
        assert draft.parents.device.type == "cpu"
        counter.host_shape.add(draft.parents)
        return mmspec_build_tree(roots, draft, *args, **kwargs)

    monkeypatch.setattr(engine, "build_tree", build_tree)
    ids = torch.tensor([[5, 9, 11, 4, 7, 3]], device=device)
    with _Function(counter), _Dispatch(counter):
        out = generate(target, drafter, ids, max_new_tokens=16, do_sample=do_sample,
                       eos_token_id=[], generator=torch.Generator(device).manual_seed(0),
                       compile=compile)
    rounds = out.stats.rounds
    print(f"\n{rounds} rounds; syncs by phase and kind: {counter.counts}")
    assert rounds > 3
    assert counter.total("engine") == rounds, counter.counts  # exactly one read a round
    return out
