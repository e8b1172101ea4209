"""`generate`: lossless speculative decoding for any Hugging Face causal LM or VLM.

One round (Leviathan et al. 2023, tree verification as in SpecInfer / EAGLE-2):

    draft   = drafter.propose(state)                  # a tree below each row's last token
    logits  = target(root + draft nodes, tree mask)   # one forward, shared block-sparse layer
    path    = verify(draft, logits)                   # greedy match or rejection sampling
    commit(path): gather its KV entries, append the tokens and the target's bonus token
    drafter.update(result)

The target stays an unmodified transformers model: the prompt goes through its own
`prepare_inputs_for_generation` (so `pixel_values`, `image_grid_thw`, M-RoPE positions work as in
`model.generate`), and every tree verification forward passes `block_sparse_mask=` to the attention
function `mmspec_block_sparse` (`mmspec.kernels.register_hf_attention`), which `generate` switches
the target to for the call (it is transformers' SDPA when no mask is passed, as for chains).

Batches: rows are left-padded and each row accepts its own number of tokens, so the KV cache and
the token slots get *holes* that the mask hides (see `draft.py`); no row waits for another.
"""

from __future__ import annotations

import inspect
import numbers
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.kernels.hf import (
    additive_mask,
    require_block_sparse_mask,
    use_block_sparse_attention,
)

from . import admission, kv_cache
from . import recurrent as rec
from . import static as static_cache
from .draft import Draft, Drafter, DraftState, VerifyResult, as_drafter
from .clock import Clock, fill_times
from .positions import engine_positions, prefill_position_ids
from .settings import (
    ENGINE_KWARGS,
    check_inputs,
    eos_ids,
    generation_settings,
    is_token_id,
    mask_from_padding,
    sampling_config,
    sampling_processors,
    vocab_size,
)
from .stats import SpecStats
from .tree import build_tree, main_path, raise_draft_errors, verify_mask, verify_token_mask
from .windows import sliding_windows
from .verify import verify_greedy, verify_sampling


@dataclass
class SpecOutput:
    """sequences: long `[B, L + n]`, the (left-padded) prompt then the new tokens, padded after EOS."""

    sequences: torch.Tensor
    stats: SpecStats


@contextmanager
def block_sparse_attention_of(model):
    """Route the model's attention through mmspec's layer for the duration of the block."""
    restore = use_block_sparse_attention(model)
    try:
        yield
    finally:
        restore()


def _pick(scores: torch.Tensor, do_sample: bool, generator) -> torch.Tensor:
    """scores `[B, V]` (processed) -> long `[B]`, greedy or sampled."""
    if not do_sample:
        return scores.argmax(-1)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


def _hidden(out, layers):
    """The drafter's features: hidden states of `layers`, concatenated `[B, L, H * len(layers)]`."""
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1)


def _prefill(target, input_ids, attention_mask, model_kwargs, layers, windows, cache=None):
    """The prompt forward, as `target.generate` runs it (no mask without padding, last logits
    only). With sliding windows, into a cache that keeps every entry (`windows.py`); `cache`:
    the engine's `StaticCache` under `compile=True` (`static.py`)."""
    position_ids = prefill_position_ids(target, input_ids, attention_mask, model_kwargs)
    if "logits_to_keep" in inspect.signature(target.forward).parameters:
        model_kwargs = {"logits_to_keep": 1, **model_kwargs}
    mask = None if bool(attention_mask.all()) else attention_mask
    inputs = target.prepare_inputs_for_generation(
        input_ids, attention_mask=mask,
        position_ids=position_ids,
        use_cache=True, is_first_iteration=True, **model_kwargs,
        **cache_kwargs(target.prepare_inputs_for_generation,
                       cache if cache is not None else admission.engine_cache(target, windows)))
    out = target(**inputs, output_hidden_states=bool(layers), return_dict=True)
    hidden = _hidden(out, layers) if layers else None
    return out.logits[:, -1], output_cache(out), position_ids, hidden


