"""`compile=True`: the target's KV in a transformers `StaticCache`, verification forwards of one
shape, and that forward `torch.compile`d (CUDA graphs on a GPU).

The pattern of gpt-fast's speculative decoding (`generate.py` there: a static cache, a compiled
`decode_n_tokens`/verify step, no host sync inside), with transformers' own pieces: the cache is
its `StaticCache` (each `StaticLayer` preallocates `[B, H, length, D]` and writes the new keys at
its `cumulative_length`), and the forward is `model.get_compiled_call(CompileConfig(...))`, the
compiled `__call__` that `model.generate` decodes with (`dynamic=False`; `mode="reduce-overhead"`
on CUDA, which records CUDA graphs, and inductor's default elsewhere). The prefill stays eager, as
in `model.generate`. A `ModelDrafter` chain runs its own model the same way (`DraftState.compile`;
`drafters/model_drafter.py`).

One shape per round: every verification forward feeds `P` nodes, the tree's node count rounded up
to `NODE_BUCKET` (padding nodes attend only to themselves and are never committed), against all
`length` slots of the cache, through a dense 4-D mask `[B, 1, P, length]` (the tree's ancestors,
the rows' valid slots, nothing past the tree). The mask goes through the model's own attention
(SDPA), not the block-sparse layer: its block lists have a data-dependent width, which would give
the compiled graph a new shape every round. The accepted path is then gathered in place inside the
static tensors (`kv_cache.commit_path`) and `cumulative_length` set to the committed count, so the
next tree's keys overwrite the rejected ones.

`length` is prompt + max_new_tokens + one bucket, which a single row never outgrows. A batch can
(rows leave holes where they accept fewer tokens than the round's longest path, `draft.py`): the
cache then grows by reallocation (a new shape, so one more compiled graph).

Sliding-window layers (Gemma 2 and 3, Mistral, Cohere2, ...): transformers' `StaticCache` gives
them a `StaticSlidingWindowLayer`, a rolling buffer of the last `window` entries, which a rollback
cannot use (the tree's rejected keys overwrite committed ones). So every layer gets a full
`StaticLayer` (`static_cache`), and the window moves into the mask: the sliding layers' mask is the
full one cut to `p - window < k <= p`, counted in positions as in the eager engine (`windows.py`;
holes in a batch's slots do not count). It reaches each layer through transformers' own dispatch:
a forward given `attention_mask={"full_attention": m, "sliding_attention": m_w}` hands each layer
the mask of its `config.layer_types` entry (Gemma 2 and 3, Qwen2, Cohere2: `causal_mask_mapping`),
and a model whose layers all slide gets `m_w` alone (Mistral's forward builds one mask for all).

Where no tree mask is exact on the target (the eager probe's `tree_mode` is None: ALiBi counted
in slots, MPT; ALiBi built from the 2-D mask, Bloom; PaliGemma), the engine verifies each draft's
main path, and the static path passes that chain the 2-D mask of the valid slots (`slot_mask`),
from which the model builds its own causal mask (and Bloom its ALiBi), as the eager engine does;
its probe compares that chain with the model's own one-token steps. DSA models (DeepSeek-V3.2,
GLM-MoE-DSA: `StaticIndexedLayer`) keep their indexer's keys beside the KV, gathered in place too.
Chunked layers (Llama 4) get the mask cut to each query's chunk, counted in positions, under
their key of the per-layer-type dict: unlike the eager engine (`admission.check_length`), the
static path runs past one `attention_chunk_size` block.

Linear-attention, SSM and convolution layers (Qwen3-Next, Jamba, Bamba, Nemotron-H, Zamba 2, ...):
transformers' `StaticCache` holds their state in place (`LinearAttentionLayer`, or
`LinearAttentionAndStaticFullAttentionLayer` beside keys). The engine verifies their drafts'
main paths as chains and rolls the state back as the eager engine does (`recurrent.py`: a
snapshot before the forward; where a draft is rejected, the state restored, the attention layers
cut back to the round's start and the committed tokens fed again), with two differences: a chain
is not padded (a padding node would fold into the state; its length, and so the graph, changes
only in budget-capped rounds), and the replay runs through the same static forward, one graph per
replayed length.

Refused with one line before the prefill (`unsupported`), where the static path cannot be exact:
GPT-Neo's local layers past their window (they count it back from the cache's last slot), linear
attention beside sliding-window keys in one layer (Inkling; the eager engine refuses them too),
layer types `StaticCache` has no layer for (DeepSeek-V4) and encoder-decoder caches; and, from a
probe on the call's prompt (`probe`), models whose prefill into the `StaticCache` or whose masked
forward on it does not give their own logits. KV-sharing layers (Gemma 4's
`num_kv_shared_layers`) hold nothing in the cache (`DummyLayer`) and read the full layers'
tensors: they run as they are.
"""

