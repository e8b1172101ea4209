"""Hugging Face hook: run any transformers decoder's attention through `block_sparse_attention`.

`register_hf_attention()` registers the attention function `"mmspec_block_sparse"` in
transformers' `AttentionInterface` (and SDPA's mask builder under the same name). Load or switch a
model with `attn_implementation="mmspec_block_sparse"`, then pass `block_sparse_mask=` to its
forward: the keyword travels through the model's `**kwargs` to every attention layer.
`use_block_sparse_attention(model)` switches a loaded model for a block and remembers, per module,
the implementation it had: calls without a mask run that one (eager with its attention sinks and
soft-capping, SDPA, ...), so the switch alone changes no output. The mask is
for `q_len` new tokens against `kv_len = cached + new` keys, shared by all layers; a model with
sliding-window layers (Gemma 2 and 3) takes a dict `{None: mask, window: mask within it}`, from
which each layer picks by its `sliding_window` (`mmspec.decoding.windows`). Without a
`block_sparse_mask` the layer runs transformers' own SDPA attention, so prefill and ordinary decoding
are unchanged.

With a `block_sparse_mask`, that mask replaces the model's causal (and window) pattern, so a tree
or a bidirectional draft block attends as built; the `attention_mask` still hides padding: a key
the layer's own mask hides from every query is hidden from the block-sparse path too. On a
sliding-window layer that rule covers only the keys inside the last query's window, because
transformers counts the window in cache slots and hides older keys for that reason as well; the
per-window masks of the dict must hide older padding themselves (`mmspec.decoding.windows` builds
them from a token mask that does).
"""

import contextlib
import sys
import threading
import weakref

import torch

from .attention import block_sparse_attention
from .mask import BlockSparseMask
from .masks import causal_block_mask

HF_ATTENTION_NAME = "mmspec_block_sparse"


class _Audit(threading.local):
    """Attention calls inside `require_block_sparse_mask`: with and without the mask."""

    active = False
    used = 0
    dropped = 0


_AUDIT = _Audit()


@contextlib.contextmanager
def require_block_sparse_mask(model):
    """Raise after the block unless every attention call in it received the `block_sparse_mask`
    its forward was given. A model whose attention does not go through transformers'
    `AttentionInterface` (GPT-J, Bloom, CodeGen, MPT) or whose layers drop `**kwargs` (StableLM)
    would otherwise attend with its plain causal mask: a tree's siblings would see each other."""
    saved = (_AUDIT.active, _AUDIT.used, _AUDIT.dropped)
    _AUDIT.active, _AUDIT.used, _AUDIT.dropped = True, 0, 0
    try:
        yield
        used, dropped = _AUDIT.used, _AUDIT.dropped
    finally:
        _AUDIT.active, _AUDIT.used, _AUDIT.dropped = saved
    if used == 0 or dropped:
        name = type(model).__name__
        why = ("none of its attention calls received it" if used == 0 else
               f"{dropped} of {used + dropped} attention calls did not receive it")
        why += ("; its attention bypasses transformers' AttentionInterface or its layers do not "
                "pass **kwargs on")
        raise NotImplementedError(
            f"{name} cannot take block_sparse_mask: {why}. Tree drafts need it; draft chains "
            f"with this model (ModelDrafter(top_k=1), PromptLookupDrafter, DiffusionDrafter)")