class _Rows:
    """Each row's sequence (the prompt as given, then its committed tokens, pad after) on the
    device, and its count of new tokens and liveness both on the host (from the round's one read)
    and on the device (for the next round's masks)."""

    def __init__(self, input_ids, max_new_tokens, eos, pad):
        b, length = input_ids.shape
        device = input_ids.device
        self.prompt_len, self.max_new, self.pad = length, max_new_tokens, pad
        # [B, L + max_new + 1]; the last column takes the writes of masked entries
        self.seq = torch.full((b, length + max_new_tokens + 1), pad, dtype=torch.long, device=device)
        self.seq[:, :length] = input_ids
        self.eos = eos.to(device)
        self.count, self.live = [0] * b, [True] * b
        self.count_t = torch.zeros(b, dtype=torch.long, device=device)
        self.live_t = torch.ones(b, dtype=torch.bool, device=device)

    def cut(self, new: torch.Tensor, num: torch.Tensor):
        """new long `[B, K]`, num long `[B]` -> (num after the budget and the first EOS, hit:
        bool `[B]` an EOS among them), on the device; nothing is committed yet."""
        col = torch.arange(new.shape[1], device=new.device)
        num = torch.where(self.live_t, torch.minimum(num, self.max_new - self.count_t), 0)
        is_eos = torch.isin(new, self.eos) & (col < num[:, None])  # [B, K]
        hit = is_eos.any(-1)
        return torch.where(hit, is_eos.int().argmax(-1) + 1, num), hit

    def write(self, new: torch.Tensor, num: torch.Tensor) -> None:
        """Write the first `num[b]` tokens of `new[b]` after row b's committed ones (device)."""
        col = torch.arange(new.shape[1], device=new.device)
        idx = torch.where(col < num[:, None], self.prompt_len + self.count_t[:, None] + col,
                          self.seq.shape[1] - 1)  # [B, K]
        self.seq.scatter_(1, idx, new)

    def advance(self, num: list[int], stopped: list[bool]) -> None:
        """Host counts of this round's commit; rows that stopped (EOS, a criterion) or ran out
        of budget are finished."""
        for b, n in enumerate(num):
            if self.live[b]:
                self.count[b] += n
                self.live[b] = not stopped[b] and self.count[b] < self.max_new
        device = self.seq.device
        self.count_t = torch.tensor(self.count, device=device)
        self.live_t = torch.tensor(self.live, device=device)

    def unwrite(self, b: int, start: int, end: int) -> None:
        """Pad row b's new tokens `[start, end)` again (cut by a stopping criterion)."""
        self.seq[b, self.prompt_len + start: self.prompt_len + end] = self.pad

    @property
    def sequences(self) -> torch.Tensor:
        """long `[B, L + n]`, n the longest row's new tokens; pad after each row's end."""
        return self.seq[:, : self.prompt_len + max(self.count)]