from __future__ import annotations

import logging
import time
import weakref
from types import SimpleNamespace

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import (
    DummyLayer,
    LinearAttentionAndStaticFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
    StaticIndexedLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
    get_layer_types_and_kwargs,
)
from transformers.generation.configuration_utils import CompileConfig

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.kernels.hf import additive_mask, use_block_sparse_attention

from . import admission
from .tree import node_positions
from .verifier import Verifier, admit_target
from .windows import sliding_windows, within_chunk, within_window

# nodes of a verification forward: the tree's count rounded up to a multiple of this, so that a
# drafter's usual tree (gpt-fast's speculate_k + 1, EAGLE's 60) and its budget-capped last rounds
# share one compiled graph
NODE_BUCKET = 8
# cache lengths are whole multiples of this (a growth adds at least this many slots)
LENGTH_BUCKET = 64


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def check_compile(compile) -> CompileConfig | None:
    """`compile=` of `generate` / `speculative`: False, True or a transformers `CompileConfig`."""
    if isinstance(compile, CompileConfig):
        return compile
    if compile is True:
        return CompileConfig(fullgraph=False, dynamic=False, mode=None)  # mode: by device
    if compile is False:
        return None
    raise ValueError(f"compile must be a bool or a transformers CompileConfig, got {compile!r}")


_announced = weakref.WeakSet()  # compiled calls whose first call was announced
_compiling = {"seconds": 0.0}  # wall time of the compiled calls that compiled a graph


def compile_seconds() -> float:
    """Seconds this process has spent in compiled calls that compiled a new graph (the first
    call of each shape): `generate` reports the difference over a call as `stats.compile_time`,
    apart from its tokens/s."""
    return _compiling["seconds"]


def _graphs_compiled() -> int:
    """dynamo's count of graphs compiled in this process (read each time: tests clear it)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def compiled_forward(target, config: CompileConfig):
    """The target's compiled `__call__` (transformers caches it on the model), each call a new
    step of the CUDA graphs: the engine and `ModelDrafter` keep no output of a compiled call past
    the next one (what they keep, they gather or copy), so a replay may reuse its buffers.

    Its first call says on the `mmspec` logger that compiling starts (silent, it took minutes);
    calls that compile a graph add their time to `compile_seconds()`."""
    if config.mode is None and config.backend == "inductor":  # CUDA graphs where they exist
        device = next(target.parameters()).device
        config = CompileConfig(**{**config.to_dict(),
                                  "mode": "reduce-overhead" if device.type == "cuda" else "default"})
    compiled = target.get_compiled_call(config)

    def call(**kwargs):
        if compiled not in _announced:
            _announced.add(compiled)
            logging.getLogger("mmspec").warning(
                "compile=True: compiling %s's forward (torch.compile, backend %s, mode %s); the "
                "first call of each shape compiles, reported as stats.compile_time",
                type(target).__name__, config.backend, config.mode)
        before, start = _graphs_compiled(), time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(**kwargs)
        if _graphs_compiled() != before:
            _compiling["seconds"] += time.perf_counter() - start
        return out

    return call


def static_cache(model, length: int) -> StaticCache:
    """transformers' `StaticCache` for `model`, `length` slots, with each sliding-window layer a
    full `StaticLayer`: transformers' `StaticSlidingWindowLayer` is a rolling buffer of the last
    `window` entries, and a rollback needs the ones it overwrites. The window is the mask's
    (`masks`)."""
    cache = StaticCache(config=model.config, max_cache_len=length)
    cache.layers = [StaticLayer(max_cache_len=length) if type(layer) is StaticSlidingWindowLayer
                    else layer for layer in cache.layers]
    return cache


def _layer_types(model) -> set[str]:
    """The attention kinds of the model's layers, as its `StaticCache` reads them."""
    return set(get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))[0])


def refuse(target, windows, length: int) -> None:
    """Before the prefill of a call of `length` tokens (prompt + max_new_tokens): one line saying
    why, for a target `unsupported` names a reason for."""
    why = unsupported(target, windows, round_up(length + NODE_BUCKET, LENGTH_BUCKET))
    if why is not None:
        raise admission.UnsupportedTarget(f"{type(target).__name__}: {why}; use compile=False")


