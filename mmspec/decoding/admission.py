"""Before the first token: can this target be decoded exactly, and how are its trees verified?

`generate` is lossless only where everything the engine changes about the target is invisible in
its logits: the attention switch, the cache it substitutes, the tree (or hole) mask it passes and
the positions it gives. Models differ in ways no flag reports (positions taken from the cache
length instead of `position_ids` in the BART family, ALiBi counted in cache slots in MPT and
Bloom, attention that bypasses transformers' interface, recurrent state outside the KV cache), so
instead of trusting a list, the engine *probes* each target once (per dtype and attention
implementation) on a few tokens of the call's own prompt (one is enough):

- first, what every call needs, refused with one line before the first token whatever the
  prompt's length: a cache of the transformers `Cache` class (`check_cache_class`: xLSTM keeps
  its own), and a `chain` x, y, z after a prefill, fed as chains are verified (the model's own
  attention, a 2-D `attention_mask` over cache and chain) against its own one-token steps. A
  forward that fails there (Mamba multiplies the new tokens by the whole mask) fails at every
  shape, so it is tried before any comparison whose verdict a tiny model's numbers could sway.
- `tree`: a prefill, then one forward of three nodes below the root (siblings x and y, z a child
  of y) through the tree mask, against the model's own plain forwards of `prompt + x` and
  `prompt + y + z`. Tried with `block_sparse_mask` (the shared kernel layer) and, where that is
  not exact, with a dense 4-D `attention_mask` (models whose layers bypass the interface often
  take one; not with sliding windows, which need a mask per layer).
- `holes`: `prompt + x`, then `y, z` with x hidden by the 2-D `attention_mask`, as a batch row
  that rejected x has it: needed by batches of more than one row.

Trees pass with the first mode that is exact. Where none is, the engine verifies each draft's
main path (`tree.main_path`: a chain is exact on any model whose own steps are), and where holes
are not exact, the rows of a batch commit alike (`loop.even_commit`), leaving none; only a
model with sliding windows, whose chains too go through a mask, is refused with `UnsupportedTarget`
before its first token. `check_cache` refuses states the engine cannot roll back.
Tolerance: the probe compares logits of the same computation in two layouts, so it allows
`rtol` on the largest logit of 1e-4 in fp32 and 2e-2 in half types; 1e-3 in fp32 where the
model's own multi-token and one-token steps are compared (a chunked linear-attention scan and its
one-token steps sum in other orders: ~1e-4 apart in Jamba). A target with linear-attention or SSM
layers gets no tree or hole verification without measuring it: their state cannot branch.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache, EncoderDecoderCache, GenerationConfig
from transformers.cache_utils import (
    DummyLayer,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.kernels.hf import (
    additive_mask,
    require_block_sparse_mask,
    use_block_sparse_attention,
)

from .positions import engine_positions, prefill_position_ids
from .tree import BLOCK_SIZE
from .windows import block_masks


class UnsupportedTarget(NotImplementedError):
    """The target cannot be decoded exactly this way; raised before the first token, naming the
    reason and what to do instead."""


def engine_cache(model, windows):
    """The cache `generate` prefills: None (the model's own) without sliding windows; with them,
    the model's own layer layout with its sliding layers replaced by full `DynamicLayer`s, which
    keep every entry (`windows.py`) while other special layers (KV sharing) stay."""
    if not windows:
        return None
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer else layer
                    for layer in cache.layers]
    return cache


def check_length(model, length: int, chunks_masked: bool = False) -> None:
    """Refuse a call whose `length` (prompt plus max_new_tokens, in cache slots) passes what the
    engine verifies exactly. Llama 4's chunked layers attend within blocks of
    `attention_chunk_size` tokens counted in cache slots; the engine masks them as full causal
    attention, the same while one block holds the whole sequence (`chunks_masked`: the static
    path of `compile=True` masks the chunks themselves, `static.masks`). DSA models
    (DeepSeek-V3.2, GLM-MoE-DSA: `index_topk`) attend to the top-k keys their indexer picks;
    past `index_topk` tokens, transformers' forward over several new tokens picks other keys
    than its one-token decode step (seen in the architecture sweep with a small `index_topk`),
    so a verification forward cannot equal `generate` there."""
    config = model.config.get_text_config()
    chunk = getattr(config, "attention_chunk_size", None)
    if (isinstance(chunk, int) and length > chunk and not chunks_masked
            and "chunked_attention" in (getattr(config, "layer_types", None) or ())):
        raise UnsupportedTarget(
            f"{type(model).__name__}: its chunked-attention layers attend within blocks of "
            f"{chunk} tokens (attention_chunk_size), which the engine verifies as full causal "
            f"attention, exact only while the whole sequence fits one block; this call reaches "
            f"{length} tokens: keep the prompt plus max_new_tokens within {chunk} or use "
            f"target.generate")
    topk = getattr(config, "index_topk", None)
    if isinstance(topk, int) and length > topk:
        raise UnsupportedTarget(
            f"{type(model).__name__}: its sparse attention keeps the top {topk} keys "
            f"(index_topk), and past {topk} tokens its forward over several new tokens selects "
            f"other keys than its one-token decode step, so verification cannot equal its "
            f"generate; this call reaches {length} tokens: keep the prompt plus max_new_tokens "
            f"within {topk} or use target.generate")


_RECURRENT = "recurrent state (linear attention, SSM or convolution)"


def check_cache_class(model, cache) -> Cache:
    """Refuse, by its class's name, a cache that is not a transformers `Cache` (xLSTM keeps an
    `xLSTMCache` of its own, which no `DynamicCache` the engine hands it can stand in for), or
    none; returns the decoder's self-attention cache."""
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
    if cache is None or not isinstance(cache, Cache):
        kind = "no cache" if cache is None else f"a {type(cache).__name__}"
        raise UnsupportedTarget(
            f"{type(model).__name__} returns {kind} from its forward, not a transformers Cache "
            f"of key/value layers; speculative decoding must roll rejected tokens back out of "
            f"it: use target.generate for this model")
    return cache


