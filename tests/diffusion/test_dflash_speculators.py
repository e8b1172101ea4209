"""DFlash drafters in vLLM's speculators layout (`mmspec/diffusion/dflash_speculators.py`):
written as speculators 0.9.0 lays it out, read back to the same drafter."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmspec import DFlashDrafter, generate

from .test_dflash import PROMPT, drafter_for, tiny_qwen3

# every field of DFlashSpeculatorConfig off its default but sample_from_anchor (refused) and
# target_hidden_size (null: the drafter's width): 2 layers (1), blocks of 5 (8), mask 7 (None),
# layers [0, 2] (None), sliding non-causal layers (false), the target's vocabulary (32000)
ODD = dict(kind="DFlashDraftModel", layers=2, block=5, mask=7, layer_ids=[0, 2], sliding=True,
           is_causal=False)


def drafts(drafter, target):
    out = []
    seqs = generate(target, drafter, PROMPT[None], max_new_tokens=20, eos_token_id=[],
                    do_sample=False, on_round=lambda d, r, s: out.append(d.tokens[0].clone()))
    return seqs.sequences[0], out


def test_round_trip_keeps_config_and_drafts(tmp_path):
    target = tiny_qwen3(0, layers=4)
    drafter, raw, _ = drafter_for(tmp_path, target, **ODD)
    path = drafter.save_pretrained(tmp_path / "spec", format="speculators", verifier="org/t")
    fields = json.loads((path / "config.json").read_text())
    assert fields["speculators_model_type"] == "dflash"
    assert fields["speculators_version"] == "0.9.0"
    assert fields["aux_hidden_state_layer_ids"] == [1, 3]  # hidden_states entries
    assert (fields["block_size"], fields["mask_token_id"]) == (5, 7)
    assert fields["sliding_window_non_causal"] is True
    assert fields["draft_vocab_size"] == fields["transformer_layer_config"]["vocab_size"]
    assert fields["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert fields["speculators_config"]["verifier"]["name_or_path"] == "org/t"
    assert "dflash_config" not in fields["transformer_layer_config"]
    names = set(load_file(str(path / "model.safetensors")))
    assert names == {k for k in drafter.model.state_dict() if "rotary_emb" not in k}

    back = DFlashDrafter.from_pretrained(path, target)
    assert back.config == drafter.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "layer_types", "sliding_window",
                "rms_norm_eps", "rope_parameters", "vocab_size"):
        assert back.raw_config[key] == raw[key], key
    ours, theirs = drafts(drafter, target), drafts(back, target)
    assert torch.equal(ours[0], theirs[0]) and len(ours[1]) == len(theirs[1]) > 3
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))
    # and back to their layout: the same folder as the drafter writes directly
    back.save_pretrained(tmp_path / "zlab")
    assert DFlashDrafter.from_pretrained(tmp_path / "zlab", target).config == drafter.config


def test_release_07_copies_of_the_verifier_weights_load_when_they_are_the_targets(tmp_path):
    target = tiny_qwen3(0, layers=4)
    drafter, _, _ = drafter_for(tmp_path, target, **ODD)
    path = drafter.save_pretrained(tmp_path / "spec", format="speculators")
    state = load_file(str(path / "model.safetensors"))
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    state["lm_head.weight"] = target.get_output_embeddings().weight.detach().clone()
    save_file(state, str(path / "model.safetensors"))
    assert DFlashDrafter.from_pretrained(path, target).config == drafter.config
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"^path: .*its lm_head.weight is not the target's"):
        DFlashDrafter.from_pretrained(path, target)


def one_line(err) -> str:
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("kw, words", [
    (dict(kind="DFlash2DraftModel", layer_ids=[0, 2]), "this one is a DFlash2DraftModel"),
    (dict(kind="DFlashDraftModel", layer_ids=[0, 2], input_embedding_scale=2.0),
     "input_embedding_scale"),
    (dict(kind="DFlashDraftModel", layer_ids=[0, 2], is_causal=True), "causal [True, True]"),
    (dict(kind="DFlashDraftModel", layer_ids=[0, 3]), "last layer (3)"),
])
def test_what_the_format_cannot_say_is_refused_on_export(tmp_path, kw, words):
    target = tiny_qwen3(0, layers=4)
    drafter, _, _ = drafter_for(tmp_path, target, **kw)
    with pytest.raises(ValueError) as err:
        drafter.save_pretrained(tmp_path / "spec", format="speculators")
    assert one_line(err).startswith("format: 'speculators'") and words in one_line(err)
    assert not (tmp_path / "spec").exists()
    with pytest.raises(ValueError, match="format must be 'dflash' or 'speculators', got 'vllm'"):
        drafter.save_pretrained(tmp_path / "spec", format="vllm")


@pytest.mark.parametrize("change, words", [
    (dict(sample_from_anchor=True), "sample_from_anchor is true"),
    (dict(draft_vocab_size=16), "draft_vocab_size 16 differs from the target's vocab_size"),
    (dict(target_hidden_size=64), "target_hidden_size 64 differs"),
    (dict(aux_hidden_state_layer_ids=[0, 3]), "aux_hidden_state_layer_ids must be a list of ints"),
    (dict(speculators_model_type="dflash2"), "speculators_model_type must be 'dflash'"),
])
def test_what_mmspec_cannot_draft_is_refused_on_load(tmp_path, change, words):
    target = tiny_qwen3(0, layers=4)
    drafter, _, _ = drafter_for(tmp_path, target, **ODD)
    path = drafter.save_pretrained(tmp_path / "spec", format="speculators")
    fields = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**fields, **change}))
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(path, target)
    assert words in one_line(err)


def test_a_layer_config_written_as_a_diff_loads(tmp_path):
    """speculators writes `transformer_layer_config` as the diff against `Qwen3Config()`; the
    fields left out are that default's. Causal sliding layers: `sliding_window_non_causal` false."""
    from transformers import Qwen3Config

    target = tiny_qwen3(0, layers=4)
    drafter, _, _ = drafter_for(tmp_path, target, **{**ODD, "is_causal": None})
    path = drafter.save_pretrained(tmp_path / "spec", format="speculators")
    fields = json.loads((path / "config.json").read_text())
    assert fields["sliding_window_non_causal"] is False
    default = Qwen3Config().to_dict()
    layer = {k: v for k, v in fields["transformer_layer_config"].items()
             if k not in default or default[k] != v}
    assert "attention_bias" not in layer and "hidden_act" not in layer  # left to the default
    (path / "config.json").write_text(json.dumps({**fields, "transformer_layer_config": layer}))
    back = DFlashDrafter.from_pretrained(path, target)
    assert back.config == drafter.config
    assert all(torch.equal(a, b) for a, b in zip(drafts(drafter, target)[1],
                                                  drafts(back, target)[1]))


def test_a_layer_config_without_layer_types_takes_them_from_its_layer_count(tmp_path):
    """Written by a transformers without `layer_types`: not the default config's 36 layers."""
    target = tiny_qwen3(0, layers=4)
    drafter, _, _ = drafter_for(tmp_path, target, kind="DFlashDraftModel", layer_ids=[0, 2],
                                is_causal=None)
    path = drafter.save_pretrained(tmp_path / "spec", format="speculators")
    fields = json.loads((path / "config.json").read_text())
    layer = {k: v for k, v in fields["transformer_layer_config"].items()
             if k not in ("layer_types", "sliding_window")}
    (path / "config.json").write_text(json.dumps({**fields, "transformer_layer_config": layer}))
    assert DFlashDrafter.from_pretrained(path, target).config == drafter.config