def generate(target, drafter, input_ids, attention_mask=None, max_new_tokens=32, do_sample=None,
             temperature=None, top_k=None, top_p=None, eos_token_id=None, streamer=None,
             pad_token_id=None, generator=None, on_round=None, profile=False, compile=False,
             **model_kwargs) -> SpecOutput:
    """Speculative decoding with `drafter`; output distributed exactly as `target.generate`'s.

    Args:
        target: a transformers causal LM or VLM (`...ForCausalLM`, `...ForConditionalGeneration`).
        drafter: an object with `propose(DraftState) -> Draft` and `update(VerifyResult)`, and
            optionally `end()`, called when the call is over (also on error; `draft.py`).
        input_ids: long `[B, L]`, left-padded when B > 1.
        attention_mask: `[B, L]`, 0 on padding; None means no padding.
        max_new_tokens: new tokens per row, at most.
        do_sample, temperature, top_k, top_p: the target's sampling (transformers' semantics);
            None means the target's generation config and, where that leaves it unset,
            transformers' default (greedy; sampling at temperature 1.0 with top-k 50), exactly
            as `target.generate` resolves them.
            `repetition_penalty` (argument or generation config) applies as in
            `target.generate`, greedy or sampled; generation-config settings that `generate`
            does not apply (min length, no-repeat n-grams, ...) raise a ValueError instead of
            silently changing the output.
        eos_token_id: int or list; None means `target.generation_config.eos_token_id` (as
            `target.generate` called without it; `[]` stops on no token). Given,
            it also overrides a drafter's own EOS ids (`DraftState.eos_token_id`).
        streamer: a transformers `TextStreamer` / `TextIteratorStreamer` (batch 1).
        pad_token_id: fills rows after their EOS; None means the target's generation config,
            then (as `target.generate`) the first EOS id. Without an `attention_mask`, a prompt
            holding this id (not an EOS id) is read as left-padded there, as transformers does.
        generator: optional `torch.Generator` for the sampling draws.
        on_round: optional `on_round(draft, result, stats)`, called after every round with the
            round's `Draft`, its `VerifyResult` and the running `SpecStats` (to watch a call
            round by round, e.g. in a demo; the drafter has already seen `result`).
        profile: time the phases in `stats` with CUDA events (read once, after the call) on a
            CUDA device; otherwise they are wall time, which on a GPU counts launches, not
            kernels (no round waits for the device only to time it; `stats.total_time` does
            wait, once).
        compile: True keeps the target's KV in a transformers `StaticCache` and runs every
            verification forward in one shape, `torch.compile`d (`dynamic=False`; CUDA graphs
            through `mode="reduce-overhead"` on a GPU); a transformers `CompileConfig` sets the
            compilation itself. Off by default: compiling costs seconds to minutes at the first
            call of each shape, which only long GPU runs earn back. Targets whose cache cannot be
            static are refused before the first token (`static.py`).
        **model_kwargs: passed to the target's prefill (`pixel_values`, `image_grid_thw`, ...);
            as in `target.generate`, a name the model does not take is an error, and so is a
            generation setting `generate` does not apply (`no_repeat_ngram_size=`, ...).
    """
    if "generation_config" in model_kwargs:  # transformers' typo check named it a typo
        raise ValueError("generation_config=: not taken; pass its settings as arguments "
                         "(do_sample=, temperature=, top_k=, top_p=, repetition_penalty=, "
                         "eos_token_id=) or set target.generation_config")
    engine_owned = sorted(set(model_kwargs) & ENGINE_KWARGS)
    if engine_owned:
        raise ValueError(f"{', '.join(engine_owned)}: generate runs the target's cache, positions "
                         f"and outputs itself; pass only model inputs (pixel_values, ...)")
    settings = generation_settings(model_kwargs)  # taken out of model_kwargs
    cfg = sampling_config(target, do_sample, temperature, top_k, top_p, settings)
    validate = getattr(target, "_validate_model_kwargs", None)  # transformers' typo check
    if validate is not None:
        validate(dict(model_kwargs))
    eos = eos_ids(target, eos_token_id)
    if pad_token_id is None:
        pad_token_id = target.generation_config.pad_token_id
    if pad_token_id is None and len(eos):  # target.generate's fallback
        pad_token_id = int(eos[0])
    if isinstance(pad_token_id, torch.Tensor) and pad_token_id.numel() == 1:
        pad_token_id = pad_token_id.item()
    if pad_token_id is not None and not is_token_id(pad_token_id):
        raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
    pad_token_id = None if pad_token_id is None else int(pad_token_id)
    if attention_mask is None and pad_token_id is not None and isinstance(input_ids, torch.Tensor):
        attention_mask = mask_from_padding(input_ids, pad_token_id, eos)
    if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
        max_new_tokens = int(max_new_tokens)  # a numpy int (a tensor stays refused)
    drafter = as_drafter(drafter)
    check_inputs(target, drafter, input_ids, attention_mask, max_new_tokens, pad_token_id)
    drafter.check_inputs(model_kwargs)  # a drafter that knows its target's inputs (ViSpec)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer needs a batch of 1 row, got {input_ids.shape[0]}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    compile_config = static_cache.check_compile(compile)
    asked_eos = None if eos_token_id is None else tuple(eos.tolist())  # for the drafter
    return run(target, drafter, input_ids, attention_mask, max_new_tokens, model_kwargs,
               rule=sampling_processors(cfg, attention_mask), stop=None, eos=eos, asked_eos=asked_eos,
               sampling=cfg if cfg.do_sample else None, streamer=streamer,
               pad=0 if pad_token_id is None else pad_token_id, generator=generator,
               on_round=on_round, profile=profile, compile_config=compile_config)


