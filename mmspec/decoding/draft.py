"""The drafter contract: `Drafter` (`propose(state) -> Draft`, `update(result)` and the optional
capabilities the engine reads, with their defaults), `DraftState`, `Draft` and `VerifyResult`.

Two required methods, like transformers' `CandidateGenerator` (`get_candidates` /
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


class Drafter:
    """Everything the engine may ask of a drafter, with the defaults it assumes.

    Subclass it and implement `propose` and `update`; override a capability only where the
    drafter needs it. A drafter that does not subclass it (any object with `propose` and
    `update`) works too: the engine reads it through `as_drafter`, which takes what the object
    defines and these defaults for the rest. `generate` reads, in this order:

    - before the prefill: `check_target(target)`, `vocab_size` with `match_target_width(width)`
      and `top_k`, `check_inputs(model_kwargs)`, then `needs_target_hidden` and
      `target_hidden_layers` with `target_hidden_size`;
    - after the prefill's forward, before the first token: the target's hidden states there are
      checked against those two (`hidden.py`);
    - every round: `propose(state)` and `update(result)`;
    - at the end of the call (also when it raises): `end()`.

    The `mmspec generate` command also calls `to(device)`. docs/drafters.md has a worked example.
    """

    needs_target_hidden: bool = False
    """True asks for the target's hidden states (`DraftState.target_hidden`,
    `VerifyResult.target_hidden`): EAGLE / ViSpec heads draft from them."""

    target_hidden_layers: tuple[int, ...] = (-1,)
    """Entries of transformers' `hidden_states` tuple handed over when `needs_target_hidden`,
    concatenated on the feature dim: `(-1,)` is the last, normed layer; EAGLE-3 fuses a low, a
    middle and a high layer."""

    target_hidden_size: int | None = None
    """Width of each `target_hidden_layers` entry the drafter was made for (the target's hidden
    size). After the prefill's forward, before the first token, the engine refuses
    (`UnsupportedTarget`) a target whose entries are missing or not `[batch, prompt tokens,
    target_hidden_size]` (`hidden.py`); None: any width, still `[batch, prompt tokens, width]`."""

    vocab_size: int | None = None
    """Width of the drafter's token distributions. `generate` refuses a drafter whose width is
    not the target's (`VocabularyMismatch`), unless `match_target_width` takes the target's.
    None: the drafter proposes the target's own ids and no check applies (prompt lookup)."""

    top_k: int = 1
    """Children per tree node: 1 drafts chains. Where the target verifies only each draft's main
    path (`admission.py`), a drafter with `top_k > 1` is warned that the other branches are
    wasted work."""

    def propose(self, state: DraftState) -> Draft:
        """The round's draft for every row (`DraftState` says what the drafter may read)."""
        raise NotImplementedError(f"{type(self).__name__} must implement propose(state)")

    def update(self, result: VerifyResult) -> None:
        """The round's verdict (`VerifyResult`), after every `propose`. Default: nothing to learn."""

    def end(self) -> None:
        """Called once when the `generate` call is over (also when it raises): drop per-call state
        (a KV cache, ...) and undo what was changed on a model for the call; the next call
        starts at round 0 anyway. Default: nothing to drop."""

    def check_target(self, target) -> None:
        """Raise (one line) when the drafter is bound to another model than `target` (ViSpec's
        heads are trained on one target's features). Default: any target."""

    def check_inputs(self, model_kwargs: dict) -> None:
        """Raise (one line) when the call's model inputs (`pixel_values`, ...) are ones the
        drafter cannot draft for. Default: any inputs."""

    def match_target_width(self, width: int | None) -> bool:
        """`width`: the target's logit width when it differs from `vocab_size` only by padding
        (one tokenizer, output layers padded differently, `drafters/vocab.py`), else None.
        Return True to draft over `width` columns from now on (ids past the drafter's own are
        never proposed); the default, False, declines, and a drafter whose `vocab_size` is not
        the target's is refused."""
        return False

    def to(self, device) -> Drafter:
        """Move the drafter's weights to `device` (the target's); returns the drafter. Default:
        no weights."""
        return self


# the members `as_drafter` takes from a drafter that does not subclass `Drafter`
CAPABILITIES = ("needs_target_hidden", "target_hidden_layers", "target_hidden_size",
                "vocab_size", "top_k", "end", "check_target", "check_inputs",
                "match_target_width", "to")


class _DuckTyped(Drafter):
    """A drafter that does not subclass `Drafter`, behind the interface: its own members where it
    defines them (read once, when the call starts), `Drafter`'s defaults elsewhere."""

    def __init__(self, drafter):
        self.drafter = drafter
        for name in CAPABILITIES:
            own = getattr(drafter, name, _MISSING)
            if own is not _MISSING:
                setattr(self, name, own)

    def propose(self, state: DraftState) -> Draft:
        return self.drafter.propose(state)

    def update(self, result: VerifyResult) -> None:
        self.drafter.update(result)


_MISSING = object()


def require_bound_target(drafter, target) -> None:
    """`check_target` of a drafter made for one model (`drafter.target`: its embedding, LM head
    or hidden layers are that model's): ValueError (one line) for any other model. A model
    wrapped by `torch.compile` counts as itself."""
    if target is drafter.target or getattr(target, "_orig_mod", None) is drafter.target:
        return
    name = type(drafter).__name__
    raise ValueError(f"target: this {name} was loaded for another "
                     f"{type(drafter.target).__name__}; load it with "
                     f"{name}.from_pretrained(path, target) for this one")

def as_drafter(drafter) -> Drafter:
    """`drafter` as a `Drafter`: itself when it subclasses it, else a `_DuckTyped` view. Raises a
    TypeError naming what arrived when it has no `propose` method."""
    if isinstance(drafter, Drafter):
        return drafter
    if not callable(getattr(drafter, "propose", None)):
        hint = (": wrap a small model as ModelDrafter(model)"
                if isinstance(drafter, torch.nn.Module) else "")
        raise TypeError(f"drafter must be a drafter (ModelDrafter, PromptLookupDrafter, "
                        f"DiffusionDrafter, ViSpecDrafter, ...), got {type(drafter).__name__}"
                        f"{hint}")
    return _DuckTyped(drafter)
