"""The token lattice of a diffusion LM: one forward over `[prefix, MASK x k]` (DiffuSpec §3.2, S=1).

Each row of the batch gets its own block length `k_b`. Rows are rebuilt as
`[left padding, prefix_b, MASK x k_b]`, so every block ends at the right edge, and the model runs once
with a 4-D additive attention mask that lets every valid token see every valid token. transformers
5.x returns a user 4-D mask unchanged (`masking_utils._preprocess_mask_arguments`) and SDPA then runs
with `is_causal=False`, so any HF model that returns logits becomes bidirectional; with
`attention_mask=None` the stock decoders would silently stay causal (McGill-NLP/llm2vec#74).

Shift: Dream-style models (trained with shift prediction, DreamLM/Dream#31) predict token `p+1` at
position `p`, so block position `i` reads the logits one position to its left (the first mask reads
the last prefix token). LLaDA-style models (`shift=False`) predict the token at `p`.

The lattice is returned over the *target's* vocabulary: drafter columns past it are dropped (Qwen2.5
152064 vs 151936), missing columns and the DLM-only ids (the mask token) get -inf, then it is
renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Lattice:
    """logprobs: float `[B, K, V]` (K = max k_b, V = target vocab); row b is valid for `i < lengths[b]`,
    the rest is -inf. lengths: long `[B]`, the block length `k_b` of every row."""

    logprobs: torch.Tensor
    lengths: torch.Tensor

    def argmax(self) -> torch.Tensor:
        """The raw draft, long `[B, K]` (positions past `lengths[b]` are meaningless)."""
        return self.logprobs.argmax(-1)


def bidirectional_attention_mask(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask `[B, 1, L, L]` from a `[B, L]` 0/1 mask: 0 where the key is a real token.

    Padded keys get the dtype's minimum instead of -inf so a padded query row stays finite.
    """
    keys = valid.bool()[:, None, None, :]  # [B, 1, 1, L]
    mask = torch.zeros(valid.shape[0], 1, valid.shape[1], valid.shape[1], dtype=dtype,
                       device=valid.device)
    return mask.masked_fill(~keys, torch.finfo(dtype).min)


def append_mask_blocks(input_ids: torch.Tensor, attention_mask: torch.Tensor, ks: list[int],
                       mask_token_id: int, pad_token_id: int = 0):
    """Rebuild `[B, L]` left-padded rows as `[pad, prefix_b, MASK x ks[b]]`, right-aligned.

    Returns ids `[B, L']`, valid `[B, L']` and the block start of every row (list of B ints).
    """
    prefixes = [row[m.bool()] for row, m in zip(input_ids, attention_mask)]
    lengths = [p.numel() + k for p, k in zip(prefixes, ks)]
    width = max(lengths)
    ids = torch.full((len(ks), width), pad_token_id, dtype=torch.long, device=input_ids.device)
    valid = torch.zeros_like(ids)
    starts = []
    for b, (prefix, k, n) in enumerate(zip(prefixes, ks, lengths)):
        start = width - k
        ids[b, width - n:start] = prefix
        ids[b, start:] = mask_token_id
        valid[b, width - n:] = 1
        starts.append(start)
    return ids, valid, starts


def restrict_vocab(logits: torch.Tensor, target_vocab_size: int,
                   suppressed_ids: torch.Tensor) -> torch.Tensor:
    """Drafter logits `[..., Vd]` -> log-probs `[..., Vt]` over the target's vocabulary."""
    vd = logits.shape[-1]
    if vd >= target_vocab_size:
        logits = logits[..., :target_vocab_size]
    else:
        pad = logits.new_full((*logits.shape[:-1], target_vocab_size - vd), float("-inf"))
        logits = torch.cat([logits, pad], dim=-1)
    logits = logits.float().clone()
    logits[..., suppressed_ids[suppressed_ids < target_vocab_size]] = float("-inf")
    return torch.log_softmax(logits, dim=-1)


@torch.no_grad()
def build_lattice(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, ks: list[int],
                  mask_token_id: int, target_vocab_size: int, shift: bool,
                  suppressed_ids: torch.Tensor | None = None) -> Lattice:
    """One bidirectional forward of `model` over `[prefix, MASK x ks[b]]` for every row b.

    input_ids, attention_mask: long `[B, L]`, left-padded prefixes. ks: B block lengths, each > 0.
    """
    if any(k <= 0 for k in ks):
        raise ValueError(f"draft length k must be > 0, got {ks}")
    if shift and int(attention_mask.sum(-1).min()) == 0:
        raise ValueError("shift=True needs a non-empty prefix: the first mask reads the last "
                         "prefix token's logits")
    ids, valid, starts = append_mask_blocks(input_ids, attention_mask, ks, mask_token_id)
    dtype = next(model.parameters()).dtype
    position_ids = (valid.cumsum(-1) - 1).clamp(min=0)  # [B, L']
    width, k_max = ids.shape[1], max(ks)
    # Only the blocks' logits are read: every block ends at the right edge, so the LM head runs on
    # the last k_max (+1 with shift) positions instead of the whole prefix (it was ~60% of the
    # forward's FLOPs for the zoo DLM at a 256-token prefix).
    keep = min(k_max + int(shift), width)
    logits = model(input_ids=ids, attention_mask=bidirectional_attention_mask(valid, dtype),
                   position_ids=position_ids, use_cache=False,
                   logits_to_keep=keep).logits  # [B, keep, Vd]
    if logits.shape[1] != keep:
        raise TypeError(f"{type(model).__name__} ignored logits_to_keep={keep} (returned "
                        f"{logits.shape[1]} positions); the lattice needs a transformers causal LM")
    if suppressed_ids is None:
        suppressed_ids = torch.tensor([mask_token_id])
    offset = width - keep  # logits column j is sequence position offset + j
    rows = []
    for b, (start, k) in enumerate(zip(starts, ks)):
        block = logits[b, start - int(shift) - offset:width - int(shift) - offset]  # [k, Vd]
        block = restrict_vocab(block, target_vocab_size, suppressed_ids.to(block.device))
        pad = block.new_full((k_max - k, target_vocab_size), float("-inf"))
        rows.append(torch.cat([block, pad]))
    lengths = torch.tensor(ks, device=ids.device)
    return Lattice(torch.stack(rows), lengths)
