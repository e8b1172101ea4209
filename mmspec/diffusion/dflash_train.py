"""Training a DFlash drafter for any causal LM target: a fresh drafter in the authors' layout and
their anchor-block loss (SpecForge's `OnlineDFlashTrainer`, the training recipe z-lab points to).

A training sequence of S tokens runs through the frozen target once; its hidden states at the
drafter's `target_layer_ids` are the context. `anchors` positions are drawn per sequence; each
opens a block: the anchor's own token, then `block_size - 1` mask tokens, at the anchor's
position onwards. All blocks of a sequence run in one draft forward, under the mask of their
`create_dflash_block_mask`: a block row sees the context strictly before its anchor (the target
has not run the anchor at drafting time) and every row of its own block, nothing of the other
blocks. Row k of a block is scored against the token at anchor + k (k >= 1) by cross-entropy,
weighted exp(-(k - 1) / gamma) (their `loss_decay_gamma`): the first drafted tokens matter most,
a later one only counts when all before it were accepted.

A block row sees only what the drafter's layer lets it see when it drafts: a causal or
sliding-window layer (`layer_types`, `sliding_window`, `is_causal` of the config) narrows the
block mask the same way in training.

Labels: the tokens of the window (theirs), or with `soft_labels` the target's own next-token
distribution at each labelled position, EAGLE's soft labels: the cross entropy against the
target's probabilities, which the same target forward already yields. Hard labels tell the
drafter one token a row; the target's distribution also says how far each other token was.

Deliberate differences: anchors are drawn from positions >= 1 whose whole block lies in the
window (theirs may run past the end, unscored), and the draft layers start from the target's top
layer where the shapes agree (theirs start at random), which shortens short runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dflash import DFlashDrafter
from .dflash_checkpoint import build_target_layer_ids, dflash_config
from .dflash_model import DFlashModel, qwen3_config


def new_drafter(target, *, mask_token_id: int, layers: int = 1, block_size: int = 8,
                target_layer_ids=None, intermediate_size: int | None = None,
                num_kv_heads: int | None = None) -> DFlashDrafter:
    """A fresh DFlash drafter for `target` (its width, heads and RoPE), config in their layout;
    the draft layers copy the target's top layer where the shapes agree."""
    text = target.config.get_text_config(decoder=True)
    n = int(text.num_hidden_layers)
    ids = list(target_layer_ids or build_target_layer_ids(n, layers))
    heads = int(text.num_attention_heads)
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
           "hidden_size": int(text.hidden_size),
           "intermediate_size": int(intermediate_size or text.intermediate_size),
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": int(num_kv_heads or getattr(text, "num_key_value_heads", heads)),
           "head_dim": int(getattr(text, "head_dim", None) or text.hidden_size // heads),
           "hidden_act": "silu", "rms_norm_eps": float(getattr(text, "rms_norm_eps", 1e-6)),
           "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
           "max_position_embeddings": int(text.max_position_embeddings),
           "rope_parameters": dict(getattr(text, "rope_parameters", None)
                                   or {"rope_type": "default", "rope_theta": 10000.0}),
           "vocab_size": int(target.get_input_embeddings().weight.shape[0]),
           "num_target_layers": n, "use_sliding_window": False,
           "layer_types": ["full_attention"] * layers,
           "dflash_config": {"target_layer_ids": ids, "block_size": block_size,
                             "mask_token_id": int(mask_token_id)}}
    model = DFlashModel(qwen3_config(raw), dflash_config(raw, "(new)"))
    _init_from_target(model, target)
    weight = target.get_input_embeddings().weight
    return DFlashDrafter(model, target, raw).to(device=weight.device, dtype=weight.dtype)


def _init_from_target(model: DFlashModel, target) -> None:
    top = target.get_decoder().layers[-1].state_dict()
    for layer in model.layers:
        own = layer.state_dict()
        fitting = {k: v for k, v in top.items() if k in own and own[k].shape == v.shape}
        layer.load_state_dict(fitting, strict=False)


def draw_anchors(batch: int, seq_len: int, block_size: int, anchors: int,
                 generator: torch.Generator) -> torch.Tensor:
    """long `[B, A]`: `anchors` distinct sorted positions per row in [1, seq_len - block_size]."""
    span = seq_len - block_size
    if span < anchors:
        raise ValueError(f"anchors: {anchors} blocks of {block_size} do not fit windows of "
                         f"{seq_len} tokens (at most {max(span, 0)})")
    scores = torch.rand(batch, span, generator=generator)
    return scores.argsort(-1)[:, :anchors].sort(-1).values + 1


