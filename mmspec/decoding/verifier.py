"""The target's side of a `generate` call: `Verifier`, the interface the round loop runs the
target through, and `DynamicVerifier`, its eager implementation (`compile=False`).

`compile=True` runs the other one, `static.StaticVerifier` (a `StaticCache`, one compiled
forward shape). `generate.run` picks one of the two, once; the loop (`loop.py`) does not know
which it runs. A call goes:

    verifier.admit(...)                 before the prefill: refusals, the target's probe
    verifier.open(prompt_len, n)        allocate what the call needs
    verifier.prefill_cache()            the cache the prompt forward fills
    verifier.adopt(cache)               the cache it returned; whether it holds recurrent state
    every round:
        verifier.prepare(tree, slots)   the engine's work before the forward (the tree mask)
        verifier.forward(...)           the target's verification forward: logits of every node
        verifier.replay(tree, k, slots) recurrent targets, after a rejection: the k committed
                                        tokens fed again (`recurrent.py`)
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import torch

from mmspec._cache_name import cache_kwargs
from mmspec.kernels.hf import additive_mask, require_block_sparse_mask

from . import admission
from . import recurrent as rec
from .tree import verify_mask, verify_token_mask


class Verifier:
    """How the target runs in one `generate` call: the cache it fills and its verification
    forward. `probe`: the target's `admission.Probe` (None before `admit`, or where the prompt
    is too short to probe); `cache`: the target's cache after `adopt`; `compile_config`: the
    transformers `CompileConfig` a drafter may compile its own model with
    (`DraftState.compile`), None when the call is not compiled."""

    compile_config = None

    def __init__(self, target, windows: tuple):
        self.target, self.windows = target, windows
        self.probe: admission.Probe | None = None
        self.cache = None

    def admit(self, drafter, input_ids, attention_mask, max_new_tokens: int) -> None:
        """Before the prefill: refuse (`admission.UnsupportedTarget`, one line) what this way of
        running the target cannot verify exactly, and set `probe`."""
        self.probe = admit_target(self.target, drafter, input_ids, attention_mask, self.windows,
                                  max_new_tokens)

    def open(self, prompt_len: int, max_new_tokens: int) -> None:
        """Allocate what the call needs (a static cache, a compiled forward). Default: nothing."""

    def prefill_cache(self):
        """The cache the prompt forward fills (None: the model makes its own)."""
        raise NotImplementedError

    def adopt(self, cache) -> bool:
        """Keep the cache the prefill returned, refusing one the engine cannot roll back;
        returns whether it holds recurrent state (linear attention, SSM: `recurrent.py`)."""
        raise NotImplementedError

    def prepare(self, tree, slots):
        """The engine's share of a round before the forward, timed as the engine's (the
        dynamic path's tree mask); its result goes to `forward`."""
        raise NotImplementedError

    def forward(self, tree, slots, prepared, need_hidden: bool):
        """The verification forward of every row's root and draft `tree` (N nodes) against the
        committed `slots`; returns `.logits` `[B, N, V]` and, with `need_hidden`,
        `.hidden_states` (transformers' tuple, each `[B, N, H]`)."""
        raise NotImplementedError

    def replay(self, tree, k: int, slots) -> None:
        """Recurrent targets, after `recurrent.restore` and the attention layers cut back to the
        round's start: feed the first `k` nodes of the verified chain `tree` again."""
        raise NotImplementedError


class DynamicVerifier(Verifier):
    """`compile=False`: the model's own cache (its `DynamicCache`, or one that keeps every entry
    of sliding-window layers, `windows.py`), and each tree verified through the shared
    block-sparse layer (`block_sparse_mask=`), as a dense 4-D mask where the probe found only
    that exact, or through the model's own causal mask for a chain."""

    def prefill_cache(self):
        return admission.engine_cache(self.target, self.windows)

    def adopt(self, cache) -> bool:
        self.cache = cache
        self.recurrent = admission.check_cache(self.target, cache)  # before the first token
        return self.recurrent

    def prepare(self, tree, slots):
        """The block-sparse mask of `tree`, or None where the model's own causal attention is
        exact (a chain without windows, `tree.py`)."""
        mask = None
        if not tree.is_chain or self.windows:
            mask = verify_mask(tree, slots.cache_valid, self.windows)
        if self.recurrent and mask is not None:
            raise admission.UnsupportedTarget(
                f"{type(self.target).__name__}: its cache holds recurrent state (linear "
                f"attention or SSM), through which a draft tree's branches would mix; draft "
                f"chains (ModelDrafter(top_k=1), PromptLookupDrafter)")
        return mask

    def forward(self, tree, slots, prepared, need_hidden: bool):
        target, probe, mask = self.target, self.probe, prepared
        kwargs, audit = {}, nullcontext()
        attn = torch.cat([slots.cache_valid, torch.ones_like(tree.valid)], 1).long()  # [B, C + N]
        if mask is not None and probe is not None and probe.tree_mode is None:
            refuse_trees(type(target).__name__, probe)
        if mask is not None and probe is not None and probe.tree_mode == "dense_4d":
            dtype = next(target.parameters()).dtype
            attn = additive_mask(verify_token_mask(tree, slots.cache_valid),  # [B, N, C + N]
                                 dtype)[:, None]  # [B, 1, N, C + N]
        elif mask is not None:
            kwargs["block_sparse_mask"] = mask
            audit = require_block_sparse_mask(target)  # lossless only if every layer applies it
        try:
            with audit:
                return target(input_ids=tree.tokens, attention_mask=attn,
                              position_ids=slots.root_pos + tree.depth * tree.valid,  # [..., B, N]
                              **cache_kwargs(target.forward, self.cache), use_cache=True,
                              output_hidden_states=need_hidden, return_dict=True, **kwargs)
        except NotImplementedError as err:  # the kernel layer cannot carry what a layer asked
            if isinstance(err, admission.UnsupportedTarget):
                raise
            raise admission.UnsupportedTarget(f"{type(target).__name__}: {err}") from err

    def replay(self, tree, k: int, slots) -> None:
        rec.replay(self.target, tree.tokens[:, :k],
                   slots.root_pos + torch.arange(k, device=tree.tokens.device),
                   torch.cat([slots.cache_valid, tree.valid[:, :k]], 1).long(),
                   cache_kwargs(self.target.forward, self.cache))


def admit_target(target, drafter, input_ids, attention_mask, windows, max_new_tokens: int,
                 chunks_masked: bool = False):
    """The target's probe (`admission.py`), and the refusals it implies for this call, before the
    prefill: a batch whose rows would leave holes, a tree drafter (or any round through a mask,
    with sliding windows) where no tree verification is exact. `chunks_masked`: `compile=True`,
    whose masks cut chunked layers to their chunks."""
    admission.check_length(target, input_ids.shape[1] + max_new_tokens,
                           chunks_masked=chunks_masked)
    probe = admission.probe(target, input_ids, attention_mask, windows)
    if probe is None:
        return None
    name = type(target).__name__
    if probe.tree_mode is None and windows:
        refuse_trees(name, probe, windows)
    if probe.tree_mode is None and drafter.top_k > 1:
        warnings.warn(
            f"{name}: a draft tree verified in one forward does not give this model's own "
            f"logits ({probe.why}); each round verifies the tree's main path only (the first "
            f"child at every depth), exact but with fewer tokens accepted: draft chains "
            f"(top_k=1) to spend no work on other branches", stacklevel=5)
    return probe


def refuse_trees(name, probe, windows=()):
    if windows:  # every round goes through a mask, chains too
        raise admission.UnsupportedTarget(
            f"{name}: verification through a mask (needed by its sliding windows {windows}) "
            f"does not give this model's own logits ({probe.why}); use target.generate")
    raise admission.UnsupportedTarget(
        f"{name}: a draft tree verified in one forward does not give this model's own logits "
        f"({probe.why}); draft chains with it (ModelDrafter(top_k=1), PromptLookupDrafter)"
        f" or use target.generate")
