"""benchmarks/engine_launches.py: the ops a round of `generate` dispatches, by phase, on the CPU."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.engine_launches import count_round_ops  # noqa: E402
from benchmarks.engine_overhead import FixedShapeDrafter  # noqa: E402


def _llama(layers):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)).eval()


@pytest.mark.parametrize("compile", [False, True], ids=["dynamic_cache", "static_cache"])
def test_the_engine_count_is_its_own_and_one_read_a_round(compile):
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    counts = {layers: count_round_ops(_llama(layers), FixedShapeDrafter(4, vocab=256), ids, 12,
                                      do_sample=False, compile=compile) for layers in (1, 3)}
    one, three = counts[1], counts[3]
    assert one["rounds"] == three["rounds"] > 3  # random drafts: the same rounds either way
    # the target's launches grow with its layers, the engine's by at most one a layer (the
    # static cache's commit writes each layer's cache): the phases are apart
    assert three["launches_target"] > 2 * one["launches_target"] > 0
    grown = three["launches_engine"] - one["launches_engine"]
    assert (grown == 0) if not compile else (0 <= grown <= 2)
    assert one["launches_engine"] > 0
    assert one["ops_engine"] >= one["launches_engine"]
    assert one["reads_engine"] == three["reads_engine"] == 1.0  # tests/decoding/test_syncs.py


@pytest.mark.parametrize("shape", [dict(n=4), dict(n=12, width=3)], ids=["chain", "tree"])
def test_a_sampled_round_costs_the_engine_about_what_a_greedy_one_does(shape):
    """The rejection rule tests every node at once (`verify_sampling`): sampling adds the draws
    and a few launches per rank of siblings, not a loop over the tree's depth times its fan-out
    (which cost 3-4 times the greedy round's launches); the uniforms are one draw, not one per
    (step, rank) (1.35-1.40 times the greedy round's launches when they were)."""
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    greedy, sampled = (count_round_ops(_llama(1), FixedShapeDrafter(**shape, vocab=256), ids, 16,
                                       do_sample=do_sample) for do_sample in (False, True))
    if "width" not in shape:  # a tree's block-sparse mask reads once more (BENCHMARKS.md)
        assert sampled["reads_engine"] == greedy["reads_engine"] == 1.0
    print(f"\nengine launches a round, greedy / sampled: {greedy['launches_engine']:.1f} / "
          f"{sampled['launches_engine']:.1f}")
    assert greedy["launches_engine"] < sampled["launches_engine"] < 1.35 * greedy["launches_engine"]