def mmspec_attention_forward(module: torch.nn.Module, query, key, value, attention_mask,
                             scaling=None, dropout=0.0, block_sparse_mask=None, **kwargs):
    """transformers attention function: `query` `[B, Hq, N, D]`, `key`/`value` `[B, Hkv, Nk, D]`.

    Returns `(attn_output [B, N, Hq, D], None)`, the contract of transformers' attention functions.
    """
    indices = kwargs.pop("indices", None)  # DSA's top-k keys per query (GLM-MoE-DSA, DeepSeek-V3.2)
    if indices is not None:
        selected = torch.zeros(*indices.shape[:2], key.shape[2], dtype=torch.bool,
                               device=key.device).scatter(-1, indices.long(), True)[:, None]
        if block_sparse_mask is None:
            attention_mask = _select(attention_mask, selected, module, kwargs, query, key)
        else:
            if _AUDIT.active:  # the layer chose its keys without the tree mask: not exact
                _AUDIT.dropped += 1
            block_sparse_mask = _select_blocks(block_sparse_mask, selected, kwargs)
    if block_sparse_mask is None:
        if _AUDIT.active:
            _AUDIT.dropped += 1
        if attention_mask is None and 1 < query.shape[2] < key.shape[2] and _prefix_layer(
                module, kwargs):
            attention_mask = _written_keys(query.shape[2], key.shape[2], query.device)
        eager = _eager_fallback(module)
        if eager is not None:
            mask = _additive(attention_mask, module, kwargs, query, key.shape[2])
            return eager(module, query, key, value, mask, scaling=scaling, dropout=dropout,
                         **kwargs)
        if kwargs.get("softcap"):  # SDPA cannot soft-cap (Gemma 2): the same mask, through ours
            block_sparse_mask = _block_mask_of(attention_mask, _causal(module, kwargs),
                                               query.shape[2],
                                               key.shape[2], query.device)
            out = block_sparse_attention(query, key, value, block_sparse_mask, scale=scaling,
                                         softcap=kwargs["softcap"])
            return out.transpose(1, 2).contiguous(), None
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    window = kwargs.get("sliding_window")
    windowed = isinstance(block_sparse_mask, dict)
    if windowed:  # one mask per sliding window (None: full-attention layers)
        if window not in block_sparse_mask:
            raise ValueError(
                f"block_sparse_mask has masks for sliding windows {list(block_sparse_mask)}, but "
                f"this layer's sliding_window is {window}")
        block_sparse_mask = block_sparse_mask[window]
    if not isinstance(block_sparse_mask, BlockSparseMask):
        raise TypeError(
            f"block_sparse_mask must be a BlockSparseMask or a dict of them keyed by sliding "
            f"window, got {type(block_sparse_mask).__name__}"
        )
    if dropout and module.training:
        raise ValueError(f"block-sparse attention has no dropout, got dropout={dropout} in training")
    # what the layer would do beyond softmax(q k^T) v must not be dropped silently
    if window is not None and not windowed and key.shape[2] > window:
        raise NotImplementedError(
            f"block_sparse_mask: this is a sliding-window layer (sliding_window={window}) over "
            f"{key.shape[2]} keys, and block_sparse_attention would attend beyond the window; "
            f"pass a dict {{None: mask, {window}: mask within the window}} "
            f"(mmspec.decoding.windows.block_masks)")
    if attention_mask is not None:  # the block mask replaces the causal pattern, not padding
        block_sparse_mask = _hide_hidden_keys(block_sparse_mask, attention_mask, window)
    # Gemma 2 soft-caps its logits (attn_logit_softcapping; None elsewhere)
    sinks = kwargs.get("s_aux")
    out = block_sparse_attention(query, key, value, block_sparse_mask, scale=scaling,
                                 softcap=kwargs.get("softcap") or None,
                                 return_lse=sinks is not None)
    if sinks is not None:
        out = _with_sinks(*out, sinks)
    if _AUDIT.active:
        _AUDIT.used += 1
    return out.transpose(1, 2).contiguous(), None


def _select(attention_mask, selected, module, kwargs, query, key):
    """The layer's mask, limited to the keys DSA selected (`selected` bool `[B, 1, Nq, Nk]`), in
    the mask's own format: what the model does itself under eager and SDPA."""
    if attention_mask is None:
        attention_mask = _additive(None, module, kwargs, query, key.shape[2])
    if attention_mask is None:
        return selected
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., :key.shape[2]] & selected
    return attention_mask[..., :key.shape[2]].masked_fill(~selected,
                                                          torch.finfo(query.dtype).min)


def _select_blocks(block_sparse_mask, selected, kwargs):
    """`block_sparse_mask` (or this layer's mask of a window dict) limited to the selected keys."""
    if isinstance(block_sparse_mask, dict):
        window = kwargs.get("sliding_window")
        block_sparse_mask = {**block_sparse_mask, window: _select_blocks(
            block_sparse_mask[window], selected, {})}
        return block_sparse_mask
    dense = block_sparse_mask.to_dense()  # [B, H, Nq, Nk]
    return BlockSparseMask.from_token_mask(dense & selected, block_sparse_mask.block_size)


