"""The drafter contract: `propose(state) -> Draft` and `update(result)`.

Two methods, like transformers' `CandidateGenerator` (`get_candidates` /
`update_candidate_strategy`). The engine owns the target and the committed sequence; a drafter
only sees what is in `DraftState` and learns the verdict from `VerifyResult`.

Shapes: B rows (batch), T draft nodes per row, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch


@dataclass
class Draft:
    """A proposal for every row of the batch.

    tokens:  long `[B, T]` draft token ids (node order: parents before children).
    parents: long `[T]` or `[B, T]`; `parents[i]` is node i's parent, -1 for a child of the last
             committed token. A chain is `[-1, 0, 1, ..., T-2]`.
    probs:   float `[B, T, V]` or None. `probs[b, i]` is the distribution node i was drawn from
             (after the drafter's own temperature/top-k/top-p). None means a point-mass proposal;
             sampling stays exact either way.
    num_tokens: long `[B]` or None; row b uses only its first `num_tokens[b]` nodes (ragged
             batches). None means all T.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: Optional[torch.Tensor] = None
    num_tokens: Optional[torch.Tensor] = None

    @classmethod
    def chain(cls, tokens: torch.Tensor, probs: Optional[torch.Tensor] = None,
              num_tokens: Optional[torch.Tensor] = None) -> "Draft":
        t = tokens.shape[-1]
        parents = torch.arange(-1, t - 1, device=tokens.device)
        return cls(tokens, parents, probs, num_tokens)


@dataclass
class DraftState:
    """What a drafter sees before a round.

    input_ids:      long `[B, L]`, prompt plus committed tokens, left-padded.
    attention_mask: long `[B, L]`, 0 on left padding.
    max_tokens:     int, the most draft nodes the engine will verify this round.
    target_hidden:  float `[B, L', H]` or None: the target's last hidden states for tokens
                    committed since the previous round (EAGLE/ViSpec-style drafters).
    extras:         model kwargs from the prefill (pixel_values, image_grid_thw, ...).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    max_tokens: int
    target_hidden: Optional[torch.Tensor] = None
    extras: dict = field(default_factory=dict)


@dataclass
class VerifyResult:
    """The verdict of one round.

    num_accepted: long `[B]`, draft tokens accepted per row (bonus token excluded).
    new_tokens:   list of B long tensors: the tokens committed this round per row, accepted
                  draft tokens followed by the target's bonus/correction token.
    accepted_nodes: list of B long tensors: indices into the draft's nodes along the accepted path.
    target_hidden: float `[B, L', H]` or None: the target's last hidden states at the committed
                  positions (right-padded to the longest row), for EAGLE/ViSpec-style drafters.
    """

    num_accepted: torch.Tensor
    new_tokens: list
    accepted_nodes: list
    target_hidden: Optional[torch.Tensor] = None


class Drafter(Protocol):
    def propose(self, state: DraftState) -> Draft: ...

    def update(self, result: VerifyResult) -> None: ...