def run(target, drafter: Drafter, input_ids, attention_mask, max_new_tokens, model_kwargs,
        compile_config=None, **loop) -> SpecOutput:
    """The checked call's admission, the target's attention switch and the drafter's `end()`
    around the loop (`_generate`'s keyword arguments in `loop`); shared by `generate` and
    `speculative` (`hf_generate.py`). `compile_config`: a transformers `CompileConfig` for
    `compile=True` (`static.py`), else None."""
    windows = sliding_windows(target)
    if compile_config is not None:
        static_cache.refuse(target, windows, input_ids.shape[1] + max_new_tokens)
    with engine_positions(target):  # the BART family: the engine's positions, not cache slots
        probe = _admit(target, drafter, input_ids, attention_mask, windows, max_new_tokens,
                       compile_config is not None)
        # where no tree mask is exact the engine verifies main paths: chains, through the
        # model's own causal mask
        chains = probe is not None and probe.tree_mode is None
        if compile_config is not None:
            static_cache.probe(target, input_ids, attention_mask, chains)
        with block_sparse_attention_of(target), torch.no_grad():
            try:
                static = None if compile_config is None else static_cache.StaticVerifier(
                    target, compile_config, input_ids.shape[1], max_new_tokens, chains)
                return _generate(target, drafter, input_ids, attention_mask.long(),
                                 max_new_tokens, model_kwargs, windows, probe, static=static,
                                 **loop)
            except IndexError as err:  # a learned position table (GPT-2, OPT) past its end
                _refuse_past_positions(target, input_ids.shape[1], max_new_tokens, err)
                raise
            finally:  # inside the target's switch: a drafter sharing the model restores it first
                drafter.end()


def _admit(target, drafter, input_ids, attention_mask, windows, max_new_tokens, static=False):
    """The target's probe (`admission.py`), and the refusals it implies for this call, before the
    prefill: a batch whose rows would leave holes, a tree drafter (or any round through a mask,
    with sliding windows) where no tree verification is exact. `static`: `compile=True`, whose
    masks cut chunked layers to their chunks."""
    admission.check_length(target, input_ids.shape[1] + max_new_tokens, chunks_masked=static)
    probe = admission.probe(target, input_ids, attention_mask, windows)
    if probe is None:
        return None
    name = type(target).__name__
    if probe.tree_mode is None and windows:
        _refuse_trees(name, probe, windows)
    if probe.tree_mode is None and drafter.top_k > 1:
        warnings.warn(
            f"{name}: a draft tree verified in one forward does not give this model's own "
            f"logits ({probe.why}); each round verifies the tree's main path only (the first "
            f"child at every depth), exact but with fewer tokens accepted: draft chains "
            f"(top_k=1) to spend no work on other branches", stacklevel=4)
    return probe


def _refuse_trees(name, probe, windows=()):
    if windows:  # every round goes through a mask, chains too
        raise admission.UnsupportedTarget(
            f"{name}: verification through a mask (needed by its sliding windows {windows}) "
            f"does not give this model's own logits ({probe.why}); use target.generate")
    raise admission.UnsupportedTarget(
        f"{name}: a draft tree verified in one forward does not give this model's own logits "
        f"({probe.why}); draft chains with it (ModelDrafter(top_k=1), PromptLookupDrafter)"
        f" or use target.generate")


