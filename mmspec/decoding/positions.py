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

import torch


def prefill_position_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         model_kwargs: dict) -> torch.Tensor:
    """long `[B, L]` or `[A, B, L]`: what `model.generate` would use for the prompt."""
    if "position_ids" not in inspect.signature(model.forward).parameters:
        # `generate` then passes none (its rule), and the model counts cache slots, left padding
        # included (Whisper's and the BART family's decoders): positions are slot indices
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    prepare = getattr(model, "_prepare_position_ids_for_generation", None)
    if prepare is None:  # transformers < 5: no hook, text models use the cumsum rule
        pos = attention_mask.long().cumsum(-1) - 1
        return pos.masked_fill(attention_mask == 0, 0)
    kwargs = {**model_kwargs, "attention_mask": attention_mask, "input_ids": input_ids}
    return prepare(input_ids, kwargs)