def _with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention sinks (GPT-OSS, Granite-SWA, MiMo-V2: `s_aux`, one logit per head that joins the
    softmax's denominator and attends to nothing): the rows computed without them, scaled by
    `exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink)`.
    out `[B, Hq, Nq, D]`, lse fp32 `[B, Hq, Nq]`, sinks `[Hq]`."""
    keep = torch.sigmoid(lse - sinks.float()[None, :, None])  # [B, Hq, Nq]
    return (out.float() * keep[..., None]).to(out.dtype)


def _eager_fallback(module):
    """The modeling file's own `eager_attention_forward` where the module ran eager attention
    before `use_block_sparse_attention` (GPT-OSS's and Granite-SWA's attention sinks live only
    there); else None (SDPA)."""
    if getattr(module, "_mmspec_former_attention", None) != "eager":
        return None
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _additive(attention_mask, module, kwargs, query, kv_len: int):
    """transformers' eager functions add the mask to the scores: bool (SDPA's format, which this
    attention name builds) -> 0 / dtype minimum; None where SDPA would have run `is_causal` ->
    that causal mask spelled out (`_sdpa_causal`)."""
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            return attention_mask
        return additive_mask(attention_mask, query.dtype)
    q_len = query.shape[2]
    if not _causal(module, kwargs) or q_len == 1:
        return None
    return additive_mask(_sdpa_causal(q_len, kv_len, query.device), query.dtype)


def _causal(module, kwargs) -> bool:
    """Whether SDPA would attend causally where transformers passes no mask: the call's
    `is_causal`, else the module's (False in bidirectional layers: PaliGemma's prefix)."""
    causal = kwargs.get("is_causal")
    return getattr(module, "is_causal", True) if causal is None else causal


def _prefix_layer(module, kwargs) -> bool:
    """A bidirectional layer in a model whose config is causal (PaliGemma: its Gemma layers'
    `is_causal` is False, so a mask-less prefill attends over the whole prompt): its masks come
    from transformers' causal mask builder, which leaves the mask out for several queries against
    more keys only in a prefill into an empty `StaticCache` (`_sdpa_causal`). Where the config is
    not causal (diffusion LMs), the bidirectional builder leaves it out over a cached prefix too."""
    config = getattr(module, "config", None)
    return not _causal(module, kwargs) and getattr(config, "is_causal", True) is not False


def _written_keys(q_len: int, kv_len: int, device) -> torch.Tensor:
    """bool `[1, 1, 1, Nk]`: the first `q_len` keys, the ones a prefill into an empty
    `StaticCache` wrote (the rest are unwritten slots), for a `_prefix_layer`."""
    return (torch.arange(kv_len, device=device) < q_len)[None, None, None]


def _sdpa_causal(q_len: int, kv_len: int, device) -> torch.Tensor:
    """bool `[1, 1, Nq, Nk]`: SDPA's `is_causal`, aligned top-left (query i sees keys 0..i).
    transformers leaves the mask out for it where queries and keys are the same tokens, or, with
    more keys than queries, only in a prefill into an empty `StaticCache`, whose keys past the
    queries are unwritten slots (`compile=True`); bottom-right would attend to those."""
    return (torch.arange(kv_len, device=device) <= torch.arange(q_len, device=device)[:, None]
            )[None, None]


def additive_mask(attends: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = attend) -> the additive form eager attention adds to its scores: 0 where
    it attends, the dtype's minimum elsewhere."""
    return torch.zeros((), dtype=dtype, device=attends.device).masked_fill(
        ~attends, torch.finfo(dtype).min)