def _refuse_past_positions(target, prompt_len: int, max_new_tokens: int, err) -> None:
    """After an IndexError: a ValueError naming the position limit when the call went past it."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") \
        else target.config
    for name in ("n_positions", "max_position_embeddings"):
        limit = getattr(config, name, None)
        # the last new token is never fed back: prompt + max_new_tokens - 1 positions are read
        if isinstance(limit, int) and prompt_len + max_new_tokens - 1 > limit:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: the prompt ({prompt_len} tokens) and the "
                f"new tokens fed back need {prompt_len + max_new_tokens - 1} positions, past "
                f"the target's {name}={limit}, where its positions ran out ({err}); ask for "
                f"at most {max(limit - prompt_len + 1, 0)} new tokens") from err


class _Slots:
    """Committed tokens in the slot layout of `draft.py`, and each row's root position."""

    def __init__(self, input_ids, attention_mask, first, prompt_pos):
        self.ids = torch.cat([input_ids, first[:, None]], dim=1)  # [B, S]; last column: roots
        self.valid = torch.cat([attention_mask.bool(), torch.ones_like(self.ids[:, :1], dtype=torch.bool)], 1)
        self.root_pos = prompt_pos[..., -1:] + 1  # [..., B, 1]

    @property
    def cache_valid(self) -> torch.Tensor:
        """bool `[B, S - 1]`: the slots whose keys are cached (all but the roots)."""
        return self.valid[:, :-1]

    def append(self, path_tokens, path_valid, bonus, depth, live) -> None:
        """path_tokens/path_valid `[B, K-1]` accepted tokens (holes False); bonus, depth, live
        `[B]`. A finished row gets holes and keeps its root position: no position (target's or
        drafter's) grows past where the row stopped."""
        self.ids = torch.cat([self.ids, path_tokens, bonus[:, None]], dim=1)
        self.valid = torch.cat([self.valid, path_valid & live[:, None], live[:, None]], 1)
        self.root_pos = self.root_pos + ((depth + 1) * live)[:, None]


def _tree_mask(tree, slots, windows):
    """The verification forward's block-sparse mask, or None where the model's own causal
    attention is exact (a chain without windows, tree.py). Built before the forward is timed:
    it is the engine's work, not the target's."""
    if not tree.is_chain or windows:
        return verify_mask(tree, slots.cache_valid, windows)
    return None


def _verify_forward(target, tree, slots, cache, need_hidden, mask, probe):
    """One target forward over every row's root and tree; trees through the shared layer, or as
    a dense 4-D `attention_mask` where the probe found only that exact (`admission.py`)."""
    kwargs, audit = {}, nullcontext()
    attn = torch.cat([slots.cache_valid, torch.ones_like(tree.valid)], 1).long()  # [B, C + N]
    if mask is not None and probe is not None and probe.tree_mode is None:
        _refuse_trees(type(target).__name__, probe)
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
                          **cache_kwargs(target.forward, cache), use_cache=True,
                          output_hidden_states=need_hidden,
                          return_dict=True, **kwargs)
    except NotImplementedError as err:  # the kernel layer cannot carry what a layer asked
        if isinstance(err, admission.UnsupportedTarget):
            raise
        raise admission.UnsupportedTarget(f"{type(target).__name__}: {err}") from err


def _accepted_path(tree, best):
    """-> depth `[B]` (draft tokens accepted), keep long `[B, K]` (root then path, node order;
    rows with a shorter path repeat trailing nodes), keep_valid bool `[B, K]`. K is the tree's
    depth + 1 (from the host shape): the engine trims it to the deepest accepted path after the
    round's read."""
    rows = torch.arange(len(best), device=best.device)
    depth = tree.depth[rows, best]
    k = tree.max_depth + 1
    on_path = tree.anc[rows, best]  # [B, N]
    keep = torch.argsort((~on_path).to(torch.int8), dim=1, stable=True)[:, :k]
    keep_valid = torch.arange(k, device=best.device) < (depth + 1)[:, None]
    return depth, keep, keep_valid


