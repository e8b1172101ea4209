"""The engine's admission (issue 29): the probe before the first token, and its refusals."""

import pytest
import torch

import arch_sweep

import mmspec
from mmspec import UnsupportedTarget
from mmspec.decoding import ModelDrafter, admission


NEW = arch_sweep.NEW_TOKENS


def _reference(model):
    with torch.no_grad():
        return model.generate(arch_sweep.PROMPTS, attention_mask=arch_sweep.MASK,
                              max_new_tokens=NEW, do_sample=False, pad_token_id=0)


def _call(model, drafter, b=1, new=4):
    return mmspec.generate(model, drafter, arch_sweep.PROMPTS[:b], attention_mask=arch_sweep.MASK[:b],
                           max_new_tokens=new, do_sample=False, pad_token_id=0)


def test_the_guard_refuses_a_switch_that_changes_a_plain_forward(monkeypatch):
    """GPT-OSS's attention sinks live in its eager code: were the switched attention to fall back
    to SDPA (as before issue 29), plain forwards would change, and the probe must refuse."""
    from mmspec.kernels import hf

    model = arch_sweep.build("gpt_oss")
    for module in model.modules():
        if hasattr(module, "sinks"):
            torch.nn.init.normal_(module.sinks, std=3.0)
    monkeypatch.setattr(hf, "_eager_fallback", lambda module: None)
    with pytest.raises(UnsupportedTarget, match="changes a plain forward"):
        _call(model, mmspec.PromptLookupDrafter())


@pytest.mark.parametrize("model_type", ["bart", "marian"])
def test_a_model_counting_positions_in_cache_slots_takes_the_engines(model_type):
    """BART's and Marian's decoders take no `position_ids`: they embed `arange(cache length, ...)`,
    so a tree node would sit at its index among the nodes and a row after a hole one position
    too far. The engine feeds its own positions to their position embeddings
    (`positions.engine_positions`): trees and batches with holes are exact."""
    model = arch_sweep.build(model_type)
    probe = admission.probe(model, arch_sweep.PROMPTS[:1], arch_sweep.MASK[:1], ())
    assert probe.tree_mode == "block_sparse" and probe.holes
    ref = _reference(model)
    tree = _call(model, ModelDrafter(model, num_tokens=6, top_k=2, depth=3), b=1, new=NEW)
    assert torch.equal(tree.sequences, ref[:1]) and tree.stats.accepted >= 4
    holes = _call(model, arch_sweep.OracleChain(ref, arch_sweep.MASK, stagger=True), b=2, new=NEW)
    assert torch.equal(holes.sequences, ref)


@pytest.mark.parametrize("model_type", ["mpt", "gpt_neo"])
def test_rows_commit_alike_where_holes_are_not_exact(model_type):
    """MPT's ALiBi and GPT-Neo's local windows count cache slots, so a hole would move every
    later key: the probe finds holes inexact, and the rows of a batch then commit as many tokens
    as the row that accepted fewest (`loop.even_commit`), leaving no hole. Trees: the main
    path (no tree mask is exact on them either)."""
    model = arch_sweep.build(model_type)
    probe = admission.probe(model, arch_sweep.PROMPTS[:1], arch_sweep.MASK[:1], ())
    assert not probe.holes and probe.tree_mode is None
    ref = _reference(model)
    accepted = []
    out = mmspec.generate(model, arch_sweep.OracleChain(ref, arch_sweep.MASK, stagger=True),
                          arch_sweep.PROMPTS, attention_mask=arch_sweep.MASK, max_new_tokens=NEW,
                          do_sample=False, pad_token_id=0,
                          on_round=lambda d, r, s: accepted.append(r.num_accepted.tolist()))
    assert torch.equal(out.sequences, ref)
    assert all(a == b for a, b in accepted) and len(accepted) >= 3  # the drafts differed by row
    with pytest.warns(UserWarning, match="main path"):
        tree = _call(model, ModelDrafter(model, num_tokens=6, top_k=2, depth=3), b=2, new=NEW)
    assert torch.equal(tree.sequences, ref)


def test_even_commit_cuts_rows_to_the_fewest_accepted():
    from mmspec.decoding.loop import even_commit as _even_commit

    depth, bonus = torch.tensor([1, 3, 0]), torch.tensor([7, 8, 9])
    path = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    live = torch.tensor([True, True, False])  # a finished row does not set the count
    d, bo = _even_commit(depth, bonus, path, live)
    assert d.tolist() == [1, 1, 0] and bo.tolist() == [7, 21, 9]


