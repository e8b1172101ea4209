"""Position ids for the prefill, M-RoPE included (a draft tree's nodes follow from them).

transformers' `generate` takes the prompt's positions from the model's
`_prepare_position_ids_for_generation` (`attention_mask.cumsum(-1) - 1` for left-padded text
models; `[4, B, L]` for Qwen2.5-VL: a text row plus the three M-RoPE axes from `get_rope_index`,
which also stores `rope_deltas`) and then gives every new token the last position plus one on every
axis. A tree node at depth d below the root therefore sits at `root + 1 + d` on every axis, siblings
share a position, and for Qwen2.5-VL this is the text position plus `rope_deltas` broadcast to the
three M-RoPE axes (ViSpec / EAGLE-2 tree positions).
"""

from __future__ import annotations

import inspect
import weakref
from contextlib import contextmanager

import torch


def prefill_position_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         model_kwargs: dict) -> torch.Tensor:
    """long `[B, L]` or `[A, B, L]`: what `model.generate` would use for the prompt."""
    if ("position_ids" not in inspect.signature(model.forward).parameters
            or _generate_passes_no_positions(model, input_ids, attention_mask)):
        # `generate` then passes none, and the model counts cache slots, left padding included
        # (Whisper's and the BART family's decoders; HyperCLOVAX-Vision-V2 and EXAONE 4.5,
        # whose `prepare_inputs_for_generation` drops them): positions are slot indices
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    prepare = getattr(model, "_prepare_position_ids_for_generation", None)
    if prepare is None:  # transformers < 5: no hook, text models use the cumsum rule
        pos = attention_mask.long().cumsum(-1) - 1
        return pos.masked_fill(attention_mask == 0, 0)
    kwargs = {**model_kwargs, "attention_mask": attention_mask, "input_ids": input_ids}
    return prepare(input_ids, kwargs)


def _generate_passes_no_positions(model, input_ids, attention_mask) -> bool:
    """Whether the model's `prepare_inputs_for_generation` drops the `position_ids` it is
    given, so that its own `generate` never passes any."""
    given = torch.zeros_like(input_ids)
    inputs = model.prepare_inputs_for_generation(input_ids, attention_mask=attention_mask,
                                                 position_ids=given, use_cache=True,
                                                 is_first_iteration=True)
    return inputs.get("position_ids") is None


# position embeddings that the BART family's decoders add to their token embeddings, as
# `embed_positions(input, cache_length, position_ids=None)` with `arange(cache_length, ...)`: the
# output broadcasts against `[B, L, D]`, so `[B, L, D]` at the engine's positions may replace it.
# (RoFormer's sinusoidal module has the same signature but feeds a rotary that takes `[L, D]`.)
_ADDED_POSITION_EMBEDDINGS = frozenset(
    f"{family}PositionalEmbedding" for family in (
        "BartLearned", "MBartLearned", "PLBartLearned", "MvpLearned", "TrOCRLearned",
        "BlenderbotLearned", "BlenderbotSmallLearned", "BigBirdPegasusLearned",
        "MarianSinusoidal", "PegasusSinusoidal"))


_FEEDING: weakref.WeakSet = weakref.WeakSet()  # models whose hooks are in place


def _slot_position_modules(model) -> list:
    """The position-embedding modules to feed the engine's positions: those of a model whose
    forward takes no `position_ids`, from the families above."""
    if "position_ids" in inspect.signature(model.forward).parameters:
        return []
    return [module for module in model.modules()
            if type(module).__name__ in _ADDED_POSITION_EMBEDDINGS
            and "position_ids" in inspect.signature(module.forward).parameters]


@contextmanager
def engine_positions(model):
    """While the engine runs: a model that counts its positions in cache slots (its forward has
    no `position_ids`, its decoder embeds `arange(cache length, ...)`, the BART family) takes the
    `position_ids` the engine passes instead. A tree node then sits at its depth, not at its
    index among the nodes, and a batch row's holes do not shift its positions, as in its own
    `generate` (which passes none: slot indices, left padding included, which the engine's
    prefill positions equal). Calls without `position_ids` (the model's own `generate`) are left
    alone; the hooks go when the engine ends."""
    modules = [] if model in _FEEDING else _slot_position_modules(model)
    if not modules:  # none, or fed already (the probe inside the engine's call)
        yield
        return
    _FEEDING.add(model)
    current = {}

    def take(_module, _args, kwargs):  # the top-level call: remember its positions, or none
        pos = kwargs.get("position_ids")
        current["pos"] = pos if isinstance(pos, torch.Tensor) and pos.dim() == 2 else None

    def feed(_module, args, kwargs):
        pos = current.get("pos")
        if pos is None:
            return None
        return args, {**kwargs, "position_ids": pos.reshape(-1)}

    def shape(_module, _args, _kwargs, output):  # [1, B * N, D] or [B * N, D] -> [B, N, D]
        pos = current.get("pos")
        if pos is None or not isinstance(output, torch.Tensor):
            return None
        return output.reshape(*pos.shape, output.shape[-1])

    handles = [model.register_forward_pre_hook(take, with_kwargs=True)]
    for module in modules:
        handles.append(module.register_forward_pre_hook(feed, with_kwargs=True))
        handles.append(module.register_forward_hook(shape, with_kwargs=True))
    try:
        yield
    finally:
        _FEEDING.discard(model)
        for handle in handles:
            handle.remove()
