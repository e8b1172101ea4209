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

from mmspec._cache_name import cache_kwargs


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


def _last(logits: torch.Tensor, keep: int, model) -> torch.Tensor:
    """The last `keep` positions of a forward's logits: a model that ignores `logits_to_keep`
    (older or remote-code DLMs) returns every position, and only the end is the blocks'."""
    if logits.shape[1] < keep:
        raise TypeError(f"{type(model).__name__} returned logits for {logits.shape[1]} positions "
                        f"where the lattice needs the last {keep}")
    return logits[:, -keep:]


@torch.no_grad()
def known_ids(ids: torch.Tensor, model, unknown_id: int) -> torch.Tensor:
    """`ids` with those past `model`'s input embedding (a drafter narrower than the target: the
    target may write ids it lacks) replaced by `unknown_id` (the mask: "a token not known")."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embed, "num_embeddings", None)
    return ids if rows is None else torch.where(ids < rows, ids, torch.full_like(ids, unknown_id))


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
    ids = known_ids(ids, model, mask_token_id)
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
    logits = _last(logits, keep, model)
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


class PrefixCache:
    """The DLM's prefix KV kept between rounds (`DiffusionDrafterConfig.prefix_cache`).

    An approximation, Fast-dLLM's prefix cache (Wu et al. 2025, arXiv 2505.22618): a bidirectional
    DLM's prefix keys and values depend on the block after it, so reusing them from an earlier round
    gives a slightly different lattice than a fresh forward. Drafting stays lossless (the target
    verifies every token); only the acceptance rate can move. `columns` and `valid` are the
    `[B, P]` token ids and 0/1 mask the cache holds keys and values for.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.kv, self.columns, self.valid = None, None, None

    def length(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
        """How many leading columns of `input_ids` the cache holds (0 when it cannot be reused)."""
        if self.kv is None or self.columns.shape[0] != input_ids.shape[0]:
            return 0
        p = self.columns.shape[1]
        if input_ids.shape[1] <= p or not (torch.equal(input_ids[:, :p], self.columns)
                                           and torch.equal(attention_mask[:, :p], self.valid)):
            return 0
        return p


@torch.no_grad()
def build_lattice_cached(model, cache: PrefixCache, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor, ks: list[int], mask_token_id: int,
                         target_vocab_size: int, shift: bool,
                         suppressed_ids: torch.Tensor | None = None) -> Lattice:
    """`build_lattice`, running the DLM only over the columns the cache does not hold plus the
    blocks, and keeping the prefix KV for the next round. Layout: `[input_ids, MASK x max(ks)]`
    with row b's masks past `ks[b]` hidden, so the engine's holes and left padding stay where they
    are and the cached columns keep their meaning.

    With `shift` the first mask reads the last column's logits. In the engine's layout that column
    is every live row's root; a row whose last column is a hole has finished, and its lattice
    (read there all the same) is never drafted from (`generate` masks finished rows' drafts), so
    it does not stop the other rows from reading the cache.
    """
    from transformers import DynamicCache

    if any(k <= 0 for k in ks):
        raise ValueError(f"draft length k must be > 0, got {ks}")
    p = cache.length(input_ids, attention_mask)
    if p == 0:
        cache.reset()
        cache.kv = DynamicCache()
    batch, k_max = input_ids.shape[0], max(ks)
    device = input_ids.device
    block_valid = (torch.arange(k_max, device=device)[None, :]
                   < torch.tensor(ks, device=device)[:, None]).long()  # [B, k_max]
    ids = torch.cat([input_ids[:, p:], torch.full((batch, k_max), mask_token_id,
                                                  dtype=torch.long, device=device)], dim=1)
    ids = known_ids(ids, model, mask_token_id)
    valid = torch.cat([attention_mask.long(), block_valid], dim=1)  # every column so far
    position_ids = (valid.cumsum(-1) - 1).clamp(min=0)[:, p:]
    dtype = next(model.parameters()).dtype
    keys = valid.bool()[:, None, None, :]  # [B, 1, 1, P + q]
    mask = torch.zeros(batch, 1, ids.shape[1], valid.shape[1], dtype=dtype, device=device)
    mask = mask.masked_fill(~keys, torch.finfo(dtype).min)
    keep = k_max + int(shift)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                   **cache_kwargs(model.forward, cache.kv), use_cache=True,
                   logits_to_keep=keep).logits
    logits = _last(logits, keep, model)
    cache.kv.crop(-k_max)  # the masks' keys and values are not part of any later prefix
    cache.columns, cache.valid = input_ids.clone(), attention_mask.clone()
    if suppressed_ids is None:
        suppressed_ids = torch.tensor([mask_token_id])
    rows = []
    for b, k in enumerate(ks):  # logits column j: with shift the last token, then the masks
        block = restrict_vocab(logits[b, :k], target_vocab_size, suppressed_ids.to(device))
        pad = block.new_full((k_max - k, target_vocab_size), float("-inf"))
        rows.append(torch.cat([block, pad]))
    return Lattice(torch.stack(rows), torch.tensor(ks, device=device))