def _block_mask_of(attention_mask, causal: bool, q_len: int, kv_len: int,
                   device) -> BlockSparseMask:
    """The block mask of what SDPA would attend: transformers' bool mask (True = attend, padding
    and sliding windows included) or, where it left it out, causal or full attention."""
    if attention_mask is None:
        if causal and q_len > 1:
            return causal_block_mask(q_len, kv_len, 64, device=device, offset=0)  # _sdpa_causal
        return BlockSparseMask.from_token_mask(
            torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device), 64)
    return BlockSparseMask.from_token_mask(_attends(attention_mask, kv_len), 64)


def _attends(attention_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """bool `[B, 1|H, Nq, kv_len]` from transformers' mask: bool (True = attend) or additive float
    (0 = attend, its dtype's minimum or -inf = hidden); HF may build it wider than the keys."""
    attention_mask = attention_mask[..., :kv_len]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    attends = attention_mask == 0
    hidden = attention_mask <= torch.finfo(attention_mask.dtype).min
    if not (attends | hidden).all():
        bad = attention_mask[~(attends | hidden)][0].item()
        raise NotImplementedError(
            f"attention_mask: block-sparse attention can only attend or hide keys (0, or "
            f"{attention_mask.dtype}'s minimum / -inf, in an additive mask), got the bias {bad}")
    return attends


class _LastCombined(threading.local):
    """Per sliding window (None: full layers), the last `_hide_hidden_keys` call: weak references
    to its two masks, its result and the masks' version counters. Every layer of a forward
    passes the same two masks, so the combination is built once per forward, not per layer."""

    def __init__(self):
        self.by_window = {}


_LAST_COMBINED = _LastCombined()


def _hide_hidden_keys(mask: BlockSparseMask, attention_mask: torch.Tensor,
                      window) -> BlockSparseMask:
    """`mask` without the keys that `attention_mask` hides from every query (padding, holes);
    on a sliding-window layer only among the keys inside the last query's window (see the module
    docstring)."""
    versions = _versions(mask, attention_mask)  # an in-place edit is another mask
    last = _LAST_COMBINED.by_window.get(window)
    if (versions is not None and last is not None and last[0]() is mask
            and last[1]() is attention_mask and last[3] == versions):
        return last[2]
    kv_len = mask.kv_len
    hidden = ~_attends(attention_mask, kv_len).any(-2, keepdim=True)  # [B, 1|H, 1, kv_len]
    if window is not None:
        hidden &= torch.arange(kv_len, device=hidden.device) >= kv_len - window
    combined = mask
    if hidden.any():
        dense = mask.to_dense()
        # the engine's masks already hide them (`verify_mask`): skip the rebuild
        if (dense & hidden).any():
            combined = BlockSparseMask.from_token_mask(dense & ~hidden, mask.block_size)
    if versions is not None:
        _LAST_COMBINED.by_window[window] = (weakref.ref(mask), weakref.ref(attention_mask),
                                            combined, versions)
    return combined


def _versions(mask: BlockSparseMask, attention_mask: torch.Tensor):
    """The version counters of both masks' tensors, or None where there are none to trust
    (inference tensors, tracing): then nothing is cached, and under `torch.inference_mode` the
    combination is rebuilt in every layer (`mmspec.generate` runs under `no_grad`, where it is
    kept). Found in a trial: a 4-D mask edited in place between two forwards was answered with
    the combination of its old contents."""
    versions = mask.versions()
    if versions is None or attention_mask.is_inference():
        return None
    return versions + (attention_mask._version,)


def use_block_sparse_attention(model):
    """Switch `model` to this attention function; returns a function that switches it back.

    Each module that has a config keeps the implementation it ran (`_mmspec_former_attention`),
    which the function runs for calls without a `block_sparse_mask`."""
    name = register_hf_attention()
    former = model.config._attn_implementation
    if former == name:
        return lambda: None
    for module in model.modules():
        implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if isinstance(implementation, str):
            module._mmspec_former_attention = implementation
    model.set_attn_implementation(name)

    def restore():
        if model.config._attn_implementation != former:
            model.set_attn_implementation(former)

    return restore


def register_hf_attention() -> str:
    """Register the attention function with transformers; returns its name. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(HF_ATTENTION_NAME, mmspec_attention_forward)
    AttentionMaskInterface.register(HF_ATTENTION_NAME, sdpa_mask)
    return HF_ATTENTION_NAME
