"""DFlash folders that do not fit: one line naming both sides, before anything runs."""

import json

import pytest
import torch

from mmspec import DFlashDrafter, UnsupportedTarget, generate

from .dflash_reference import dflash_raw_config, random_state, write_checkpoint
from .test_dflash import tiny_llama, tiny_qwen3


def folder(tmp_path, target, drop=(), **kw):
    raw = dflash_raw_config(target, **kw)
    state = {k: v for k, v in random_state(raw).items() if not k.startswith(drop)}
    return write_checkpoint(tmp_path / "ckpt", raw, state)


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_layer_ids_beyond_the_target_name_both(tmp_path):
    path = folder(tmp_path, tiny_qwen3(0, layers=3), layer_ids=[0, 2])
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0, layers=2))
    assert "target layers [0, 2] of a 3-layer target" in one_line(err)
    assert "Qwen3ForCausalLM has 2 layers" in one_line(err)


def test_a_checkpoint_for_a_deeper_target_is_refused_even_when_its_ids_fit(tmp_path):
    path = folder(tmp_path, tiny_qwen3(0, layers=3), layer_ids=[0, 1])
    with pytest.raises(ValueError, match="of a 3-layer target, but the target Qwen3ForCausalLM "
                                         "has 2 layers"):
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0, layers=2))


def test_hidden_size_of_another_target_names_both(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    path = folder(tmp_path, tiny_llama(0))
    wide = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=64, intermediate_size=64,
                                        num_hidden_layers=3, num_attention_heads=4,
                                        num_key_value_heads=2))
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(path, wide)
    assert "hidden_size 32, but the target LlamaForCausalLM has hidden_size 64" in one_line(err)


def test_dflash2_without_its_proposal_weights(tmp_path):
    path = folder(tmp_path, tiny_qwen3(0), drop=("candidate_selector.",))
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0))
    assert "DFlash2DraftModel checkpoint without its proposal weights" in one_line(err)


def test_loading_is_strict(tmp_path):
    path = folder(tmp_path, tiny_qwen3(0), kind="DFlashDraftModel", drop=("layers.1.mlp.up",))
    with pytest.raises(ValueError, match=r"missing \['layers.1.mlp.up_proj.weight'\]"):
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0))
    # a DFlash folder holding DFlash2's extra tensors is not read as DFlash
    raw = dflash_raw_config(tiny_qwen3(0))
    state = random_state(raw)
    raw["architectures"] = ["DFlashDraftModel"]
    write_checkpoint(tmp_path / "two", raw, state)
    with pytest.raises(ValueError, match="unexpected"):
        DFlashDrafter.from_pretrained(tmp_path / "two", tiny_qwen3(0))


def test_other_architectures_and_missing_mask_token(tmp_path):
    path = folder(tmp_path, tiny_qwen3(0))
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=r"architectures \['LlamaForCausalLM'\], expected one of"):
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0))
    del raw["dflash_config"]["mask_token_id"]
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="no mask_token_id"):
        DFlashDrafter.from_pretrained(path, tiny_qwen3(0))


def test_the_default_layer_ids_are_theirs(tmp_path):
    # their build_target_layer_ids: [L // 2] for one draft layer, else spread over [1, L - 3]
    from mmspec.diffusion.dflash_checkpoint import build_target_layer_ids

    assert build_target_layer_ids(24, 1) == [12]
    assert build_target_layer_ids(64, 2) == [1, 61]
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B-DFlash-b16's ids
    target = tiny_qwen3(0, layers=8)
    raw = dflash_raw_config(target, layers=3)
    del raw["dflash_config"]["target_layer_ids"]
    write_checkpoint(tmp_path / "d", raw, random_state({**raw, "dflash_config": {
        **raw["dflash_config"], "target_layer_ids": [1, 3, 5]}}))
    drafter = DFlashDrafter.from_pretrained(tmp_path / "d", target)
    assert drafter.config.target_layer_ids == (1, 3, 5)
    assert drafter.target_hidden_layers == (2, 4, 6)


def test_another_target_instance_is_refused(tmp_path):
    drafter = DFlashDrafter.from_pretrained(folder(tmp_path, tiny_qwen3(0)), tiny_qwen3(0))
    with pytest.raises(ValueError, match="loaded for another Qwen3ForCausalLM"):
        generate(tiny_qwen3(0), drafter, torch.tensor([[3, 4]]), max_new_tokens=4)


def test_targets_whose_embeddings_or_hidden_states_do_not_fit_are_named(tmp_path):
    """From the architecture sweep: RemBERT embeds 256 wide below a 64-wide model (refused at
    load); Qwen4Exp's hidden states are wider than its hidden_size (refused by the engine after
    the prefill's forward, before the first token, one line; `tests/decoding/test_hidden.py`)."""
    from tests.decoding import arch_sweep

    rembert = arch_sweep.build("rembert")
    raw = dflash_raw_config(rembert, mask=5, layer_ids=[0, 1])
    write_checkpoint(tmp_path / "r", raw, random_state(raw))
    with pytest.raises(ValueError) as err:
        DFlashDrafter.from_pretrained(tmp_path / "r", rembert)
    assert "hidden_size 64 and embeddings 256 wide" in one_line(err)
    exp = arch_sweep.build("qwen4_exp_text")
    raw = dflash_raw_config(exp, mask=5, layer_ids=[0, 1])
    drafter = DFlashDrafter.from_pretrained(write_checkpoint(tmp_path / "q", raw,
                                                             random_state(raw)), exp)
    with pytest.raises(UnsupportedTarget) as err:
        generate(exp, drafter, arch_sweep.PROMPTS[:1], max_new_tokens=4, pad_token_id=0)
    assert ("Qwen4ExpForCausalLM: its hidden_states entry 1 is [1, 11, 256], but the drafter "
            "(target_hidden_layers [1, 2]) reads [batch, prompt tokens, width] = [1, 11, 64]"
            in one_line(err))
