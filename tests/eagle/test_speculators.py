"""EAGLE-3 drafters written in the speculators format and loaded back: the folder's layout, the
same drafted chain as the authors' forward (`test_drafter.ref_chain`) and greedy output equal to
`target.generate`. The check against the speculators package itself is
`test_speculators_venv.py` (a separate venv)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from mmspec import EagleDrafter, generate

from .test_drafter import (_config, eagle1_state, eagle3_state, ref_chain, target,  # noqa: F401
                           write)

IDS = torch.tensor([[1, 17, 33, 5, 90, 64, 12, 7]])


def _saved(target, tmp_path, embed=True):
    state = eagle3_state(embed=embed)
    drafter = EagleDrafter.from_pretrained(write(tmp_path / "safeailab", _config(True), state),
                                           target, depth=4, top_k=1, total_tokens=6)
    return drafter, state, drafter.save_pretrained(tmp_path / "spec", verifier="org/tiny-llama")


def _first_chain(target, drafter):
    chains = []
    out = generate(target, drafter, IDS, max_new_tokens=12, eos_token_id=[],
                   on_round=lambda d, r, s: chains.append(d.tokens[0].tolist()))
    return chains[0], out.sequences


@pytest.mark.parametrize("embed", [True, False])
def test_round_trip_drafts_the_authors_chain(target, tmp_path, embed):
    drafter, state, path = _saved(target, tmp_path, embed)
    fields = json.loads((path / "config.json").read_text())
    assert fields["speculators_model_type"] == "eagle3"
    assert fields["transformer_layer_config"]["vocab_size"] == 128
    assert fields["draft_vocab_size"] == 48 and fields["norm_before_residual"] is False
    assert fields["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # 2, L // 2, L - 3 of 8
    assert fields["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    weights = load_file(str(path / "model.safetensors"))
    assert not any(k.startswith("midlayer.") for k in weights)
    assert torch.equal(weights["layers.0.hidden_norm.weight"], state["midlayer.hidden_norm.weight"])
    assert torch.equal(weights["t2d"], state["t2d"]) and torch.equal(weights["d2t"], state["d2t"])

    loaded = EagleDrafter.from_pretrained(path, target, depth=4, top_k=1, total_tokens=6)
    ref = target.generate(IDS, do_sample=False, max_new_tokens=12, eos_token_id=[])
    chain, out = _first_chain(target, loaded)
    assert chain == ref_chain(target, state, ref[0, : IDS.shape[1] + 1], len(chain), True)
    assert chain == _first_chain(target, drafter)[0]
    assert torch.equal(out, ref)


def test_a_folder_without_the_embedding_in_fp16_binds_the_targets(target, tmp_path):
    # the zoo's entries: no embed_tokens.weight (the target's is taken), fp16 on disk
    drafter, state, _ = _saved(target, tmp_path)
    path = drafter.save_pretrained(tmp_path / "small", embedding=False, dtype=torch.float16)
    weights = load_file(str(path / "model.safetensors"))
    assert "embed_tokens.weight" not in weights and weights["d2t"].dtype == torch.long
    assert {v.dtype for k, v in weights.items() if k not in ("d2t", "t2d")} == {torch.float16}
    assert json.loads((path / "config.json").read_text())["torch_dtype"] == "float16"
    assert torch.equal(weights["fc.weight"], state["fc.weight"].half())
    loaded = EagleDrafter.from_pretrained(path, target, depth=4, top_k=1, total_tokens=6)
    assert torch.equal(loaded.embed_weight, target.get_input_embeddings().weight)
    assert not torch.equal(drafter.embed_weight, loaded.embed_weight)  # the folder's own, before
    ref = target.generate(IDS, do_sample=False, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(_first_chain(target, loaded)[1], ref)


def test_the_layer_ids_in_the_config_are_the_features_read(target, tmp_path):
    _, _, path = _saved(target, tmp_path)
    fields = json.loads((path / "config.json").read_text())
    fields["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
    (path / "config.json").write_text(json.dumps(fields))
    loaded = EagleDrafter.from_pretrained(path, target, depth=4, top_k=1, total_tokens=6)
    assert loaded.target_hidden_layers == (1, 3, 6)


def test_what_the_format_cannot_hold_gets_one_line(target, tmp_path):
    eagle1 = EagleDrafter.from_pretrained(write(tmp_path / "e1", _config(False), eagle1_state()),
                                          target)
    with pytest.raises(ValueError, match="EAGLE-3 drafters only.*'eagle'"):
        eagle1.save_pretrained(tmp_path / "out")
    _, _, path = _saved(target, tmp_path)
    good = json.loads((path / "config.json").read_text())
    for change, message in (({"norm_before_fc": True}, "norm_before_fc is true"),
                            ({"speculators_model_type": "mtp"}, "must be 'eagle3'"),
                            ({"eagle_aux_hidden_state_layer_ids": [2, 4, 8]}, r"in \[0, 8\)"),
                            ({"transformer_layer_config": {**good["transformer_layer_config"],
                                                           "attention_bias": True}},
                             "attention_bias is true")):
        (path / "config.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=message):
            EagleDrafter.from_pretrained(path, target)
