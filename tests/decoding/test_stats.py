"""`SpecStats` says where a round's time goes: the engine's own work (tree and mask building,
verification, the KV commit) is `engine_time`, never the target's `target_forward_time`."""

import importlib
import time

import torch
from spec_helpers import RandomDrafter, VOCAB, tiny_llama

from mmspec import generate
engine = importlib.import_module("mmspec.decoding.verifier")  # builds the eager tree masks

DELAY = 0.02  # seconds added to every tree-mask build


def test_tree_mask_build_is_engine_time(monkeypatch):
    real, calls = engine.verify_mask, []

    def slow_mask(*args, **kwargs):
        calls.append(1)
        time.sleep(DELAY)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "verify_mask", slow_mask)
    target = tiny_llama()
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    stats = generate(target, RandomDrafter(num_tokens=6), ids, max_new_tokens=8,
                     eos_token_id=[]).stats
    built = len(calls) * DELAY  # a round whose draft is a chain (or empty) builds no mask
    assert len(calls) >= 2
    # the sleeps land in the engine's share; a forward of this tiny model takes well under them
    assert stats.engine_time >= built
    assert stats.target_forward_time < built
