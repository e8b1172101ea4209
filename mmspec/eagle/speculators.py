"""EAGLE-3 drafters in the `speculators` format: vLLM's drafter checkpoints (PyPI `speculators`).

    drafter.save_pretrained("out", format="speculators")   # then: vllm serve out
    EagleDrafter.from_pretrained("out", target)              # detected by its config.json

The layout, as speculators 0.9 writes and reads it (`Eagle3SpeculatorConfig`,
`Eagle3DraftModel`) and as vLLM's speculators reader consumes it:

- config.json: `speculators_model_type` "eagle3"; `architectures`; `transformer_layer_config`, a
  Llama config of the single decoder layer whose `vocab_size` is the *target's* vocabulary;
  `draft_vocab_size`; `target_hidden_size` (null when it is the drafter's); the target layers
  read, `eagle_aux_hidden_state_layer_ids`; four layer variants (`norm_before_residual`,
  `norm_before_fc`, `fc_norm`, `norm_output`), all false for SafeAILab's layer; and
  `speculators_config`: the algorithm, one greedy proposal method with `speculative_tokens`, and
  the verifier (`name_or_path`, `architectures`) that `vllm serve FOLDER` loads as the target.
- weights (model.safetensors): SafeAILab's names with `midlayer.` renamed `layers.0.`; `d2t`
  (offsets, long) with `t2d` (a bool mask over the target's vocabulary) when the draft vocabulary
  is smaller; `embed_tokens.weight`.

Choices and refusals:
- EAGLE-1/2 is refused: speculators 0.9 has no such model type and vLLM's speculators reader
  knows only eagle3 (and its parallel variant).
- `norm_before_residual` is written false explicitly: vLLM reads an absent field as true, which
  is not the layer these weights were trained in.
- `eagle_aux_hidden_state_layer_ids` counts as mmspec's `feature_layers` do: id i is the input
  of decoder layer i (entry i of transformers' `hidden_states`). On load, id L (the last layer's
  output before the final norm, which speculators allows) is refused: transformers' entry L is
  after the norm.
- `speculative_tokens` is the drafter's `depth` (vLLM drafts a chain that long by default).
- `embed_tokens.weight` is written by default, so the folder does not depend on the verifier's
  files; speculators and vLLM use it rather than the verifier's. `embedding=False` leaves it
  out (as SafeAILab's EAGLE-3 folders, whose loader takes the target's; the zoo's entries).
- On load, a variant flag set true, a `transformer_layer_config` with biases, a `head_dim` other
  than hidden_size / heads, or more than one layer is refused (mmspec's head has none of these).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

FORMAT_VERSION = "0.9.0"  # the speculators release whose schema is followed here
VARIANT_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
LAYER_PREFIX = ("midlayer.", "layers.0.")  # SafeAILab's name, speculators' name


def is_speculators(fields: dict) -> bool:
    return "speculators_model_type" in fields


def write_speculators(drafter, path, verifier: str | None, embedding: bool = True,
                      dtype: torch.dtype | None = None) -> Path:
    """Write `drafter` (an EAGLE-3 `EagleDrafter`) to the folder `path`; see the module doc.
    embedding False: without `embed_tokens.weight`; dtype: the floating weights' dtype on disk
    (None: the drafter's)."""
    cfg = drafter.config
    if cfg.arch != "eagle3":
        raise ValueError(f"format: 'speculators' holds EAGLE-3 drafters only (speculators "
                         f"{FORMAT_VERSION} and vLLM's reader have no EAGLE-1/2 type), this "
                         f"drafter is {cfg.arch!r}")
    target_config = drafter.target.config
    text = target_config.get_text_config(decoder=True)
    head = drafter.head
    dtype = head.fc.weight.dtype if dtype is None else dtype
    state = {(LAYER_PREFIX[1] + k[len(LAYER_PREFIX[0]):] if k.startswith(LAYER_PREFIX[0]) else k):
             (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
             for k, v in head.state_dict().items()}
    if embedding:
        state["embed_tokens.weight"] = drafter.embed_weight.to(dtype).cpu().contiguous()
    if "d2t" in state:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.draft_vocab_size) + state["d2t"]] = True
        state["t2d"] = t2d
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": cfg.hidden_act,
        "max_position_embeddings": getattr(text, "max_position_embeddings", 2048),
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_linear_factor == 1.0 else {
            "rope_type": "linear", "factor": cfg.rope_linear_factor},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }
    fields = {
        "speculators_model_type": "eagle3",
        "speculators_version": FORMAT_VERSION,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": (None if cfg.target_hidden_size == cfg.hidden_size
                               else cfg.target_hidden_size),
        "eagle_aux_hidden_state_layer_ids": list(cfg.feature_layers),
        **{flag: False for flag in VARIANT_FLAGS},
        "embed_requires_grad": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.depth,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier,
                         "architectures": list(getattr(target_config, "architectures", None)
                                               or [type(drafter.target).__name__])},
        },
    }
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    save_file(state, str(path / "model.safetensors"))
    return path