def unsupported(model, windows, length: int) -> str | None:
    """Why `model` (its sliding `windows`, `windows.sliding_windows`) cannot run the static path
    with a cache of `length` slots: its cache is not a `StaticCache` of full-attention
    `StaticLayer`s (sliding ones replaced, `static_cache`; KV-sharing consumers' `DummyLayer`s
    hold nothing), or a layer needs another mask than a full or a sliding-window one; None where
    it can."""
    config = model.config.get_text_config(decoder=True)
    if getattr(config, "is_encoder_decoder", False):
        return "compile=True needs a decoder-only cache"
    local = getattr(config, "window_size", None)
    if "local" in (getattr(config, "attention_layers", None) or ()) and length > local:
        # GPT-Neo: `bias[:, :, kv - q : kv, :kv]`, its local rows for queries at the last slots
        most = local // LENGTH_BUCKET * LENGTH_BUCKET - NODE_BUCKET
        return (f"compile=True keeps the KV in a StaticCache of {length} slots, and this "
                f"model's local-attention layers count their window (window_size={local}) "
                f"back from the cache's last slot, not from the query, which is exact only "
                f"while the cache fits the window; "
                + (f"keep the prompt plus max_new_tokens within {most}" if most > 0 else
                   f"no cache of whole {LENGTH_BUCKET}-slot buckets does"))
    if len(windows) > 1:
        return (f"compile=True gives all sliding layers one mask, and this model has windows of "
                f"{len(windows)} sizes {windows}")
    try:
        layers = static_cache(model, 1).layers
    except KeyError as err:  # DeepSeek-V4's compressed attention has no static layer
        return (f"compile=True keeps the KV in transformers' StaticCache, which has no layer "
                f"for this model's layer type {err}")
    kinds = {type(layer) for layer in layers}
    if kinds - _STATIC_KINDS:
        names = ", ".join(sorted(kind.__name__ for kind in kinds))
        return (f"compile=True keeps the KV in a StaticCache, which holds this model in "
                f"{names} layers; the engine commits paths only in full-attention StaticLayers "
                f"(and DSA's StaticIndexedLayers, beside linear-attention state, which it "
                f"replays)")
    return None


# the StaticCache layers the static path runs: full attention (sliding layers replaced,
# `static_cache`; DSA's beside its indexer's keys), KV-sharing consumers' DummyLayers, and
# linear-attention / SSM / convolution
# state alone or beside full attention (`recurrent.py`: snapshot, restore and replay)
_STATIC_KINDS = {StaticLayer, StaticIndexedLayer, DummyLayer, LinearAttentionLayer,
                 LinearAttentionAndStaticFullAttentionLayer}


def holds_recurrent_state(cache) -> bool:
    """Whether `cache`'s layers fold tokens into a state (linear attention, SSM, convolution)."""
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)


def dense_tree_mask(attends: torch.Tensor, nodes: int, length: int, dtype) -> torch.Tensor:
    """attends bool `[B, N, C + N]` (the N nodes against the cached slots and themselves) -> the
    additive mask `[B, 1, P, length]` of a forward of P >= N nodes into a cache of `length`
    slots. Padding nodes attend only to themselves; slots past the nodes are hidden."""
    b, n, width = attends.shape
    full = torch.zeros(b, nodes, length, dtype=torch.bool, device=attends.device)
    full[:, :n, :width] = attends
    c = width - n  # cached slots before the nodes
    pad = torch.arange(n, nodes, device=attends.device)
    full[:, pad, c + pad] = True
    return additive_mask(full, dtype)[:, None]