def _stop_at_criteria(rows, stop, num, hit):
    """Apply the extra stopping criteria (stop strings, ...) to the tokens just written: cut
    `num` (host list) where one fires, and mark those rows stopped (host list `hit`)."""
    if stop is None or not stop.extra:
        return num, hit
    start = [rows.prompt_len + c for c in rows.count]
    cut = stop.first_stop(rows.seq, start, [n if live else 0 for n, live in zip(num, rows.live)])
    num, hit = list(num), list(hit)
    for b, at in enumerate(cut):
        if at is not None:
            rows.unwrite(b, rows.count[b] + at, rows.count[b] + num[b])
            num[b], hit[b] = at, True
    return num, hit


def _generate(target, drafter, input_ids, attention_mask, max_new_tokens, model_kwargs, windows,
              probe, *, rule, stop, eos, asked_eos, sampling, streamer, pad, generator,
              on_round, profile=False, put_prompt=True, static=None) -> SpecOutput:
    """The loop. A round reads the device once (`host = ...tolist()`): every host decision after
    the draft (the accepted lengths, EOS, stats, streamed tokens) comes from that read, and every
    one before it from the previous round's. What the drafter and the target's forward do inside
    is theirs (`tests/decoding/test_syncs.py` counts both). `static`: the `StaticVerifier` of
    `compile=True`, which holds the cache and runs the verification forwards."""
    device = input_ids.device
    stats = SpecStats()
    clock = Clock(device, profile)
    start = time.perf_counter()
    layers = tuple(drafter.target_hidden_layers) if drafter.needs_target_hidden else ()
    need_hidden = bool(layers)
    vocab = vocab_size(target)
    b = input_ids.shape[0]

    p0 = clock.now()
    logits, cache, prompt_pos, hidden = _prefill(target, input_ids, attention_mask, model_kwargs,
                                                 layers, windows,
                                                 None if static is None else static.cache)
    if static is not None:
        static.check_prefill(cache)
        recurrent = static.recurrent
    else:
        recurrent = admission.check_cache(target, cache)  # before the first token
    state_layers = rec.recurrent_layers(cache) if recurrent else []
    # where trees or holes do not verify exactly: each draft's main path, and the rows of a batch
    # commit alike (no holes)
    path_only = recurrent or (probe is not None and probe.tree_mode is None)
    even = b > 1 and (recurrent or (probe is not None and not probe.holes))
    first = _pick(rule.first(input_ids, logits), rule.do_sample, generator)  # [B]
    rows = _Rows(input_ids, max_new_tokens, eos, pad)
    num, hit = rows.cut(first[:, None], torch.ones_like(first))
    rows.write(first[:, None], num)
    host = torch.cat([num, hit.long(), first]).tolist()
    num_h, hit_h = _stop_at_criteria(rows, stop, host[:b], [bool(h) for h in host[b: 2 * b]])
    rows.advance(num_h, hit_h)
    stats.new_tokens += b
    if streamer is not None:
        if put_prompt:
            streamer.put(input_ids.cpu())
        streamer.put(torch.tensor(host[2 * b:]))
    slots = _Slots(input_ids, attention_mask, first, prompt_pos)
    clock.add("prefill", p0, clock.now())

    while any(rows.live):
        t0 = clock.now()
        remaining = [max_new_tokens - c - 1 if live else -1 for c, live in zip(rows.count, rows.live)]
        depth_cap = max(remaining)
        state = DraftState(slots.ids, slots.valid.long(), depth_cap, slots.root_pos, stats.rounds,
                           hidden, model_kwargs, generator, asked_eos, sampling,
                           None if static is None else static.config)
        ta = clock.now()
        draft = drafter.propose(state) if depth_cap > 0 else Draft.empty(b, device)
        tb = clock.now()
        pruned = main_path(draft) if path_only else None
        verified, node_map = (draft, None) if pruned is None else pruned
        tree = build_tree(slots.ids[:, -1], verified, vocab, defer_checks=True)
        # finished rows and nodes deeper than a row's budget are never committed: drop them, so
        # no position runs past prompt + max_new_tokens (GPT-2's table ends there) or grows in a
        # finished row
        remaining_t = torch.tensor(remaining, device=device)
        tree.valid &= (rows.live_t[:, None] & (tree.depth <= remaining_t[:, None])) | (tree.depth == 0)
        mask = None if static is not None else _tree_mask(tree, slots, windows)
        if recurrent and mask is not None:
            raise admission.UnsupportedTarget(
                f"{type(target).__name__}: its cache holds recurrent state (linear attention "
                f"or SSM), through which a draft tree's branches would mix; draft chains "
                f"(ModelDrafter(top_k=1), PromptLookupDrafter)")
        saved = rec.snapshot(state_layers) if recurrent else None
        tc = clock.now()
        if static is not None:
            out = static.verify(tree, slots.cache_valid, slots.root_pos, need_hidden)
        else:
            out = _verify_forward(target, tree, slots, cache, need_hidden, mask, probe)
        td = clock.now()
        lengths = [[input_ids.shape[1] + rows.count[r] + d if d <= remaining[r] else -1
                    for d in tree.host_depth[r]] for r in range(b)]
        scores = rule.tree(out.logits, tree.tokens, tree.anc, tree.depth, rows.seq, lengths)
        if rule.do_sample:
            best, bonus = verify_sampling(tree, scores.softmax(-1), generator)
        else:
            best, bonus = verify_greedy(tree, scores)

        # the root and the accepted nodes, then the bonus token right after each row's path
        depth, keep, keep_valid = _accepted_path(tree, best)
        path_tokens = tree.tokens.gather(1, keep)[:, 1:]  # [B, K-1]
        if even:
            depth, bonus = _even_commit(depth, bonus, path_tokens, rows.live_t)
            keep_valid = torch.arange(keep.shape[1], device=device) < (depth + 1)[:, None]
        new = torch.cat([path_tokens, bonus[:, None]], dim=1)  # [B, K]
        new[torch.arange(b, device=device), depth] = bonus
        num, hit = rows.cut(new, depth + 1)  # cut at EOS and max_new_tokens
        rows.write(new, num)
        drafted = (tree.valid[:, 1:] & rows.live_t[:, None]).sum(-1)
        # the round's one device-to-host read
        host = torch.cat([torch.stack([depth, num, hit.long(), drafted]).flatten(),
                          new.flatten(), tree.checks]).tolist()
        raise_draft_errors(host[-4:], verified, vocab)
        depth_h, num_h, drafted_h = host[:b], host[b: 2 * b], host[3 * b: 4 * b]
        new_h = [host[4 * b + r * new.shape[1]: 4 * b + (r + 1) * new.shape[1]] for r in range(b)]
        num_h, hit_h = _stop_at_criteria(rows, stop, num_h, [bool(h) for h in host[2 * b: 3 * b]])
        live_h, live = list(rows.live), rows.live_t
        rows.advance(num_h, hit_h)

        # commit the root and the accepted nodes at cache slots [C, C + K); holes where shorter
        k = max(d for d, alive in zip(depth_h, live_h) if alive) + 1
        keep, keep_valid = keep[:, :k], keep_valid[:, :k]
        if need_hidden:  # before a replay: a compiled call's outputs live until the next call
            h = _hidden(out, layers)  # [B, N, H']
            hidden = h.gather(1, keep[..., None].expand(-1, -1, h.shape[-1]))  # [B, K, H]
        if recurrent:  # a chain, rows alike: replay the committed tokens where one was rejected
            _roll_back(target, cache, state_layers, saved, tree, slots, k, stats, clock, static)
        else:
            kv_cache.commit_path(cache, slots.ids.shape[1] - 1, keep, in_place=tree.is_chain)
        slots.append(path_tokens[:, : k - 1], keep_valid[:, 1:], bonus, depth, live)
        if streamer is not None and num_h[0] > 0:
            streamer.put(torch.tensor(new_h[0][: num_h[0]]))
        accepted_h = [min(d, n) if alive else 0 for d, n, alive in zip(depth_h, num_h, live_h)]
        result = VerifyResult(
            num_accepted=torch.where(live, depth, 0),
            new_tokens=[new[r, : num_h[r]] for r in range(b)],
            accepted_nodes=[_draft_nodes(keep[r, 1: 1 + (depth_h[r] if live_h[r] else 0)] - 1,
                                         node_map, r) for r in range(b)],
            target_hidden=hidden if need_hidden else None,
        )
        te = clock.now()
        if depth_cap > 0:  # update answers a propose; a budget-capped last round had none
            drafter.update(result)
        tf = clock.now()
        stats.rounds += 1
        stats.row_rounds += sum(live_h)
        stats.drafted += sum(drafted_h)
        stats.accepted += sum(accepted_h)
        committed = sum(n for n, alive in zip(num_h, live_h) if alive)
        stats.committed += committed
        stats.new_tokens += committed
        clock.add("draft", ta, tb)
        clock.add("draft", te, tf)
        clock.add("round", t0, tf)
        clock.add("forward", tc, td)
        if not clock.events:  # wall time: the running totals cost nothing
            fill_times(stats, clock)
        if on_round is not None:
            on_round(draft, result, stats)

    if streamer is not None:
        streamer.end()
    sequences = rows.sequences
    stats.total_time = clock.finish() - start
    fill_times(stats, clock)
    return SpecOutput(sequences, stats)