def _flat_layer_fields(layer: dict, where: Path) -> dict:
    """`transformer_layer_config` -> the SafeAILab config.json fields `eagle_config` reads."""
    fields = dict(layer)
    rope = fields.pop("rope_parameters", None)
    if isinstance(rope, dict):  # transformers 5 writes rope_theta and the scaling together
        fields["rope_theta"] = rope.get("rope_theta", 10000.0)
        kind = rope.get("rope_type", rope.get("type", "default"))
        fields["rope_scaling"] = None if kind == "default" else rope
    for name in ("attention_bias", "mlp_bias"):
        if fields.get(name, False):
            raise ValueError(f"path: {where / 'config.json'}: transformer_layer_config.{name} is "
                             f"true; mmspec's EAGLE-3 layer has no biases")
    heads, d = fields.get("num_attention_heads"), fields.get("hidden_size")
    head_dim = fields.get("head_dim")
    if head_dim is not None and isinstance(heads, int) and isinstance(d, int) and heads > 0 \
            and head_dim * heads != d:
        raise ValueError(f"path: {where / 'config.json'}: transformer_layer_config.head_dim "
                         f"{head_dim} is not hidden_size / num_attention_heads = {d} / {heads}")
    if fields.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"path: {where / 'config.json'}: transformer_layer_config."
                         f"num_hidden_layers must be 1 (one EAGLE-3 layer), got "
                         f"{fields['num_hidden_layers']!r}")
    return fields


def read_speculators(fields: dict, state: dict, where: Path):
    """A speculators folder's config.json and weights -> (SafeAILab-style config fields, state
    dict with SafeAILab names, feature layers or None for the default)."""
    kind = fields.get("speculators_model_type")
    if kind != "eagle3":
        raise ValueError(f"path: {where / 'config.json'}: speculators_model_type must be "
                         f"'eagle3' (the only EAGLE type mmspec loads), got {kind!r}")
    layer = fields.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"path: {where / 'config.json'}: transformer_layer_config must be a "
                         f"JSON object, got {type(layer).__name__}")
    for flag in VARIANT_FLAGS:
        if fields.get(flag, False):
            raise ValueError(f"path: {where / 'config.json'}: {flag} is true; mmspec loads the "
                             f"SafeAILab EAGLE-3 layer only (all of {', '.join(VARIANT_FLAGS)} "
                             f"false)")
    flat = _flat_layer_fields(layer, where)
    flat["draft_vocab_size"] = fields.get("draft_vocab_size", flat.get("vocab_size"))
    if fields.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = fields["target_hidden_size"]
    renamed = {(LAYER_PREFIX[0] + k[len(LAYER_PREFIX[1]):] if k.startswith(LAYER_PREFIX[1])
                else k): v for k, v in state.items()}
    layers = fields.get("eagle_aux_hidden_state_layer_ids")
    if layers is not None and (not isinstance(layers, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise ValueError(f"path: {where / 'config.json'}: eagle_aux_hidden_state_layer_ids must "
                         f"be a list of ints, got {layers!r}")
    return flat, renamed, None if layers is None else tuple(layers)
