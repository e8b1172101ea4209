"""The drafter contract: `propose(state) -> Draft`, `update(result)` and an optional `end()`.

Two methods, like transformers' `CandidateGenerator` (`get_candidates` /
`update_candidate_strategy`). The engine owns the target and the committed sequence; a drafter
only sees what is in `DraftState` and learns the verdict from `VerifyResult`.

Shapes: B rows (batch), S slots, T draft nodes per row, V vocabulary.

Slots. The engine keeps each row's committed tokens in *slots* that line up with the target's KV
cache: slot s of every row holds the token whose keys sit at cache index s. Rows accept different
numbers of tokens per round, so a row can have *holes* (slots it did not fill, `attention_mask` 0)
besides its left padding. The last slot holds each row's last committed token (the *root* of the
next draft); its keys are not cached yet, the verification forward computes them. A drafter that
keeps its own KV cache can use the same slot layout and the same `attention_mask`, with positions
`attention_mask.cumsum(-1) - 1` (what `transformers` uses for left-padded batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .sampling import SamplingConfig


@dataclass
class Draft:
    """A proposal for every row of the batch: a tree of T nodes below each row's root.

    tokens:  long `[B, T]` draft token ids (node order: parents before children).
    parents: long `[T]` (one tree shape for all rows) or `[B, T]`; `parents[i]` is node i's
             parent, -1 for a child of the root (the last committed token). A chain is
             `[-1, 0, 1, ..., T-2]`. The engine reads the shape on the host: parents on the CPU
             cost nothing, parents on an accelerator one device-to-host read a round.
    probs:   float `[B, T, V]` or None. `probs[b, i]` is the distribution node i was *sampled* from,
             given its parent and independently of its siblings (after the drafter's own
             temperature/top-k/top-p). None means a point-mass proposal (the node was chosen, not
             sampled: argmax, top-k, beam or path search). Sampling is exact either way, but only
             truthful probs make it exact, so a drafter that picks nodes deterministically must
             pass None.
    num_tokens: long `[B]` or None; row b uses only its first `num_tokens[b]` nodes (ragged
             batches). None means all T.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    probs: torch.Tensor | None = None
    num_tokens: torch.Tensor | None = None

    @classmethod
    def chain(cls, tokens: torch.Tensor, probs: torch.Tensor | None = None,
              num_tokens: torch.Tensor | None = None) -> Draft:
        t = tokens.shape[-1]
        parents = torch.arange(-1, t - 1)  # on the host: the engine reads a tree's shape there
        return cls(tokens, parents, probs, num_tokens)

    @classmethod
    def empty(cls, batch_size: int, device=None) -> Draft:
        """No draft: the round is one ordinary decoding step."""
        return cls(torch.zeros(batch_size, 0, dtype=torch.long, device=device),
                   torch.zeros(0, dtype=torch.long))  # the shape on the host, as in `chain`


@dataclass
class DraftState:
    """What a drafter sees before a round.

    input_ids:      long `[B, S]`, committed tokens in slot layout (module docstring); the last
                    column is every row's root.
    attention_mask: long `[B, S]`, 0 on left padding and on holes.
    max_tokens:     int >= 1, the most draft tokens a row can still commit this round
                    (`max_new_tokens` minus what the row has, minus the bonus token): tree depth
                    beyond it is wasted. The drafter's own budget bounds the number of nodes.
    position_ids:   long `[B, 1]`, or `[A, B, 1]` for multi-axis RoPE (Qwen2.5-VL's M-RoPE, with
                    `rope_deltas` included): the target's position of each root. A draft node at
                    tree depth d (0 for a child of the root) gets `position_ids + 1 + d`.
    round:          int, 0 on the first round of a `generate` call (reset per-call state there).
    target_hidden:  float `[B, S', H]` or None: the target's hidden states (`Drafter`) for the slots
                    committed since the previous round (the whole prompt in round 0), only when
                    the drafter sets `needs_target_hidden = True` (EAGLE/ViSpec-style drafters).
    extras:         model kwargs from the prefill (pixel_values, image_grid_thw, ...).
    generator:      the `torch.Generator` passed to `generate` (None: the global RNG), for
                    drafters that sample their drafts.
    eos_token_id:   tuple of ints or None: the `eos_token_id` passed to `generate` (the ids it
                    stops on), None when the call passed none. A drafter with its own end-of-
                    sequence rule uses these over its default, as transformers' assistant models
                    take the `generate` call's.
    sampling:       the call's `SamplingConfig` (temperature, top-k, top-p) when it samples, None
                    when it is greedy: a drafter proposing from the same warped distribution gets
                    the most accepted (`ModelDrafter(sample=True)`).
    compile:        the call's transformers `CompileConfig` under `generate(compile=True)`, else
                    None: a drafter that can run its model compiled does (`ModelDrafter` chains).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    max_tokens: int
    position_ids: torch.Tensor | None = None
    round: int = 0
    target_hidden: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)
    generator: torch.Generator | None = None
    eos_token_id: tuple[int, ...] | None = None
    sampling: SamplingConfig | None = None
    compile: object | None = None


@dataclass
class VerifyResult:
    """The verdict of one round.

    num_accepted: long `[B]`, draft tokens accepted per row (bonus token excluded).
    new_tokens:   list of B long tensors: the tokens committed this round per row, accepted
                  draft tokens followed by the target's bonus/correction token (cut at EOS and at
                  `max_new_tokens`).
    accepted_nodes: list of B long tensors: indices into the draft's nodes along the accepted path.
    target_hidden: float `[B, 1 + max(num_accepted), H]` or None: the target's last hidden states
                  of the root and the accepted nodes (right-padded), when the drafter sets
                  `needs_target_hidden = True`.
    """

    num_accepted: torch.Tensor
    new_tokens: list
    accepted_nodes: list
    target_hidden: torch.Tensor | None = None


class Drafter(Protocol):
    """Optional attributes: `needs_target_hidden: bool = False` asks for the target's hidden states
    (`DraftState.target_hidden`, `VerifyResult.target_hidden`); `target_hidden_layers` (default
    `(-1,)`, the last, normed layer) picks entries of transformers' `hidden_states` tuple,
    concatenated on the feature dim (EAGLE-3 fuses a low, a middle and a high layer).

    Optional method `end()`: `generate` calls it once when the call is over (also when it raises),
    for the drafter to drop its per-call state (KV cache, ...) and undo what it changed on its
    model for the call; the next call starts at round 0 anyway."""

    def propose(self, state: DraftState) -> Draft: ...

    def update(self, result: VerifyResult) -> None: ...