def check_cache(model, cache) -> bool:
    """After the prefill: refuse a cache holding state that the engine cannot roll back to the
    accepted length (`kv_cache.commit_path` gathers and crops `DynamicLayer`s; `recurrent.py`
    replays linear-attention layers). Returns whether it holds recurrent state."""
    name = type(model).__name__
    fix = "use target.generate for this model"
    cache = check_cache_class(model, cache)
    if type(cache) is not DynamicCache:
        raise UnsupportedTarget(
            f"{name} keeps state in a {type(cache).__name__} beyond its key/value layers, which "
            f"the engine cannot roll back to the accepted tokens: {fix}")
    recurrent = False
    for layer in cache.layers:
        if type(layer) in (DynamicLayer, DynamicIndexedLayer, DummyLayer):
            continue
        kind = type(layer).__name__
        if type(layer) in (LinearAttentionLayer, LinearAttentionAndFullAttentionLayer):
            recurrent = True
            continue
        what = _RECURRENT if "Linear" in kind else f"{kind} entries"
        raise UnsupportedTarget(
            f"{name}: its cache holds {what} ({kind}), which the engine cannot yet roll back to "
            f"the accepted tokens (only key/value layers, and linear-attention layers beside "
            f"full attention, are): {fix}")
    return recurrent


@dataclass(frozen=True)
class Probe:
    tree_mode: str | None  # "block_sparse", "dense_4d", or None: no tree verification is exact
    holes: bool  # a row whose rejected tokens stay as masked holes verifies exactly
    why: str  # what the failed probes saw


_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def probe(target, input_ids, attention_mask, windows) -> Probe | None:
    """The target's `Probe`, measured once per (dtype, attention implementation), before the
    engine switches its attention; None where the prompt has no text token to probe
    with (trees then go through `block_sparse_mask` under the audit of
    `require_block_sparse_mask`). Raises `UnsupportedTarget` where the switch alone changes a
    plain forward or the model cannot verify several tokens after its cache at all."""
    def measure():
        with engine_positions(target):  # as the engine runs it
            return _measure(target, input_ids, attention_mask, windows)

    return cached_probe(target, windows, measure)


