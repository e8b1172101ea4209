"""`ModelDrafter`: a small autoregressive model with the target's vocabulary drafts a chain or a tree.

Chain (`top_k=1`): `num_tokens` tokens, one drafter forward each (Leviathan et al. 2023). Greedy by
default (a point-mass proposal); with `temperature > 0` it samples and hands its probabilities to
the verifier, which then uses the min(1, p/q) rule. With `sample=True` it samples, under a sampling
`generate` call, from the call's own warped distribution (temperature, top-k, top-p: q has the
target's form, so the drafter is judged on its logits alone) and is greedy under a greedy call.

Tree (`top_k > 1`): EAGLE-2's context-aware dynamic tree (Li et al. 2024, vispec.md §1.5), built
by `mmspec.decoding.dynamic_tree` as for ViSpec and EAGLE. Each of
`depth` levels expands the current top-k frontier by its top-k children, scores nodes by
cumulative draft log-probability, keeps the best `top_k` as the next frontier, and finally the best
`num_tokens` nodes over all levels form the tree. Frontier nodes are fed through the shared
block-sparse layer with a tree mask (so a tree drafter switches its model to the attention
implementation `mmspec_block_sparse`, which is SDPA whenever no mask is passed, from its first
`propose` of a call to `end()`, which `generate` calls when the call is over, also on error; the
switch walks every module of the model, so it is not done per round). Tree nodes are chosen,
not sampled: a point-mass proposal. The kept set is always closed under parents
(`dynamic_tree.py`).

KV cache "in step": the drafter keeps its cache in the engine's slot layout (`draft.py`). At each
round it keeps the longest prefix of cached slots that are still right (the accepted part of its
own chain survives, and its rejected tokens stay as masked holes; see `_reusable`), crops the rest
and feeds the new slots in one forward. It resets at round 0 of every `generate` call, and `end()`
drops it, so no cache outlives a call.

Compiled (`generate(compile=True)`, which hands its `CompileConfig` over in `DraftState.compile`):
a chain drafter keeps its KV in a transformers `StaticCache` and runs its steps through the model's
compiled call (`static.py`): the first round's catch-up (the prompt) eagerly, as a prefill; then
each catch-up padded to a multiple of 8 slots and each chain step of one token, every forward
against all the cache's slots through a dense 4-D mask, so two graphs serve every round; a model
with sliding windows keeps every entry and gets its window as a mask counted in positions. Trees
(their levels go through the block-sparse layer), models with recurrent state (this drafter
re-reads their whole prefix every round, above, and a padded catch-up would fold its padding into
the state), models the static path refuses (`static.unsupported`: GPT-Neo past its window, ...)
and models whose static forward differs from their own on the call's prompt (`static.probe`:
Bloom, MPT) stay eager.
"""

from __future__ import annotations

import warnings

import torch
from transformers import DynamicCache

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.kernels.hf import use_block_sparse_attention

from .. import kv_cache
from .. import static
from ..admission import UnsupportedTarget, _has_recurrent_layers
from ..draft import Draft, Drafter, DraftState, VerifyResult
from ..dynamic_tree import dynamic_tree
from ..sampling import target_probs
from ..tree import BLOCK_SIZE
from ..windows import block_masks, sliding_windows

