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


def _wide_eagle3_state(d, seed=3):
    """An EAGLE-3 head `d` wide (not the target's width) in SafeAILab's names, its embedding
    included (`eagle3_state`'s layout)."""
    from .test_drafter import DRAFT_VOCAB, VOCAB, D, _layer

    g = torch.Generator().manual_seed(seed)
    state = eagle3_state(seed)
    state = {k: v for k, v in state.items() if k in ("d2t", "t2d")}
    state.update({"fc.weight": torch.randn(d, 3 * D, generator=g) * (3 * D) ** -0.5,
                  "norm.weight": 1 + 0.1 * torch.randn(d, generator=g),
                  "lm_head.weight": torch.randn(DRAFT_VOCAB, d, generator=g) * d ** -0.5,
                  "midlayer.hidden_norm.weight": 1 + 0.1 * torch.randn(d, generator=g),
                  "embed_tokens.weight": torch.randn(VOCAB, d, generator=g)})
    state.update(_layer(g, "midlayer.", 2 * d, first_eagle1=False, d=d))
    return state


def test_a_round_trip_keeps_every_config_field(target, tmp_path):
    """A drafter whose every `EagleConfig` field differs from its default (and whose width
    differs from the target's) exported and loaded back has the same config: a field the export
    drops comes back as its default, which a round trip of defaults cannot see."""
    from dataclasses import asdict, fields

    from mmspec.eagle.head import EagleConfig

    tree = dict(depth=3, top_k=2, total_tokens=5)
    config = _config(True, d=48, rms_norm_eps=3e-5, rope_theta=250000.0, hidden_act="gelu",
                     rope_scaling={"type": "linear", "factor": 2.0}, target_hidden_size=32)
    first = EagleDrafter.from_pretrained(write(tmp_path / "safeailab", config,
                                               _wide_eagle3_state(48)), target, **tree)
    path = first.save_pretrained(tmp_path / "spec")  # then other feature layers than the default
    fields_json = json.loads((path / "config.json").read_text())
    fields_json["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
    (path / "config.json").write_text(json.dumps(fields_json))
    before = EagleDrafter.from_pretrained(path, target, **tree)
    after = EagleDrafter.from_pretrained(before.save_pretrained(tmp_path / "again"), target, **tree)
    # fc_bias and qkv_bias are EAGLE-1/2's: the EAGLE-3 head has no biases, the format none
    eagle12_only = {"fc_bias", "qkv_bias"}
    defaults = {f.name: f.default for f in fields(EagleConfig) if f.name not in eagle12_only}
    same_as_default = [k for k, v in defaults.items() if getattr(before.config, k) == v]
    assert not same_as_default, f"fields left at their default: {same_as_default}"
    assert before.config.hidden_size != before.config.target_hidden_size
    want = {k: v for k, v in asdict(before.config).items() if k not in eagle12_only}
    got = {k: v for k, v in asdict(after.config).items() if k not in eagle12_only}
    assert got == want
