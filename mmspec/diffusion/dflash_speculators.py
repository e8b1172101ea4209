"""DFlash drafters in the `speculators` format: vLLM's drafter checkpoints (PyPI `speculators`).

    drafter.save_pretrained("out", format="speculators")   # then: vllm serve out
    DFlashDrafter.from_pretrained("out", target)             # detected by its config.json

The layout followed is that of speculators 0.9.0, the newest release (`DFlashSpeculatorConfig`,
`DFlashDraftModel`, its `DFlashConverter` from z-lab folders). Release 0.7 differs: it also wrote
`embed_tokens.weight` and, for a full vocabulary, `lm_head.weight` (copies of the verifier's),
and its converter kept a last-layer id in `aux_hidden_state_layer_ids`; such folders load here
too (the copies are checked against the target's and dropped).

- config.json: `speculators_model_type` "dflash"; `architectures` ["DFlashSpeculator"];
  `transformer_layer_config`, the Qwen3 config of the draft layers (z-lab's config.json less
  their DFlash keys) whose `vocab_size` is the target's; `draft_vocab_size`; `block_size`;
  `target_hidden_size` (null: the drafter's); `aux_hidden_state_layer_ids`, z-lab's
  `target_layer_ids` plus one (speculators counts transformers' `hidden_states` entries, whose
  entry 0 is the embedding output); `mask_token_id`; `sliding_window_non_causal` (z-lab: no
  `is_causal`, sliding layers causal, is false); `sample_from_anchor` false (the block's first
  row is the last committed token, as z-lab's); `speculators_config`: algorithm "dflash", one
  greedy proposal of `block_size - 1` tokens, and the verifier `vllm serve FOLDER` loads.
- model.safetensors: z-lab's names unchanged (`layers.*`, `fc`, `hidden_norm`, `norm`; their
  converter copies them as is), no embedding and no LM head (speculators 0.9 rebuilds both from
  the verifier for a full vocabulary).

Refused with one line, as the format cannot say them: DFlash2 (speculators' "dflash2" type is
another network), `input_embedding_scale`, `output_multiplier` or `final_logit_softcapping` off
their defaults, a causal full-attention layer, sliding layers of mixed causality, and a target
layer id that is the target's last layer (speculators 0.9 reads that layer implicitly). On load:
a draft vocabulary smaller than the target's (`t2d` / `d2t`), `sample_from_anchor` true, and a
`target_hidden_size` other than the drafter's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

FORMAT_VERSION = "0.9.0"  # the speculators release whose schema is followed here
ZLAB_ONLY = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers",
             "dtype", "torch_dtype", "is_causal")
VERIFIER_COPIES = ("embed_tokens.weight", "lm_head.weight")  # release 0.7 wrote these


def is_speculators(path: Path) -> bool:
    """Whether folder `path` holds a speculators config.json."""
    file = Path(path) / "config.json"
    try:
        return file.is_file() and "speculators_model_type" in json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False  # the z-lab reader names the broken file


def _sliding_non_causal(drafter) -> bool:
    """speculators' one causality flag for `drafter`'s layers; ValueError when it cannot say
    them (full-attention layers are always bidirectional there)."""
    cfg = drafter.config
    full = [c for c, w in zip(cfg.causal, cfg.window) if w is None]
    sliding = {c for c, w in zip(cfg.causal, cfg.window) if w is not None}
    if any(full) or len(sliding) > 1:
        raise ValueError(f"format: 'speculators' has full-attention layers bidirectional and one "
                         f"causality for all sliding layers; this drafter's layers are causal "
                         f"{list(cfg.causal)} with windows {list(cfg.window)}")
    return sliding == {False}


def check_exportable(drafter) -> None:
    """ValueError (one line) when the format cannot say `drafter` (the module doc's list)."""
    cfg = drafter.config
    if cfg.is_dflash2:
        raise ValueError("format: 'speculators' writes DFlash (DFlashDraftModel) drafters; this "
                         "one is a DFlash2DraftModel, which speculators' 'dflash2' type does not "
                         "hold")
    odd = {name: value for name, value, default in (
        ("input_embedding_scale", cfg.input_embedding_scale, 1.0),
        ("output_multiplier", cfg.output_multiplier, 1.0),
        ("final_logit_softcapping", cfg.final_logit_softcapping, None)) if value != default}
    if odd:
        raise ValueError(f"format: 'speculators' has no field for {odd} (DFlashSpeculatorConfig "
                         f"draws with scale 1 and no softcapping)")
    layers = drafter.target.config.get_text_config(decoder=True).num_hidden_layers
    if layers - 1 in cfg.target_layer_ids:
        raise ValueError(f"format: 'speculators' reads the target's last layer ({layers - 1}) "
                         f"implicitly, not as an aux layer; this drafter's target_layer_ids "
                         f"{list(cfg.target_layer_ids)} include it")


def write_speculators(drafter, path, verifier: str | None, dtype: torch.dtype | None) -> Path:
    """Write `drafter` (a DFlash `DFlashDrafter`) to the folder `path`; see the module doc.
    verifier: recorded as the model `vllm serve` loads as the target; dtype: the weights' dtype
    on disk (None: the drafter's)."""
    check_exportable(drafter)
    cfg, raw, target = drafter.config, drafter.raw_config, drafter.target
    dtype = drafter.model.fc.weight.dtype if dtype is None else dtype
    layer = {k: v for k, v in raw.items() if k not in ZLAB_ONLY}
    fields = {
        "speculators_model_type": "dflash",
        "speculators_version": FORMAT_VERSION,
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": {**layer, "model_type": "qwen3"},
        "draft_vocab_size": int(raw["vocab_size"]),
        "block_size": cfg.block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in cfg.target_layer_ids],
        "mask_token_id": cfg.mask_token_id,
        "sliding_window_non_causal": _sliding_non_causal(drafter),
        "sample_from_anchor": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": cfg.block_size - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier,
                         "architectures": list(getattr(target.config, "architectures", None)
                                               or [type(target).__name__])},
        },
    }
    state = {k: v.detach().to(dtype).contiguous().cpu()
             for k, v in drafter.model.weights().items()}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    save_file(state, str(path / "model.safetensors"))
    return path