def cached_probe(target, kind, measure):
    """`measure()`'s result, kept per target, dtype, attention implementation and `kind`; an
    `UnsupportedTarget` result is raised (each call of the refused target raises it again)."""
    key = (next(target.parameters()).dtype, target.config._attn_implementation, kind)
    known = _PROBES.setdefault(target, {})
    if key not in known:
        known[key] = measure()
    if isinstance(known[key], UnsupportedTarget):
        raise known[key]
    return known[key]


def _has_recurrent_layers(target) -> bool:
    """Whether the model's own cache layout holds linear-attention, SSM or convolution state."""
    layers = getattr(DynamicCache(config=target.config), "layers", ())
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers)


def _probe_tokens(target, input_ids, attention_mask) -> torch.Tensor | None:
    """Up to 12 of the first row's last real tokens and three more for x, y, z, avoiding the
    config's special multimodal ids (an image token without its image fails the forward)."""
    row = input_ids[0][attention_mask[0].bool()]
    special = set()
    for config in (target.config, target.config.get_text_config()):
        for name, value in vars(config).items():
            if isinstance(value, int) and any(k in name for k in ("image", "video", "audio")):
                special.add(value)
    if special:
        row = row[~torch.isin(row, torch.tensor(sorted(special), device=row.device))]
    if len(row) < 1:
        return None
    prompt = row[-12:]
    extra = torch.stack([prompt[0], prompt[len(prompt) // 2], prompt[-1]])
    return torch.cat([prompt, extra])[None]  # [1, n + 3]


def _close(a, b, fp32_tol: float = 1e-4) -> bool:
    tol = fp32_tol if a.dtype == torch.float32 else 2e-2
    scale = max(float(b.float().abs().max()), 1.0)
    return bool(((a.float() - b.float()).abs() <= tol * scale).all())


def _positions(target, ids):
    return prefill_position_ids(target, ids, torch.ones_like(ids), {})  # [..., 1, L]


def _plain(target, ids):
    return target(input_ids=ids, position_ids=_positions(target, ids), use_cache=False,
                  return_dict=True).logits[0]


def reference_logits(target, ids):
    """The model's own plain forwards, in its own attention implementation, for the probe's
    `prompt + x` and `prompt + y + z` (`ids` from `_probe_tokens`): the logits of `prompt + x`
    `[n + 1, V]`, those of y and z `[2, V]`, and the three nodes' `[3, V]` (x, y, z)."""
    n = ids.shape[1] - 3
    plain = _plain(target, ids[:, :n + 1])
    ref_yz = _plain(target, torch.cat([ids[:, :n], ids[:, n + 1:]], 1))[-2:]
    return plain, ref_yz, torch.cat([plain[-1:], ref_yz])


# what a model's forward raises on inputs it cannot take (shapes, masks, cache use)
_FAILURES = (RuntimeError, ValueError, IndexError, TypeError, AssertionError)


def _measure(target, input_ids, attention_mask, windows):
    ids = _probe_tokens(target, input_ids, attention_mask)
    if ids is None:
        return None
    n = ids.shape[1] - 3
    name = type(target).__name__
    try:
        with torch.no_grad():
            # a model with its own cache class, before any DynamicCache is handed to it
            check_cache_class(target, _prefill(target, ids[:, :n], windows))
            plain, ref_yz, want = reference_logits(target, ids)
            steps = _own_steps(target, ids)  # [2, 3, V]: several tokens at once, one by one
            restore = use_block_sparse_attention(target)
            try:
                # first, as chains run it: a forward that fails fails at every shape
                chain = None if windows else _chain_forward(target, ids)
                refusal = _refusal(target, ids, windows, plain, steps, chain)
                if refusal is not None:
                    return refusal
                mode, holes, why = _tree_modes(target, ids, windows, want, ref_yz)
            finally:
                restore()
    except UnsupportedTarget as err:
        return err
    except _FAILURES as err:  # whatever the shapes: a forward verification runs cannot run
        line = (str(err).splitlines() or [""])[0][:200]
        return UnsupportedTarget(
            f"{name}: a forward of several new tokens after its cache, as verification runs it, "
            f"failed in the engine's probe ({type(err).__name__}: {line}); use target.generate")
    if _has_recurrent_layers(target):  # a tiny model's state may move its logits too little to see
        mode, holes = None, False
        why.append("linear-attention or SSM state cannot branch or skip a hole")
    elif not holes:
        why.append("rows with holes: other logits than its own forward")
    return Probe(mode, holes, "; ".join(why))


def _refusal(target, ids, windows, plain, steps, chain) -> UnsupportedTarget | None:
    """Why no verification forward can equal the model's generate, or None: its one-token steps
    against its full forward (windows), its generate, its multi-token forward after its cache,
    the attention switch, and the `chain` forward (`_chain_forward`); under the switch."""
    n, name = ids.shape[1] - 3, type(target).__name__
    if windows and not _close(steps[1][:1], plain[-1:]):  # x, one step after the prompt
        return UnsupportedTarget(
            f"{name}: its own cached decoding disagrees with its full forward past its "
            f"sliding window {windows} (its cache drops keys its attention mask keeps), "
            f"so no verification can equal its generate; use target.generate")
    if not _generate_agrees(target, ids[:, :n], plain):
        return UnsupportedTarget(
            f"{name}: its own generate picks other tokens than its forward's argmax on "
            f"the same sequence (its generation does something its forward does not), "
            f"so verification by forward cannot equal its generate; use target.generate")
    if not _close(steps[0], steps[1], fp32_tol=1e-3):  # another summation order
        return UnsupportedTarget(
            f"{name}: its own forward over several new tokens after its cache gives "
            f"other logits than its one-token steps (which its generate runs), so no "
            f"verification forward can equal its generate; use target.generate")
    if not _close(_plain(target, ids[:, :n + 1]), plain):
        return UnsupportedTarget(
            f"{name}: switching its attention to {target.config._attn_implementation}"
            f" changes a plain forward on the prompt (its layers compute something "
            f"the kernel layer lacks); use target.generate")
    if chain is not None and not _close(chain, steps[1], fp32_tol=1e-3):
        return UnsupportedTarget(
            f"{name}: its forward of a chain after its cache, given the 2-D attention_mask "
            f"over cache and chain that verification passes, gives other logits than its "
            f"one-token steps (which its generate runs); use target.generate")
    return None


def _tree_modes(target, ids, windows, want, ref_yz):
    """Under the switch: the first tree mode that gives the nodes' own logits `want` (None if
    none), whether a row with a hole gives `ref_yz`, and what the failed modes saw."""
    tree_ok, why = {}, []
    for mode in ("block_sparse", "dense_4d"):
        if mode == "dense_4d" and windows:
            break
        try:
            got = _tree_forward(target, ids, windows, mode)
        except _FAILURES as err:  # e.g. a layer that cannot take a 4-D mask
            got = f"its forward failed ({type(err).__name__})"
        tree_ok[mode] = isinstance(got, torch.Tensor) and _close(got, want)
        if tree_ok[mode]:
            break
        why.append(f"{mode}: " + (got if isinstance(got, str)
                                  else "other logits than its own forward"))
    mode = next((m for m, ok in tree_ok.items() if ok), None)
    try:
        holes = (mode == "block_sparse") if windows else _close(
            _hole_forward(target, ids), ref_yz)
    except _FAILURES:  # a recurrent layer's state cannot take the hole
        holes = False
    return mode, holes, why


def _generate_agrees(target, prompt, plain) -> bool:
    """The model's own greedy `generate` (2 tokens, EOS off) against the argmax of its plain
    forward over the result, up to the tolerance of `_close` (a near-tie may go either way)."""
    try:
        plain_greedy = GenerationConfig(max_new_tokens=2, do_sample=False, pad_token_id=0)
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt),
                              generation_config=plain_greedy)  # no processors: the argmax
    except _FAILURES:  # a generate that needs more than token ids: no claim either way
        return True
    n = prompt.shape[1]
    if out.shape[1] < n + 2:  # stopped at an EOS: compare what was made
        return True
    logits = _plain(target, out[:, :n + 1])[n - 1:n + 1]  # [2, V]: what picked each token
    picked = logits.gather(-1, out[0, n:n + 2, None].to(logits.device))[:, 0]
    best = logits.max(-1).values
    tol = 1e-3 if logits.dtype == torch.float32 else 2e-2
    return bool((best - picked <= tol * max(float(best.abs().max()), 1.0)).all())


def _own_steps(target, ids):
    """The model's own cache and attention: logits of x, y, z fed at once after the prompt, and
    fed one at a time; `[2, 3, V]`."""
    n = ids.shape[1] - 3
    out = []
    for chunks in ((slice(n, n + 3),), (slice(n, n + 1), slice(n + 1, n + 2), slice(n + 2, n + 3))):
        cache = DynamicCache(config=target.config)
        kwargs = cache_kwargs(target.forward, cache)
        target(input_ids=ids[:, :n], position_ids=_positions(target, ids[:, :n]),
               use_cache=True, **kwargs)
        pos = _positions(target, ids)
        out.append(torch.cat([target(input_ids=ids[:, c], position_ids=pos[..., c],
                                     use_cache=True, return_dict=True, **kwargs).logits[0]
                              for c in chunks]))
    return torch.stack(out)


def _chain_forward(target, ids):
    """Logits `[3, V]` of x, y, z verified as a chain after a prefill of the prompt, as the engine
    verifies chains without sliding windows (`generate._verify_forward`): the model's own causal
    attention, given the 2-D `attention_mask` `[1, n + 3]` over the cached prompt and the chain
    (Mamba's mixers multiply the new tokens by it and fail on the longer mask)."""
    n = ids.shape[1] - 3
    cache = _prefill(target, ids[:, :n], ())
    out = target(input_ids=ids[:, n:], attention_mask=torch.ones_like(ids),
                 position_ids=_positions(target, ids)[..., n:],
                 **cache_kwargs(target.forward, cache), use_cache=True, return_dict=True)
    return out.logits[0]


def _prefill(target, ids, windows):
    cache = engine_cache(target, windows)
    out = target(input_ids=ids, position_ids=_positions(target, ids), use_cache=True,
                 return_dict=True, **({} if cache is None else cache_kwargs(target.forward, cache)))
    return output_cache(out)


def _tree_forward(target, ids, windows, mode):
    """Logits `[3, V]` of nodes x, y (siblings at the root's next position) and z (y's child),
    verified in one forward after a prefill of the prompt; a message where a layer ignored the
    mask."""
    n = ids.shape[1] - 3
    cache = _prefill(target, ids[:, :n], windows)
    dev = ids.device
    attends = torch.ones(1, 3, n + 3, dtype=torch.bool, device=dev)
    attends[0, :, n:] = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
    depth = torch.tensor([[1, 1, 2]], device=dev)
    root = _positions(target, ids[:, :n])[..., -1:]  # [..., 1, 1]
    kwargs = {}
    if mode == "block_sparse":
        k_pos = torch.cat([torch.arange(n, device=dev)[None], n - 1 + depth], 1)
        kwargs["block_sparse_mask"] = block_masks(attends, BLOCK_SIZE, windows,
                                                  lambda: (n - 1 + depth, k_pos))
        mask = torch.ones(1, n + 3, dtype=torch.long, device=dev)
    else:
        dtype = next(target.parameters()).dtype
        mask = additive_mask(attends, dtype)[:, None]  # [1, 1, 3, n + 3]
    audit = require_block_sparse_mask(target) if mode == "block_sparse" else nullcontext()
    try:
        with audit:
            out = target(input_ids=ids[:, n:], attention_mask=mask, position_ids=root + depth,
                         **cache_kwargs(target.forward, cache), use_cache=True,
                         return_dict=True, **kwargs)
    except NotImplementedError:  # the audit: some layer ran without the mask
        return "a layer did not take the mask"
    return out.logits[0]


def _hole_forward(target, ids):
    """Logits `[2, V]` of y, z fed after `prompt + x` with x hidden by the 2-D mask."""
    n = ids.shape[1] - 3
    cache = _prefill(target, ids[:, :n + 1], None)
    mask = torch.ones(1, n + 3, dtype=torch.long, device=ids.device)
    mask[0, n] = 0
    root = _positions(target, ids[:, :n])[..., -1:]
    out = target(input_ids=ids[:, n + 1:], attention_mask=mask,
                 position_ids=root + torch.tensor([[1, 2]], device=ids.device),
                 **cache_kwargs(target.forward, cache), use_cache=True, return_dict=True)
    return out.logits[0]
