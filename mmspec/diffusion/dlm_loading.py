"""Load a diffusion LM checkpoint folder as a bidirectional transformers model, offline.

Dream (`Dream-org/Dream-v0-{Base,Instruct}-7B`, Dream-Coder, DiffuCoder: `model_type` "Dream")
ships its model class as remote code written for transformers 4.46, which may not run on 5.x
(reference notes, diffuspec.md §4). Its layers are Qwen2's, under Qwen2's weight names, with
full attention and shift prediction, so its weights load into transformers' own
`Qwen2ForCausalLM` (built from the Dream config's fields), made bidirectional: no remote code runs.
Any other folder loads through `AutoModelForCausalLM` (e.g. the zoo's `text-dlm`, a Qwen2 saved
with `mask_token_id` and `diffusion_shift` in its config). Loading is strict: a checkpoint whose
weights do not all land in the model is refused, never run half-initialised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

DREAM_CONTEXT = 2048  # Dream's trained context, input and output together (its README)
# Dream config fields that are Qwen2Config fields of the same meaning
_DREAM_TO_QWEN2 = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "num_key_value_heads", "hidden_act",
                   "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
                   "tie_word_embeddings", "attention_dropout", "initializer_range",
                   "bos_token_id", "eos_token_id", "pad_token_id")


@dataclass
class DiffusionLM:
    """A loaded diffusion LM and what its checkpoint says about drafting with it."""

    model: torch.nn.Module
    mask_token_id: int
    shift: bool  # logits at position i predict token i + 1 (Dream)
    max_context: int | None  # most tokens it was trained on, when known (Dream: 2048)


def _qwen2_config_of_dream(raw: dict):
    from transformers import Qwen2Config

    fields = {name: raw[name] for name in _DREAM_TO_QWEN2 if name in raw}
    config = Qwen2Config(**fields, use_sliding_window=False)
    config.mask_token_id = raw.get("mask_token_id")
    return config


def load_diffusion_lm(path, dtype="auto") -> DiffusionLM:
    """`path`: a checkpoint folder (config.json and weights). `dtype`: as in `from_pretrained`."""
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    from .bidirectional import make_bidirectional

    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"path: {path} is not a checkpoint folder (no config.json)")
    raw = json.loads(config_path.read_text())
    kind = str(raw.get("model_type", "")).lower()
    if kind.startswith("llada"):
        raise NotImplementedError(
            f"path: {path} is a LLaDA checkpoint (model_type {raw['model_type']!r}), whose layers "
            f"are not a transformers architecture; load it yourself and pass it to "
            f"DiffusionDrafter(model, mask_token_id, target, config=DiffusionDrafterConfig("
            f"shift=False))")
    if kind == "dream":
        model, info = Qwen2ForCausalLM.from_pretrained(
            path, config=_qwen2_config_of_dream(raw), dtype=dtype, output_loading_info=True)
        shift, context = True, DREAM_CONTEXT
    else:
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                           output_loading_info=True)
        shift, context = bool(raw.get("diffusion_shift", True)), None
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = sorted(set(info.get("missing_keys", ())) - tied)
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if "rotary_emb" not in k)
    if missing or unexpected or info.get("mismatched_keys"):
        raise ValueError(
            f"path: the weights in {path} do not fit {type(model).__name__} (model_type "
            f"{raw.get('model_type')!r}): missing {missing[:4]}, unexpected {unexpected[:4]}, "
            f"mismatched {[k for k, *_ in info.get('mismatched_keys', ())][:4]}; it would run "
            f"with random weights there")
    mask_token_id = raw.get("mask_token_id")
    if mask_token_id is None:
        raise ValueError(f"path: {config_path} has no mask_token_id: a diffusion LM's config "
                         f"names its mask token (Dream: 151666)")
    return DiffusionLM(make_bidirectional(model).eval(), int(mask_token_id), shift, context)
