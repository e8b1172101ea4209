"""Reading a SafeAILab EAGLE checkpoint folder: config.json + weights, which layout, checks.

The folder is what `EaModel.from_pretrained(ea_model_path=...)` reads (SafeAILab/EAGLE
`eagle/model/ea_model.py`): `config.json` (an `EConfig`, i.e. Llama config fields, plus `bias`,
`draft_vocab_size`, `target_hidden_size` where set) and the weights as `model.safetensors` or
`pytorch_model.bin`. The reference picks the architecture with a caller's flag (`use_eagle3`);
here the keys decide: `midlayer.*` is EAGLE-3, `layers.0.*` EAGLE-1/2.

EAGLE-3 feature layers: the reference's patched target (`modeling_llama_kv.py`) keeps the inputs
of decoder layers 2, L // 2 and L - 3 (in layer order, each once), i.e. entries 2, L // 2, L - 3
of transformers' `hidden_states` tuple, un-normed.

Deliberate differences: the reference loads with `strict=False` (a missing `fc.bias` would stay
random, a stray key is ignored); here every expected key must be present and none unexpected,
`embed_tokens.weight` and `t2d` excepted. A `.bin` is read with `weights_only=True`. A
`rope_scaling` other than linear is refused rather than approximated.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers.activations import ACT2FN

from .head import EagleConfig

CONFIG_NAME = "config.json"
WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
OPTIONAL_KEYS = ("embed_tokens.weight", "t2d")  # taken from the target / unused when drafting


def read_weights(path: Path) -> dict:
    """The state dict in `path` (model.safetensors preferred over pytorch_model.bin)."""
    for name in WEIGHT_NAMES:
        file = path / name
        if not file.is_file():
            continue
        if name.endswith(".safetensors"):
            try:
                return load_file(str(file))
            except SafetensorError as err:
                raise ValueError(f"path: {file} is not a safetensors file ({err})") from None
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            first = str(err).strip().splitlines()[0]
            raise ValueError(f"path: {file} needs unpickling of more than tensors, which "
                             f"weights_only=True refuses ({first})") from None
        if not isinstance(state, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            raise ValueError(f"path: {file} holds a {type(state).__name__}, not a state dict of "
                             f"named tensors")
        return state
    raise FileNotFoundError(f"path: no {' or '.join(WEIGHT_NAMES)} in {path}")


def read_config(path: Path) -> dict:
    file = path / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"path: no {CONFIG_NAME} in {path}")
    try:
        fields = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"path: {file} is not JSON ({err})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"path: {file} is not a config (a JSON object of its fields)")
    return fields


def detect_arch(state: dict, where: Path) -> str:
    if any(k.startswith("midlayer.") for k in state):
        return "eagle3"
    if any(k.startswith("layers.0.") for k in state):
        return "eagle"
    hint = " (a ViSpec checkpoint: load it with ViSpecDrafter)" if any(
        k.startswith(("imadpt.", "img_fc.")) for k in state) else ""
    keys = sorted(state)
    raise ValueError(f"path: the weights in {where} are in no known EAGLE layout: expected "
                     f"midlayer.* (EAGLE-3) or layers.0.* (EAGLE-1/2), got keys "
                     f"{keys[:4]}{' ...' if len(keys) > 4 else ''}{hint}")


def eagle3_feature_layers(num_layers: int) -> tuple:
    """`hidden_states` entries the reference's target hands EAGLE-3 (module docstring)."""
    layers = tuple(sorted({2, num_layers // 2, num_layers - 3}))
    if len(layers) != 3 or layers[0] < 1:
        raise ValueError(f"target: EAGLE-3 reads the inputs of layers 2, L//2 and L-3, three "
                         f"distinct layers, which a target of {num_layers} layers does not have")
    return layers


def _int(fields: dict, name: str, where: Path, default=None) -> int:
    value = fields.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"path: {where / CONFIG_NAME}: {name} must be an int >= 1, got {value!r}")
    return value


def _rope_factor(fields: dict, where: Path) -> float:
    scaling = fields.get("rope_scaling")
    if scaling is None:
        return 1.0
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    if kind != "linear":
        raise ValueError(f"path: {where / CONFIG_NAME}: rope_scaling must be null or linear "
                         f"(the reference also knows 'dynamic', which mmspec does not load), "
                         f"got {scaling!r}")
    return float(scaling["factor"])


def check_feature_layers(layers: tuple, num_layers: int, where: Path) -> tuple:
    """Feature layers a checkpoint names (speculators' `eagle_aux_hidden_state_layer_ids`)."""
    if len(layers) != 3 or len(set(layers)) != 3 or not all(0 <= i < num_layers for i in layers):
        raise ValueError(f"path: {where / CONFIG_NAME}: EAGLE-3 reads three distinct target "
                         f"layers' inputs, ids in [0, {num_layers}) for this target, got "
                         f"{list(layers)}")
    return tuple(layers)


def eagle_config(fields: dict, state: dict, target, where: Path, feature_layers=None,
                 **tree) -> EagleConfig:
    """The `EagleConfig` of a checkpoint for `target`; ValueError when it cannot fit.

    feature_layers: the EAGLE-3 target layers the checkpoint names, None for the reference's."""
    arch = detect_arch(state, where)
    text = target.config.get_text_config(decoder=True)
    target_d = int(target.get_input_embeddings().weight.shape[1])
    target_vocab = int(target.get_input_embeddings().weight.shape[0])
    d = _int(fields, "hidden_size", where)
    heads = _int(fields, "num_attention_heads", where)
    vocab = _int(fields, "vocab_size", where)
    eagle3 = arch == "eagle3"
    target_hidden = _int(fields, "target_hidden_size", where, d) if eagle3 else d
    if target_hidden != target_d:
        name = "target_hidden_size (or hidden_size)" if eagle3 else "hidden_size"
        raise ValueError(f"target: the drafter in {where} has {name} {target_hidden}, the "
                         f"target's hidden size is {target_d}")
    if vocab != target_vocab:
        raise ValueError(f"target: the drafter in {where} has vocab_size {vocab}, the target's "
                         f"embedding has {target_vocab} rows")
    draft_vocab = _int(fields, "draft_vocab_size", where, vocab) if eagle3 else vocab
    if draft_vocab != vocab and "d2t" not in state:
        raise ValueError(f"path: the EAGLE-3 drafter in {where} drafts over {draft_vocab} ids "
                         f"(draft_vocab_size) for a vocabulary of {vocab} but has no d2t mapping "
                         f"them to the target's ids")
    if "embed_tokens.weight" not in state and d != target_d:
        raise ValueError(f"path: the drafter in {where} has hidden_size {d} and no "
                         f"embed_tokens.weight, and the target's embedding has {target_d} columns")
    bias = fields.get("bias", True)
    qkv_bias = fields.get("qkv_bias", False)
    act = fields.get("hidden_act", "silu")
    if act not in ACT2FN:
        raise ValueError(f"path: {where / CONFIG_NAME}: hidden_act {act!r} is not an activation "
                         f"transformers knows")
    for name, value in (("bias", bias), ("qkv_bias", qkv_bias)):
        if not isinstance(value, bool):
            raise ValueError(f"path: {where / CONFIG_NAME}: {name} must be a bool, got {value!r}")
    cfg = EagleConfig(
        arch=arch, hidden_size=d, target_hidden_size=target_hidden,
        intermediate_size=_int(fields, "intermediate_size", where),
        num_heads=heads, num_kv_heads=_int(fields, "num_key_value_heads", where, heads),
        num_layers=1 if eagle3 else _int(fields, "num_hidden_layers", where),
        vocab_size=vocab, draft_vocab_size=draft_vocab,
        rms_norm_eps=float(fields.get("rms_norm_eps", 1e-6)),
        rope_theta=float(fields.get("rope_theta", 10000.0)),
        rope_linear_factor=_rope_factor(fields, where),
        fc_bias=bias, qkv_bias=qkv_bias, hidden_act=act,
        feature_layers=(-1,) if not eagle3 else eagle3_feature_layers(text.num_hidden_layers)
        if feature_layers is None else check_feature_layers(feature_layers,
                                                            text.num_hidden_layers, where),
        **tree)
    if d % heads or heads % cfg.num_kv_heads:
        raise ValueError(f"path: {where / CONFIG_NAME}: hidden_size {d}, num_attention_heads "
                         f"{heads} and num_key_value_heads {cfg.num_kv_heads} do not divide")
    for name in ("depth", "top_k", "total_tokens"):
        value = getattr(cfg, name)
        low = 2 if name == "total_tokens" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if cfg.top_k > draft_vocab:
        raise ValueError(f"top_k must be at most the draft vocabulary ({draft_vocab}), got "
                         f"{cfg.top_k}")
    return cfg


def check_state(own: dict, state: dict, where: Path) -> None:
    """ValueError unless `state` fills the head's parameters `own` exactly."""
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own) - set(OPTIONAL_KEYS))
    shapes = sorted(f"{k} {tuple(state[k].shape)} for {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if state[k].shape != own[k].shape)
    if missing or unexpected or shapes:
        parts = [f"{what} {keys[:4]}{' ...' if len(keys) > 4 else ''}"
                 for what, keys in (("missing", missing), ("unexpected", unexpected),
                                    ("other shapes", shapes)) if keys]
        raise ValueError(f"path: the weights in {where} do not fit the drafter its "
                         f"{CONFIG_NAME} describes ({'; '.join(parts)})")
