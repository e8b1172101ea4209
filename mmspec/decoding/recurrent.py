"""Hybrid linear-attention targets (Qwen3-Next, Jamba, Granite-4 hybrids, Nemotron-H, Zamba 2,
...): roll the recurrent state back to the accepted tokens.

A linear-attention, SSM or short-convolution layer folds every token it is fed into one state;
transformers' `LinearAttentionLayer` keeps that state (`conv_states`, `recurrent_states`) in place
and can crop only its convolution window (`crop`, for layers without a recurrent state). After a
verification forward of `K` chain tokens of which `d + 1 < K` are committed (the root and `d`
accepted drafts), the state holds rejected tokens and no cache slot can hide them. So, as in
assisted generation's fallback for such models, the engine snapshots the states before the
verification forward and, when the round rejects a token, restores them, crops the attention
layers back to the round's start and feeds the committed tokens again: one more forward of
`d + 1` tokens in the rounds that reject one (its cost is in BENCHMARKS.md, `hybrid_rollback`).

Chains only, without holes: a tree's siblings or a batch's holes cannot pass through a
recurrence without mixing into its state. So the engine verifies each draft tree's main path
(`tree.main_path`), and the rows of a batch commit alike (`loop.even_commit`: as many tokens
as the row that accepted fewest), which the replay then feeds to every row.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin, StaticLayer

from .kv_cache import crop_layer


def recurrent_layers(cache) -> list:
    return [layer for layer in getattr(cache, "layers", ())
            if isinstance(layer, LinearAttentionCacheLayerMixin)]


def snapshot(layers) -> list:
    """Copies of every layer's conv and recurrent states (and whether it has seen a token)."""
    saved = []
    for layer in layers:
        saved.append(({i: s.clone() for i, s in layer.conv_states.items() if s is not None},
                      {i: s.clone() for i, s in layer.recurrent_states.items() if s is not None},
                      dict(layer.has_previous_state)))
    return saved


def restore(layers, saved) -> None:
    """Put the states back in place (their tensors keep their addresses)."""
    for layer, (conv, rec, seen) in zip(layers, saved):
        for i, state in conv.items():
            layer.conv_states[i].copy_(state)
        for i, state in rec.items():
            layer.recurrent_states[i].copy_(state)
        layer.has_previous_state.update(seen)


def crop_attention(cache, start: int) -> None:
    """Keep the attention layers' first `start` entries (`kv_cache.crop_layer`): `DynamicLayer`s
    sliced, `StaticLayer`s (`compile=True`) writing from `start` on at their next update; the
    recurrent state beside them is the snapshot's business."""
    for layer in cache.layers:
        if isinstance(layer, (StaticLayer, DynamicLayer)) and layer.is_initialized \
                and layer.keys is not None and layer.keys.numel():
            crop_layer(layer, start)


def replay(target, tokens: torch.Tensor, positions: torch.Tensor, attn_2d: torch.Tensor,
           cache_arg: dict) -> None:
    """Feed the committed tokens `[1, d + 1]` again after a restore: states and keys as if the
    rejected drafts had never been fed."""
    target(input_ids=tokens, attention_mask=attn_2d, position_ids=positions, use_cache=True,
           return_dict=True, **cache_arg)