def _even_commit(depth, bonus, path_tokens, live):
    """Every live row commits as many tokens as the live row that accepted fewest: a row that
    accepted more keeps that many drafts, and its next accepted draft becomes its bonus token
    (the target's own pick there, greedy or sampled: a speculative round's tokens are the
    target's at every position it emits, so a shorter prefix of them is too). No row gets a
    hole, for targets that verify exactly only without them. `[B]` depth and bonus."""
    n = path_tokens.shape[1]
    if n == 0:
        return depth, bonus
    least = torch.where(live, depth, n).min()
    cut = live & (depth > least)
    at = least.clamp(max=n - 1).expand(len(depth))[:, None]
    return torch.where(cut, least, depth), torch.where(cut, path_tokens.gather(1, at)[:, 0], bonus)


def _draft_nodes(nodes, node_map, row):
    """Accepted node indices of the verified draft, as indices of the drafter's own draft."""
    return nodes if node_map is None else node_map[row, nodes]


def _roll_back(target, cache, state_layers, saved, tree, slots, k, stats, clock,
               static=None) -> None:
    """Recurrent state (`recurrent.py`): keep the verification's state where all `k` fed tokens
    were committed, else restore the snapshot and feed the `k` committed ones again (through
    the static forward under `compile=True`)."""
    start = slots.ids.shape[1] - 1
    if k == tree.tokens.shape[1]:
        rec.crop_attention(cache, start + k)
        return
    rec.crop_attention(cache, start)
    rec.restore(state_layers, saved)
    t0 = clock.now()
    if static is not None:
        static.replay(tree, k, slots.cache_valid, slots.root_pos)
    else:
        rec.replay(target, tree.tokens[:, :k],
                   slots.root_pos + torch.arange(k, device=tree.tokens.device),
                   torch.cat([slots.cache_valid, tree.valid[:, :k]], 1).long(),
                   cache_kwargs(target.forward, cache))
    t1 = clock.now()
    clock.add("forward", t0, t1)  # a target forward too
    clock.add("replay", t0, t1)
    stats.replays += 1