def block_mask(anchors: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """bool `[B, 1, A * bs, S + A * bs]`: block rows over [context; blocks] (module docstring)."""
    b, a = anchors.shape
    row_anchor = anchors.repeat_interleave(block_size, 1)  # [B, A * bs]
    ctx = torch.arange(seq_len, device=anchors.device)[None, None] < row_anchor[..., None]
    block_id = torch.arange(a * block_size, device=anchors.device) // block_size
    own = (block_id[:, None] == block_id[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], -1)[:, None]


def training_loss(drafter: DFlashDrafter, ids: torch.Tensor, anchors_per_row: int,
                  generator: torch.Generator, gamma: float | None = 4.0,
                  soft_labels: bool = False) -> torch.Tensor:
    """The anchor-block loss of `drafter` on windows `ids` `[B, S]`. The target's embedding and
    LM head are used, not trained: freeze the target (`requires_grad_(False)`)."""
    anchors = draw_anchors(ids.shape[0], ids.shape[1], drafter.config.block_size,
                           anchors_per_row, generator).to(ids.device)  # [B, A]
    return anchored_loss(drafter, ids, anchors, gamma, soft_labels)[0]


# --- one sample of any length, supervised from a position on (`mmspec.vision.train --arch dflash`)


def supervised_anchors(first: int, seq_len: int, block_size: int, anchors: int,
                       generator: torch.Generator) -> torch.Tensor:
    """long `[A]`: up to `anchors` distinct sorted anchors of a `seq_len`-token sequence whose
    tokens from `first` on are supervised (the target's answer; 0: all of them). An anchor's
    block labels the tokens after it, so it lies in [max(1, first - 1), seq_len - block_size]:
    every label supervised and inside the sequence (SpecForge draws from its loss mask the same
    way). Fewer than `anchors` when fewer fit; none when no block does."""
    low, high = max(1, first - 1), seq_len - block_size
    span = max(high - low + 1, 0)
    picks = torch.rand(span, generator=generator).argsort()[:anchors]
    return picks.sort().values + low


def training_masks(model: DFlashModel, anchors: torch.Tensor, seq_len: int,
                   block_size: int) -> list:
    """Per layer bool `[B, 1, A * bs, S + A * bs]`: `block_mask`, narrowed where the layer is
    causal or sliding as `DFlashModel.masks` narrows it when drafting."""
    blocks = block_mask(anchors, seq_len, block_size)
    if not any(model.dflash.causal) and all(w is None for w in model.dflash.window):
        return [blocks] * len(model.layers)
    b = anchors.shape[0]
    row_pos = (anchors[..., None] + torch.arange(block_size, device=anchors.device)).flatten(1)
    ctx_pos = torch.arange(seq_len, device=anchors.device).expand(b, -1)
    return [blocks & m for m in model.masks(row_pos, ctx_pos,
                                            torch.ones_like(ctx_pos, dtype=torch.bool))]


def anchored_loss(drafter: DFlashDrafter, ids: torch.Tensor, anchors: torch.Tensor,
                  gamma: float | None, soft_labels: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, accuracy of the drafted rows) of `drafter` on `ids` `[B, S]` with the blocks at
    `anchors` `[B, A]`: `training_loss` with the anchors given. The target may run in another
    dtype than the drafter (fp32 master weights over a bf16 target)."""
    target, cfg, model = drafter.target, drafter.config, drafter.model
    b, s = ids.shape
    bs, a = cfg.block_size, anchors.shape[1]
    dtype = model.fc.weight.dtype
    with torch.no_grad():
        out_t = target(ids, output_hidden_states=True)
    features = torch.cat([out_t.hidden_states[i] for i in drafter.target_hidden_layers],
                         -1).to(dtype)
    offsets = torch.arange(bs, device=ids.device)
    label_pos = (anchors[..., None] + offsets).flatten(1)  # [B, A * bs]
    block_ids = torch.full_like(label_pos, cfg.mask_token_id)
    block_ids[:, ::bs] = ids.gather(1, anchors)
    noise = F.embedding(block_ids, target.get_input_embeddings().weight).to(dtype)
    positions = torch.arange(s, device=ids.device).expand(b, -1)
    out = model(noise * cfg.input_embedding_scale, label_pos,
                model.context_kv(features, positions), training_masks(model, anchors, s, bs))
    logits = model.logits(out, target.get_output_embeddings()).float()  # [B, A * bs, V]
    k = offsets.repeat(a)  # row k of its block; row 0 is the anchor's own token
    weight = (k > 0).float() * (torch.exp(-(k - 1).clamp_min(0) / gamma) if gamma else 1.0)
    labels = ids.gather(1, label_pos)
    goal = labels  # or the target's distribution: its logits at p predict the token at p + 1
    if soft_labels:
        goal = out_t.logits.gather(1, (label_pos - 1).clamp_min(0)[..., None].expand(
            -1, -1, out_t.logits.shape[-1])).float().softmax(-1)  # [B, A * bs, V]
    loss = F.cross_entropy(logits.flatten(0, 1), goal.flatten(0, 1), reduction="none").view(b, -1)
    hit = (logits.detach().argmax(-1) == labels)[:, k > 0].float().mean()
    return (loss * weight).sum() / (weight.sum() * b), hit


def sample_loss(drafter: DFlashDrafter, ids: torch.Tensor, first: int, anchors: int,
                generator: torch.Generator, gamma: float | None,
                soft_labels: bool = False) -> tuple[torch.Tensor, dict]:
    """(loss, parts) on one sequence `ids` `[1, T]` supervised from token `first` on, with up to
    `anchors` blocks (`supervised_anchors`); a zero with a graph when no block fits."""
    picks = supervised_anchors(first, ids.shape[1], drafter.config.block_size, anchors,
                               generator).to(ids.device)
    if len(picks) == 0:
        return 0.0 * next(drafter.model.parameters()).sum(), {"blocks": 0}
    loss, hit = anchored_loss(drafter, ids, picks[None], gamma, soft_labels)
    return loss, {"ce": float(loss.detach()), "acc": float(hit), "blocks": len(picks)}
