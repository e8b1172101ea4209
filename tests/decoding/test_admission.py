"""The engine's admission (issue 29): the probe before the first token, and its refusals."""

import pytest
import torch

import arch_sweep

import mmspec
from mmspec import UnsupportedTarget
from mmspec.decoding import ModelDrafter, admission


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


def test_a_model_that_ignores_position_ids_gets_no_trees_and_no_batches():
    """BART's decoder counts positions in cache slots: a tree node or a row with holes would sit
    at the wrong position. Chains on one row stay exact."""
    model = arch_sweep.build("bart")
    probe = admission.probe(model, arch_sweep.PROMPTS[:1], arch_sweep.MASK[:1], ())
    assert probe.tree_mode is None and not probe.holes
    with pytest.raises(UnsupportedTarget, match="draft tree"):
        _call(model, ModelDrafter(model, num_tokens=4, top_k=2))
    with pytest.raises(UnsupportedTarget, match="one prompt per call"):
        _call(model, mmspec.PromptLookupDrafter(), b=2)


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


def test_the_probe_runs_once_per_model(monkeypatch):
    model = arch_sweep.build("llama")
    calls = []
    real = admission._measure
    monkeypatch.setattr(admission, "_measure", lambda *a: calls.append(1) or real(*a))
    for _ in range(2):
        _call(model, mmspec.PromptLookupDrafter())
    assert len(calls) == 1
