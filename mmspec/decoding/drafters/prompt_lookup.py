"""`PromptLookupDrafter`: draft the tokens that followed the last n-gram's earlier occurrence.

Prompt lookup decoding (Saxena 2023; transformers' `PromptLookupCandidateGenerator`, whose rules
this follows): for n from `max_ngram_size` down to 1, find the first earlier occurrence of the
row's last n tokens in the prompt and the output so far, and propose up to `num_tokens` tokens
that came after it. No model; a chain; rows without a match draft nothing. A point-mass proposal.
"""

from __future__ import annotations

import torch

from ..draft import Draft, Drafter, DraftState, VerifyResult


class PromptLookupDrafter(Drafter):
    # transformers' defaults: prompt_lookup_num_tokens=10, max_matching_ngram_size=2
    def __init__(self, num_tokens: int = 10, max_ngram_size: int = 2):
        for name, value in (("num_tokens", num_tokens), ("max_ngram_size", max_ngram_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.num_tokens = num_tokens
        self.max_ngram_size = max_ngram_size

    def _lookup(self, seq: torch.Tensor, limit: int) -> torch.Tensor:
        """seq long `[L]` -> the continuation of the first earlier match of its suffix, `[<= limit]`."""
        for n in range(min(self.max_ngram_size, len(seq) - 1), 0, -1):
            windows = seq.unfold(0, n, 1)  # [L - n + 1, n]
            hits = (windows == seq[-n:]).all(-1).nonzero()[:, 0]
            for start in (hits + n).tolist():
                if start < len(seq):
                    return seq[start : start + limit]
        return seq[:0]

    def propose(self, state: DraftState) -> Draft:
        limit = min(self.num_tokens, state.max_tokens)
        valid = state.attention_mask.bool()
        found = [self._lookup(ids[m], limit) for ids, m in zip(state.input_ids, valid)]
        t = max(len(f) for f in found)
        tokens = state.input_ids.new_zeros(len(found), t)
        for b, f in enumerate(found):
            tokens[b, : len(f)] = f
        num = torch.tensor([len(f) for f in found], device=tokens.device)
        return Draft.chain(tokens, num_tokens=num)

    def update(self, result: VerifyResult) -> None:
        """Stateless: the next lookup sees the committed tokens in `DraftState`."""