def test_a_model_bypassing_the_interface_verifies_trees_through_a_4d_mask():
    model = arch_sweep.build("falcon")  # its attention never calls the attention interface
    probe = admission.probe(model, arch_sweep.PROMPTS[:1], arch_sweep.MASK[:1], ())
    assert probe.tree_mode == "dense_4d" and probe.holes
    with torch.no_grad():
        ref = model.generate(arch_sweep.PROMPTS, attention_mask=arch_sweep.MASK,
                             max_new_tokens=8, do_sample=False, pad_token_id=0)
    out = _call(model, ModelDrafter(model, num_tokens=6, top_k=2, depth=3), b=2, new=8)
    assert torch.equal(out.sequences, ref)


def test_dsa_models_are_refused_past_index_topk():
    from transformers import GlmMoeDsaForCausalLM

    config = arch_sweep.tiny_config("glm_moe_dsa")
    config.index_topk = 8
    model = GlmMoeDsaForCausalLM(config).eval()
    with pytest.raises(UnsupportedTarget, match="index_topk"):
        _call(model, mmspec.PromptLookupDrafter())


def test_chunked_attention_is_refused_past_one_chunk():
    """Llama 4's chunked layers attend within blocks of attention_chunk_size slots, verified as
    full causal attention: exact within one block (the first call), a silent difference past it
    (the model's own tokens change with the block size there), so refused with one line."""
    from transformers import Llama4ForCausalLM

    config = arch_sweep.tiny_config("llama4_text")
    config.attention_chunk_size = 16
    torch.manual_seed(0)
    model = Llama4ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    prompt = arch_sweep.PROMPTS[:1]
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(_call(model, mmspec.PromptLookupDrafter(), new=5).sequences, ref)
    with pytest.raises(UnsupportedTarget, match=r"attention_chunk_size.*reaches 23 tokens"):
        _call(model, mmspec.PromptLookupDrafter(), new=12)
    with torch.no_grad():  # the refusal is needed: one block of 8192 gives other tokens
        chunked = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        model.config.attention_chunk_size = 8192
        whole = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert not torch.equal(chunked, whole)


def test_the_probe_runs_once_per_model(monkeypatch):
    model = arch_sweep.build("llama")
    calls = []
    real = admission._measure
    monkeypatch.setattr(admission, "_measure", lambda *a: calls.append(1) or real(*a))
    for _ in range(2):
        _call(model, mmspec.PromptLookupDrafter())
    assert len(calls) == 1


@pytest.mark.parametrize("width,layers,prompt_len", [(64, 2, 11), (48, 1, 5), (32, 1, 24), (48, 1, 1)])
def test_a_forward_that_fails_as_verification_runs_it_is_refused_at_every_shape(
        width, layers, prompt_len):
    """Mamba's mixers multiply the new tokens by the 2-D attention_mask, which covers the cache
    too: every chain verification fails inside transformers. Its one-token steps and multi-token
    forward agree within the probe's tolerance at some shapes (48 wide, one layer), so the probe
    must run the chain as the engine does: refused with one line at every shape, in chains,
    trees and batches, never a traceback from modeling_mamba.py."""
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=arch_sweep.VOCAB, hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=layers, state_size=8, conv_kernel=4, time_step_rank=8,
                         pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    model = MambaForCausalLM(config).eval()
    prompt = (torch.arange(prompt_len) % 20 + 9)[None]
    batch = torch.cat([torch.cat([prompt[:, :1], prompt], 1),  # the second row left-padded
                       torch.cat([torch.zeros_like(prompt[:, :1]), prompt], 1)])
    mask = (batch > 0).long()
    for drafter, ids in ((mmspec.PromptLookupDrafter(), prompt), (mmspec.PromptLookupDrafter(), batch),
                         (ModelDrafter(model, num_tokens=6, top_k=2, depth=3), prompt)):
        with pytest.raises(UnsupportedTarget, match="^MambaForCausalLM: a forward of several new "
                                                    "tokens after its cache[^\n]*$"):
            mmspec.generate(model, drafter, ids, attention_mask=mask[:len(ids), -ids.shape[1]:],
                            max_new_tokens=4, do_sample=False, pad_token_id=0)


def test_a_model_with_its_own_cache_class_is_refused_by_name():
    """xLSTM keeps an xLSTMCache, not a transformers Cache: the engine's probe handed it a
    DynamicCache (AttributeError: no rnn_state); refused with one line naming the class."""
    model = arch_sweep.build("xlstm")
    for drafter in (mmspec.PromptLookupDrafter(), ModelDrafter(model, num_tokens=4, top_k=1)):
        with pytest.raises(UnsupportedTarget, match="^xLSTMForCausalLM returns a xLSTMCache"):
            _call(model, drafter)
