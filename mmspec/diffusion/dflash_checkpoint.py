"""Reading a DFlash / DFlash2 checkpoint folder (z-lab/dflash; `*-DFlash`, `*-DFlash-b16`): its
config, its weights, and whether they fit the target, without running remote code.

config.json is a Qwen3 config (the draft layers) with `architectures` ["DFlashDraftModel"] or
["DFlash2DraftModel"], `num_target_layers`, and a `dflash_config` holding `target_layer_ids`,
`mask_token_id`, `block_size` and, where set, `input_embedding_scale`, `output_multiplier`,
`final_logit_softcapping` and DFlash2's `conv_kernel_size`, `conv_group_size`, `selector_rank`,
`selector_top_k`. Each is read from `dflash_config`, else from the top level (the reference's
`_draft_value`); `target_layer_ids` defaults to the reference's `build_target_layer_ids`. A layer
is causal when the config's `is_causal` says so, or, without `is_causal`, when it is a sliding
layer (the reference's rule). Weights: model.safetensors, or shards with
model.safetensors.index.json; loading is strict (no key missing, none unexpected).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file

from .dflash_model import DFlashConfig

KINDS = ("DFlashDraftModel", "DFlash2DraftModel")
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's default: one middle layer, or draft-layer-many ids spread over
    [1, num_target_layers - 3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"path: {path} is not a DFlash checkpoint folder (no config.json)")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"path: {file} is not JSON ({err})") from None
    kinds = raw.get("architectures") or []
    if not isinstance(raw, dict) or len(kinds) != 1 or kinds[0] not in KINDS:
        raise ValueError(f"path: {file} has architectures {kinds!r}, expected one of "
                         f"{list(KINDS)} (a z-lab/dflash checkpoint)")
    return raw


def _value(raw: dict, name: str, default=None):
    return (raw.get("dflash_config") or {}).get(name, raw.get(name, default))


def dflash_config(raw: dict, path: Path) -> DFlashConfig:
    kind, layers = raw["architectures"][0], int(raw["num_hidden_layers"])
    ids = _value(raw, "target_layer_ids")
    if ids is None:
        if "num_target_layers" not in raw:
            raise ValueError(f"path: {path}/config.json has neither target_layer_ids nor "
                             f"num_target_layers")
        ids = build_target_layer_ids(int(raw["num_target_layers"]), layers)
    mask = _value(raw, "mask_token_id")
    if mask is None:
        raise ValueError(f"path: {path}/config.json has no mask_token_id (dflash_config)")
    extra = {}
    if kind == "DFlash2DraftModel":
        missing = [k for k in DFLASH2_KEYS if _value(raw, k) is None]
        if missing:
            raise ValueError(f"path: {path}/config.json is a DFlash2DraftModel without "
                             f"{missing} in its dflash_config")
        extra = {k: int(_value(raw, k)) for k in DFLASH2_KEYS}
    types = raw.get("layer_types") or (["sliding_attention"] * layers
                                       if raw.get("use_sliding_window") else
                                       ["full_attention"] * layers)
    causal = raw.get("is_causal")
    cap = _value(raw, "final_logit_softcapping")
    return DFlashConfig(
        kind=kind, target_layer_ids=tuple(int(i) for i in ids),
        block_size=int(_value(raw, "block_size", 16)), mask_token_id=int(mask),
        input_embedding_scale=float(_value(raw, "input_embedding_scale", 1.0)),
        output_multiplier=float(_value(raw, "output_multiplier", 1.0)),
        final_logit_softcapping=None if cap is None else float(cap),
        causal=tuple(t == "sliding_attention" if causal is None else bool(causal) for t in types),
        window=tuple(raw.get("sliding_window") if t == "sliding_attention" else None
                     for t in types),
        **extra)


def check_fits(raw: dict, cfg: DFlashConfig, target, path: Path) -> None:
    """One line naming both sides when the checkpoint was made for another target."""
    text = target.config.get_text_config(decoder=True)
    name = type(target).__name__
    layers, hidden = int(text.num_hidden_layers), int(text.hidden_size)
    ids = list(cfg.target_layer_ids)
    if not all(0 <= i < layers for i in ids) or raw.get("num_target_layers", layers) != layers:
        raise ValueError(f"path: {path} drafts from target layers {ids} of a "
                         f"{raw.get('num_target_layers', '?')}-layer target, but the target "
                         f"{name} has {layers} layers (ids must lie in [0, {layers}))")
    width = target.get_input_embeddings().weight.shape[1]
    if int(raw["hidden_size"]) != hidden or width != hidden:
        raise ValueError(f"path: {path} has hidden_size {raw['hidden_size']}, but the target "
                         f"{name} has hidden_size {hidden} and embeddings {width} wide (DFlash "
                         f"embeds with the target's embedding and reads out with its LM head)")
    vocab = target.get_input_embeddings().weight.shape[0]
    if not 0 <= cfg.mask_token_id < vocab:
        raise ValueError(f"path: {path} has mask_token_id {cfg.mask_token_id}, outside the "
                         f"target {name}'s embedding [0, {vocab})")


def read_weights(path: Path) -> dict:
    index = path / "model.safetensors.index.json"
    files = ([path / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
             if index.is_file() else [path / "model.safetensors"])
    state = {}
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"path: no {file.name} in {path}")
        try:
            state.update(load_file(str(file)))
        except SafetensorError as err:
            raise ValueError(f"path: {file} is not a safetensors file ({err})") from None
    return state


def load_weights(model, state: dict, path: Path) -> None:
    """`state` into the `DFlashModel` `model` after `check_weights` (strict but for the rotary
    tables, which the model builds)."""
    check_weights(model.weights(), state, model.dflash, path)
    model.load_state_dict(state, strict=False)


def check_weights(own: dict, state: dict, cfg: DFlashConfig, path: Path) -> None:
    """Strict: every parameter of the model in the file, nothing else (rotary tables aside)."""
    missing = sorted(set(own) - set(state))
    unexpected = sorted(k for k in set(state) - set(own) if "rotary_emb" not in k)
    selector = [k for k in missing if k.startswith("candidate_selector.")]
    if cfg.is_dflash2 and selector:
        raise ValueError(f"path: {path} is a DFlash2DraftModel checkpoint without its proposal "
                         f"weights (missing {selector}); the candidate selector cannot run")
    wrong = [f"{k} {list(state[k].shape)} (expected {list(own[k].shape)})"
             for k in sorted(set(own) & set(state)) if own[k].shape != state[k].shape]
    if missing or unexpected or wrong:
        raise ValueError(
            f"path: the weights in {path} do not fit a {cfg.kind}: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}, wrong shape {wrong[:2]}; it would draft with random "
            f"weights there")