def masks(model):
    """`build(attends, nodes, length, dtype, positions)` -> the `attention_mask` of a static
    forward of `model`: `dense_tree_mask` of `attends`; with a sliding window, the same within the
    window for sliding layers (`windows.within_window`; `positions()` gives the query and key
    positions), passed alone where every layer slides (Mistral's forward takes one mask) and
    otherwise as transformers' per-layer-type dict (Gemma 2 and 3, Qwen2, Cohere2: a forward
    given `{"full_attention": ..., "sliding_attention": ...}` hands each layer its own); with
    chunked layers (Llama 4), the same within each query's chunk (`windows.within_chunk`) under
    `"chunked_attention"` of that dict."""
    types = _layer_types(model)
    # Llama 4's chunked layers are cached as sliding ones (their chunk as the window): no window
    windows = sliding_windows(model) if "sliding_attention" in types else ()
    chunk = (model.config.get_text_config(decoder=True).attention_chunk_size
             if "chunked_attention" in types else None)
    slides_only = types == {"sliding_attention"}

    def build(attends, nodes, length, dtype, positions):
        full = dense_tree_mask(attends, nodes, length, dtype)  # [B, 1, P, length]
        if not windows and chunk is None:
            return full
        q_pos, k_pos = positions()
        out = {"full_attention": full}
        if windows:
            out["sliding_attention"] = dense_tree_mask(
                within_window(attends, q_pos, k_pos, windows[0]), nodes, length, dtype)
        if chunk is not None:
            out["chunked_attention"] = dense_tree_mask(
                within_chunk(attends, q_pos, k_pos, chunk), nodes, length, dtype)
        return out["sliding_attention"] if slides_only else out

    return build


def slot_mask(valid: torch.Tensor, length: int) -> torch.Tensor:
    """valid bool `[B, C + N]` (the cached slots, then the chain's nodes) -> the 2-D
    `attention_mask` long `[B, length]` of a chain's static forward: the model builds its causal
    mask (and ALiBi, Bloom) from it as from the eager engine's; padding nodes and the slots past
    them are hidden."""
    return padded(valid.long(), length)


def padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """x `[..., N]` zero-padded to `[..., width]`, a new tensor of standard strides (a view's
    strides would be guarded by the compiled graph: a step's token, sliced from a longer row,
    recompiled it every round)."""
    out = x.new_zeros(*x.shape[:-1], width)
    out[..., : x.shape[-1]] = x
    return out