# vispec.md §1.5: ViSpec/EAGLE-2 use depth 3 below the root, i.e. 4 draft levels
DEFAULT_TREE_DEPTH = 4


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ModelDrafter(Drafter):
    def __init__(self, model, num_tokens: int = 5, top_k: int = 1, depth: int | None = None,
                 temperature: float = 0.0, sample: bool = False):
        for name, value in (("num_tokens", num_tokens), ("top_k", top_k)):
            if not _is_int(value) or value < 1:  # a float failed inside generate, unnamed
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
        if not isinstance(sample, bool):
            raise ValueError(f"sample must be a bool, got {sample!r}")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or depth < 1):
            raise ValueError(f"depth must be None or an int >= 1, got {depth!r}")
        if (temperature > 0 or sample) and top_k > 1:
            raise ValueError("temperature > 0 or sample=True samples a chain; a top-k tree "
                             "(top_k > 1) is chosen deterministically, so it needs neither")
        if temperature > 0 and sample:
            raise ValueError(f"sample=True draws with the target's own temperature, top-k and "
                             f"top-p; temperature={temperature} would be another; pass one")
        self.model = model.eval()
        self.num_tokens = num_tokens
        self.top_k = top_k
        self.depth = depth if depth is not None else (num_tokens if top_k == 1 else DEFAULT_TREE_DEPTH)
        self.temperature = temperature
        self.sample = sample  # under a sampling call, propose from the target's warped law
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.target_width: int | None = None  # set by generate (match_target_width)
        if top_k > self.vocab_size:
            raise ValueError(f"top_k must be at most the drafter's vocabulary "
                             f"({self.vocab_size} tokens), got {top_k}")
        self.restore_attn: str | None = None  # the model's own attention while switched
        self.windows = sliding_windows(model)  # its cache keeps every entry then (windows.py)
        # linear-attention or SSM state cannot be cropped back to a slot nor branch into a tree:
        # such a model drafts chains from a fresh cache each round
        self.recurrent = _has_recurrent_layers(model)
        self.chains_only = self.recurrent  # also set where its model cannot take a tree mask
        self.cache = None
        self.compiled = None  # the model's compiled call, under generate(compile=True)
        self.masks = None  # static.masks(model) then
        self.static_len = 0  # the StaticCache's slots then
        self.fed_ids: torch.Tensor | None = None  # long [B, F] tokens behind the cached slots
        self.fed_valid: torch.Tensor | None = None  # bool [B, F]

    # ------------------------------------------------------------------ cache in the slot layout

    def _reusable(self, ids: torch.Tensor, valid: torch.Tensor) -> int:
        """How many cached slots still hold the right keys for every row.

        A slot now valid is right when it was fed with the same token and nothing before it
        changed (validity or token). A slot now invalid (padding, a rejected draft token turned
        hole) is masked, so whatever it holds is right. Rejected chain tokens thus stay cached as
        holes, and a round re-feeds only the slots after the drafter's own chain.
        """
        if self.fed_ids is None or self.fed_ids.shape[0] != ids.shape[0]:
            return 0
        m = min(self.fed_ids.shape[1], ids.shape[1] - 1)  # the root is always fed again
        fed_ids, fed_valid, ids, valid = self.fed_ids[:, :m], self.fed_valid[:, :m], ids[:, :m], valid[:, :m]
        changed = (fed_valid != valid) | (valid & (fed_ids != ids))  # [B, m]
        stale = valid & (changed.cumsum(-1) > 0)
        bad = stale.any(0).nonzero()
        return int(bad[0]) if len(bad) else m

    def _forward(self, ids, attention_mask, position_ids, mask=None):
        if self.compiled is not None and attention_mask.shape[1] > ids.shape[1]:
            return self._widen(self._static_forward(ids, attention_mask, position_ids))
        kwargs = {} if mask is None else {"block_sparse_mask": mask}
        try:
            out = self.model(input_ids=ids, attention_mask=attention_mask,
                             position_ids=position_ids,
                             **cache_kwargs(self.model.forward, self.cache), use_cache=True,
                             return_dict=True, **kwargs)
        except NotImplementedError as err:  # the kernel layer cannot carry what a layer asked
            raise UnsupportedTarget(f"ModelDrafter: its model {type(self.model).__name__} "
                                    f"cannot draft trees: {err}; use top_k=1") from err
        self.cache = output_cache(out)
        return self._widen(out.logits)

    def _static_forward(self, ids, attention_mask, position_ids):
        """The compiled forward of `ids` `[B, M]` after the `S - M` cached slots (`attention_mask`
        `[B, S]`), padded to one of two shapes (module docstring); logits `[B, M, V]`."""
        b, m = ids.shape
        start = attention_mask.shape[1] - m
        p = 1 if m == 1 else static.round_up(m, static.NODE_BUCKET)
        self.static_len = static.grow(self.cache, start + p, self.static_len)
        col = torch.arange(start + m, device=ids.device)
        causal = col <= start + torch.arange(m, device=ids.device)[:, None]  # [M, S]
        attends = attention_mask.bool()[:, None, :] & causal  # [B, M, S]
        mask = self.masks(attends, p, self.static_len, self.model.dtype,  # windows: positions
                          lambda: (position_ids, attention_mask.cumsum(-1) - 1))
        out = self.compiled(input_ids=static.padded(ids, p),
                            attention_mask=mask,  # [B, 1, P, length]
                            position_ids=static.padded(position_ids, p),
                            **cache_kwargs(self.model.forward, self.cache), use_cache=True,
                            return_dict=True)
        kv_cache.crop(self.cache, start + m)  # the padding's entries are overwritten next
        return out.logits[:, :m]

    def _widen(self, logits):
        logits = logits.float()
        width = self.target_width
        if width is not None and width != logits.shape[-1]:  # ids the target has, no more
            extra = width - logits.shape[-1]
            logits = (logits[..., :width] if extra < 0 else
                      torch.nn.functional.pad(logits, (0, extra), value=float("-inf")))
        return logits

    def match_target_width(self, width: int | None) -> bool:
        """Draft over the target's `width` logit columns (None: the drafter's own, equal to
        the target's): `generate` sets it when the two output layers are padded to different
        widths within one tokenizer, so ids past the target's rows are never drafted and the
        draft distributions have the target's width."""
        self.target_width = width
        return True

    def to(self, device) -> ModelDrafter:
        """Move the draft model to `device`."""
        self.model.to(device)
        return self

    def _catch_up(self, state: DraftState) -> torch.Tensor:
        """Feed the slots the cache lacks; returns the drafter's logits at the roots `[B, V]`."""
        ids, valid = state.input_ids, state.attention_mask.bool()
        if state.round == 0 or self.recurrent:  # a new cache (None: the model makes its own)
            # with sliding windows, a cache that keeps every entry (windows.py)
            self.cache = DynamicCache() if self.windows else None
            self.fed_ids = self.fed_valid = None
            self.compiled = None
            # the prompt, every new token and a padded catch-up of at most a draft + root
            static_len = static.round_up(
                ids.shape[1] + state.max_tokens + self.num_tokens + static.NODE_BUCKET,
                static.LENGTH_BUCKET)
            if state.compile is not None and self.top_k == 1 and not self.recurrent \
                    and static.unsupported(self.model, self.windows, static_len) is None \
                    and self._static_exact(ids, valid):
                self.static_len = static_len
                self.cache = static.static_cache(self.model, self.static_len)
                self.masks = static.masks(self.model)
                self.compiled = static.compiled_forward(self.model, state.compile)
        start = self._reusable(ids, valid)
        if self.cache is not None:
            kv_cache.crop(self.cache, start)
        pos = (valid.long().cumsum(-1) - 1).clamp_min(0)  # [B, S]
        logits = self._forward(ids[:, start:], valid.long(), pos[:, start:])
        self.fed_ids, self.fed_valid = ids, valid
        return logits[:, -1]

    # ------------------------------------------------------------------------------- drafting

    def _static_exact(self, ids, valid) -> bool:
        """Whether its model's static forward (4-D masks on a `StaticCache`) gives its own logits
        on this call's prompt (`static.probe`, kept per model): Bloom's ALiBi fails on a 4-D
        mask and MPT's counts slots, so they draft eagerly."""
        try:
            static.probe(self.model, ids, valid.long())
        except UnsupportedTarget:
            return False
        return True

    def propose(self, state: DraftState) -> Draft:
        if state.round == 0 and self.top_k > 1:
            self.chains_only = self.recurrent
            if self.recurrent:
                self._to_chains("its linear-attention or SSM state cannot branch into a tree")
        if self.top_k > 1 and not self.chains_only and self.restore_attn is None:
            self.restore_attn = use_block_sparse_attention(self.model)  # tree levels need it
        root_logits = self._catch_up(state)
        depth = min(self.depth, state.max_tokens)
        if self.top_k > 1 and not self.chains_only:
            try:
                return self._tree(state, root_logits, depth)
            except UnsupportedTarget as err:  # its first tree level, before any node is kept
                kv_cache.crop(self.cache, state.input_ids.shape[1])
                self._to_chains(str(err.__cause__ or err))
        return self._chain(state, root_logits, min(self.num_tokens, depth))

    def _to_chains(self, why: str) -> None:
        """Draft chains for the rest of the call (`top_k=1`'s drafts, `depth` long), and say so."""
        self.chains_only = True
        warnings.warn(f"ModelDrafter(top_k={self.top_k}): its model {type(self.model).__name__} "
                      f"cannot draft trees ({why}); drafting chains of up to "
                      f"{min(self.num_tokens, self.depth)} tokens instead", stacklevel=4)

    def _chain(self, state, logits, n) -> Draft:
        valid = state.attention_mask.bool()
        pos = valid.long().sum(-1, keepdim=True) - 1  # [B, 1] root position
        tokens, probs = [], []
        for i in range(n):
            if self.sample and state.sampling is not None:
                p = target_probs(logits, state.sampling)  # [B, V], as the target warps its own
                tok = torch.multinomial(p, 1, generator=state.generator)[:, 0]
                probs.append(p)
            elif self.temperature > 0:
                p = (logits / self.temperature).softmax(-1)  # [B, V]
                tok = torch.multinomial(p, 1, generator=state.generator)[:, 0]
                probs.append(p)
            else:
                tok = logits.argmax(-1)
            tokens.append(tok)
            if i + 1 < n:
                valid = torch.cat([valid, valid.new_ones(len(tok), 1)], 1)
                logits = self._forward(tok[:, None], valid.long(), pos + 1 + i)[:, -1]
                self.fed_ids = torch.cat([self.fed_ids, tok[:, None]], 1)
                self.fed_valid = valid
        return Draft.chain(torch.stack(tokens, 1), torch.stack(probs, 1) if probs else None)

    def _tree(self, state, logits, depth) -> Draft:
        valid = state.attention_mask.bool()  # [B, S]
        b, s = valid.shape
        root_pos = valid.long().sum(-1, keepdim=True) - 1  # [B, 1]
        slot_pos = valid.long().cumsum(-1) - 1  # [B, S]

        def step(tokens, features, depth, ancestors):
            """Feed the frontier `[B, K]` at tree level depth + 1 after the T = depth * K nodes
            fed before (the cache holds them past the committed slots, level by level)."""
            k, t = tokens.shape[1], ancestors.shape[2]
            eye = torch.eye(k, dtype=torch.bool, device=tokens.device).expand(b, k, k)
            token_mask = torch.cat([valid[:, None, :].expand(b, k, s), ancestors, eye], -1)

            def positions():  # queries at root + level; fed nodes by their level
                fed_pos = root_pos + 1 + torch.arange(t + k, device=tokens.device) // k
                return root_pos + depth + 1, torch.cat([slot_pos, fed_pos], -1)

            mask = block_masks(token_mask, BLOCK_SIZE, self.windows, positions)
            attn = torch.cat([valid, valid.new_ones(b, t + k)], 1).long()
            return self._forward(tokens, attn, root_pos + depth + 1, mask), None  # [B, K, V]

        draft = dynamic_tree(step, logits, None, self.top_k, depth, self.num_tokens)
        kv_cache.crop(self.cache, s)  # tree entries are not committed slots
        return draft

    def update(self, result: VerifyResult) -> None:
        """Nothing to do: `propose` re-syncs the cache from the committed slots."""

    def end(self) -> None:
        """The call is over: drop the cache and give the model back its own attention."""
        self.cache = self.fed_ids = self.fed_valid = self.compiled = None
        if self.restore_attn is not None:
            self.restore_attn()
            self.restore_attn = None