def _refuse_unreadable(fields: dict, layer, where: Path) -> None:
    file = where / "config.json"
    kind = fields.get("speculators_model_type")
    if kind != "dflash":
        raise ValueError(f"path: {file}: speculators_model_type must be 'dflash' (the only "
                         f"speculators DFlash type mmspec loads), got {kind!r}")
    if not isinstance(layer, dict):
        raise ValueError(f"path: {file}: transformer_layer_config must be a JSON object, got "
                         f"{type(layer).__name__}")
    if fields.get("sample_from_anchor", False):
        raise ValueError(f"path: {file}: sample_from_anchor is true; mmspec's DFlash blocks "
                         f"start at the last committed token (sample_from_anchor false)")
    vocab, draft = layer.get("vocab_size"), fields.get("draft_vocab_size", layer.get("vocab_size"))
    if draft != vocab:
        raise ValueError(f"path: {file}: draft_vocab_size {draft} differs from the target's "
                         f"vocab_size {vocab}; mmspec's DFlash reads out with the target's LM head "
                         f"(no t2d / d2t vocabularies)")
    hidden = fields.get("target_hidden_size")
    if hidden is not None and hidden != layer.get("hidden_size"):
        raise ValueError(f"path: {file}: target_hidden_size {hidden} differs from the drafter's "
                         f"hidden_size {layer.get('hidden_size')}; DFlash layers are as wide as "
                         f"the target")
    ids = fields.get("aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 1 for i in ids):
        raise ValueError(f"path: {file}: aux_hidden_state_layer_ids must be a list of ints >= 1 "
                         f"(hidden_states entries after the embedding), got {ids!r}")


def read_speculators(path: Path, state: dict, target) -> dict:
    """A speculators DFlash folder's config.json -> z-lab's config.json fields; `state` (its
    weights) loses the verifier copies release 0.7 wrote, after they are checked to be the
    target's."""
    from transformers import Qwen3Config

    fields = json.loads((path / "config.json").read_text())
    layer = fields.get("transformer_layer_config")
    _refuse_unreadable(fields, layer, path)
    own = {"embed_tokens.weight": target.get_input_embeddings().weight,
           "lm_head.weight": target.get_output_embeddings().weight}
    for name in VERIFIER_COPIES:
        saved = state.pop(name, None)
        if saved is not None and not torch.equal(saved, own[name].detach().cpu().to(saved.dtype)):
            raise ValueError(f"path: {path}: its {name} is not the target's (a drafter "
                             f"exported for another target); mmspec drafts with the target's")
    # speculators writes the diff against Qwen3Config(); layer_types and the window follow the
    # layer count and use_sliding_window there, so they are never filled in from the default
    defaults = {k: v for k, v in Qwen3Config().to_dict().items()
                if k not in ("layer_types", "sliding_window", "transformers_version")}
    raw = {k: v for k, v in {**defaults, **layer}.items() if k not in ZLAB_ONLY}
    raw.update(architectures=["DFlashDraftModel"], dflash_config={
        "target_layer_ids": [i - 1 for i in fields["aux_hidden_state_layer_ids"]],
        "block_size": int(fields.get("block_size", 8)),
        "mask_token_id": fields.get("mask_token_id")})
    if fields.get("sliding_window_non_causal", False):
        raw["is_causal"] = False
    return raw