def grow(cache: StaticCache, needed: int, length: int) -> int:
    """The cache's length after making room for `needed` slots: `length` where they fit, else
    every layer reallocated (entries kept) to a larger whole bucket."""
    if needed <= length:
        return length
    length = round_up(max(needed, length * 3 // 2), LENGTH_BUCKET)
    for layer in cache.layers:
        layer.max_cache_len = length
        if not isinstance(layer, StaticLayer) or not layer.is_initialized:  # no keys to move:
            continue  # KV-sharing consumers' DummyLayers, linear-attention state
        for name in ("keys", "values"):
            old = getattr(layer, name)  # [B, H, length, D]
            new = old.new_zeros(*old.shape[:2], length, old.shape[3])
            new[:, :, : old.shape[2]] = old
            torch._dynamo.mark_static_address(new)
            setattr(layer, name, new)
        if getattr(layer, "is_indexer_initialized", False):  # DSA: StaticIndexedLayer
            old = layer.indexer_keys  # [B, length, D]
            new = old.new_zeros(old.shape[0], length, old.shape[2])
            new[:, : old.shape[1]] = old
            torch._dynamo.mark_static_address(new)
            layer.indexer_keys = new
    return length


class StaticVerifier(Verifier):
    """`compile=True` (`verifier.Verifier`): the engine's static cache and compiled verification
    forward for one `generate` call."""

    def __init__(self, target, windows: tuple, config: CompileConfig):
        super().__init__(target, windows)
        self.compile_config = config
        self.chains = False

    def admit(self, drafter, input_ids, attention_mask, max_new_tokens: int) -> None:
        """The static path's own refusals (`refuse`) before the eager engine's (`admit_target`,
        chunked layers masked here), then its own probe (`probe`) of the forward it compiles."""
        refuse(self.target, self.windows, input_ids.shape[1] + max_new_tokens)
        self.probe = admit_target(self.target, drafter, input_ids, attention_mask, self.windows,
                                  max_new_tokens, chunks_masked=True)
        # where no tree mask is exact the engine verifies main paths: chains, through the
        # model's own causal mask
        self.chains = self.probe is not None and self.probe.tree_mode is None
        probe(self.target, input_ids, attention_mask, self.chains)

    def open(self, prompt_len: int, max_new_tokens: int) -> None:
        target = self.target
        self.length = round_up(prompt_len + max_new_tokens + NODE_BUCKET, LENGTH_BUCKET)
        self.cache = static_cache(target, self.length)
        # linear-attention / SSM state: chains verified unpadded through the 4-D mask (a padding
        # node would fold into the state); other main-path targets: the 2-D slot mask
        self.recurrent = holds_recurrent_state(self.cache)
        self.chains = self.chains and not self.recurrent
        self.masks = masks(target)
        self.forward_call = compiled_forward(target, self.compile_config)
        self.dtype = next(target.parameters()).dtype

    def prefill_cache(self):
        return self.cache

    def adopt(self, cache) -> bool:
        """The model filled the cache it was given (not one of its own)."""
        if cache is not self.cache:
            raise admission.UnsupportedTarget(
                f"{type(self.target).__name__}: compile=True gave its prefill a StaticCache and "
                f"it returned {type(cache).__name__}; use compile=False")
        return self.recurrent

    def prepare(self, tree, slots):
        """Nothing: the dense mask is built in `verify`, for the compiled forward's shape."""
        return None

    def forward(self, tree, slots, prepared, need_hidden: bool):
        return self.verify(tree, slots.cache_valid, slots.root_pos, need_hidden)

    def _fit(self, needed: int) -> None:
        """Grow every layer to at least `needed` slots (a batch's holes; module docstring)."""
        self.length = grow(self.cache, needed, self.length)

    def verify(self, tree, cache_valid, position_ids, need_hidden: bool):
        """The verification forward of `tree` (N nodes) padded to P (N itself on a target with
        recurrent state: a chain, whose N changes only in budget-capped rounds); returns
        `.logits` `[B, N, V]` and `.hidden_states` (each `[B, N, H]`) of the N nodes."""
        b, n = tree.tokens.shape
        c = cache_valid.shape[1]
        p = n if self.recurrent else round_up(n, NODE_BUCKET)
        self._fit(c + p)
        if self.chains:  # the model's own causal mask over the valid slots, [B, length]
            mask = slot_mask(torch.cat([cache_valid, torch.ones_like(tree.valid)], 1),
                             self.length)
        else:
            attends = torch.cat([cache_valid[:, None, :].expand(b, n, c), tree.anc], -1)
            mask = self.masks(attends, p, self.length, self.dtype,  # [B, 1, P, length] or a dict
                              lambda: node_positions(tree, cache_valid))
        tokens = padded(tree.tokens, p)  # [B, P]
        depth = padded(tree.depth * tree.valid, p)  # padding nodes at the root's position
        out = self.forward_call(input_ids=tokens, attention_mask=mask,
                           position_ids=position_ids + depth,  # [..., B, P]
                           **cache_kwargs(self.target.forward, self.cache), use_cache=True,
                           output_hidden_states=need_hidden, return_dict=True)
        hidden = tuple(h[:, :n] for h in out.hidden_states) if need_hidden else None
        return SimpleNamespace(logits=out.logits[:, :n], hidden_states=hidden)

    def replay(self, tree, k: int, slots) -> None:
        """After `recurrent.restore` and the attention layers cut back to the round's start:
        the first `k` nodes of the verified chain `tree` fed again through the same forward
        (`k` nodes, one compiled graph per `k`), so the recurrent state and the keys hold the
        committed tokens and nothing else (`recurrent.py`)."""
        prefix = SimpleNamespace(tokens=tree.tokens[:, :k], anc=tree.anc[:, :k, :k],
                                 depth=tree.depth[:, :k], valid=tree.valid[:, :k])
        self.verify(prefix, slots.cache_valid, slots.root_pos, need_hidden=False)


def probe(target, input_ids, attention_mask, chains: bool = False) -> None:
    """Once per target (dtype, attention implementation, `chains`): the forward
    `StaticVerifier` runs, eagerly, on the call's own prompt tokens against the model's own
    forwards; a target that differs is refused. The compiled graph computes what this eager
    forward computes. A tree (x, y and y's child z, padded to a bucket, through the 4-D mask)
    against its plain forwards; with `chains` (the engine verifies only main paths: no tree mask
    is exact on it, `admission.Probe`), the chain x, y, z through the 2-D slot mask against its
    own cached one-token steps, which is what its generate runs; on a target with recurrent
    state, the chain y, z unpadded through the 4-D mask, as it verifies, against its plain
    forward."""
    admission.cached_probe(target, ("static", chains),
                           lambda: _measure(target, input_ids, attention_mask, chains))


def _measure(target, input_ids, attention_mask, chains):
    ids = admission._probe_tokens(target, input_ids, attention_mask)
    if ids is None:
        return None
    name = type(target).__name__
    try:
        with torch.no_grad():
            recurrent = holds_recurrent_state(static_cache(target, 1))
            chains = chains and not recurrent  # recurrent chains: the 4-D mask, unpadded
            if chains:
                want = _own_steps(target, ids)
            else:
                plain, ref_yz, nodes = admission.reference_logits(target, ids)
                # [4, V]: the prompt's last, x, y, z; [3, V] without x for a recurrent chain
                want = torch.cat([plain[-2:-1], ref_yz if recurrent else nodes])
            restore = use_block_sparse_attention(target)  # the attention the engine runs
            try:
                got = _static_logits(target, ids, chains, recurrent)
            finally:
                restore()
    except admission.UnsupportedTarget as err:
        return err
    except admission._FAILURES as err:
        line = (str(err).splitlines() or [""])[0][:200]
        return admission.UnsupportedTarget(
            f"{name}: compile=True verifies through a {'2' if chains else '4'}-D mask on a "
            f"StaticCache, and that forward failed in the engine's probe "
            f"({type(err).__name__}: {line}); use compile=False")
    if not admission._close(got, want):
        return admission.UnsupportedTarget(
            f"{name}: compile=True verifies through a {'2' if chains else '4'}-D mask on a "
            f"StaticCache, which gives other logits than its own forward here; use "
            f"compile=False")
    return None


def _own_steps(target, ids):
    """The model's own cached decoding of the probe's tokens (`ids` `[1, n + 3]`): the logits
    `[4, V]` of a prefill of the n prompt tokens (its last token's), then of x, y and z fed one
    at a time, in its own attention and `DynamicCache`."""
    n = ids.shape[1] - 3
    kwargs = cache_kwargs(target.forward, DynamicCache(config=target.config))
    pos = admission._positions(target, ids)
    out = []
    for step in (slice(0, n), slice(n, n + 1), slice(n + 1, n + 2), slice(n + 2, n + 3)):
        out.append(target(input_ids=ids[:, step], position_ids=pos[..., step], use_cache=True,
                          return_dict=True, **kwargs).logits[0, -1:])
    return torch.cat(out)


def _static_logits(target, ids, chains, recurrent=False):
    """The logits `[4, V]` of a prefill of the probe's n prompt tokens (`ids` `[1, n + 3]`) into
    a static cache (its last token's), then of x, y, z verified as `StaticVerifier.verify` does:
    the tree (x, y siblings, z y's child) or, with `chains`, the chain x, y, z; `recurrent`:
    `[3, V]`, of y and z fed as a chain of two, unpadded, through the 4-D mask."""
    n = ids.shape[1] - 3
    length = round_up(n + NODE_BUCKET, LENGTH_BUCKET)
    cache = static_cache(target, length)
    kwargs = cache_kwargs(target.forward, cache)
    prompt = ids[:, :n]
    pos = admission._positions(target, prompt)
    out = target(input_ids=prompt, position_ids=pos, use_cache=True, return_dict=True, **kwargs)
    last = out.logits[0, -1:]
    if output_cache(out) is not cache:
        raise admission.UnsupportedTarget(
            f"{type(target).__name__}: compile=True gave its prefill a StaticCache and it "
            f"returned {type(output_cache(out)).__name__}; use compile=False")
    if chains:
        p, m = round_up(3, NODE_BUCKET), 3
        depth = torch.tensor([[1, 2, 3] + [0] * (p - 3)], device=ids.device)
        mask = slot_mask(torch.ones(1, n + 3, dtype=torch.bool, device=ids.device), length)
        fed = ids[:, n:]
    else:
        if recurrent:
            fed, anc, depth = ids[:, n + 1:], [[1, 0], [1, 1]], [1, 2]
        else:
            fed, anc, depth = ids[:, n:], [[1, 0, 0], [0, 1, 0], [0, 1, 1]], [1, 1, 2]
        m = fed.shape[1]
        attends = torch.ones(1, m, n + m, dtype=torch.bool, device=ids.device)
        attends[0, :, n:] = torch.tensor(anc, dtype=torch.bool)
        p = m if recurrent else round_up(m, NODE_BUCKET)
        depth = torch.tensor([depth + [0] * (p - m)], device=ids.device)
        q_pos = n - 1 + depth[:, :m]  # the root (the prompt's last token) is at n - 1
        k_pos = torch.cat([torch.arange(n, device=ids.device)[None], q_pos], 1)
        mask = masks(target)(attends, p, length, next(target.parameters()).dtype,
                             lambda: (q_pos, k_pos))
    tokens = torch.nn.functional.pad(fed, (0, p - m))
    nodes = target(input_ids=tokens, attention_mask=mask, position_ids=pos[..., -1:] + depth,
                   use_cache=True, return_dict=True, **kwargs).logits[0, :m]
    return torch.cat([last, nodes])
