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

import numbers

import functools
import inspect
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.kernels.hf import require_block_sparse_mask, use_block_sparse_attention

from . import admission, kv_cache
from . import recurrent as rec
from .draft import Draft, DraftState, VerifyResult
from .drafters.vocab import VocabularyMismatch, padded_widths
from .positions import prefill_position_ids
from .processors import NodeProcessors
from .sampling import SamplingConfig
from .stats import SpecStats
from .tree import build_tree, raise_draft_errors, verify_mask, verify_token_mask
from .windows import sliding_windows
from .verify import verify_greedy, verify_sampling


@dataclass
class SpecOutput:
    """sequences: long `[B, L + n]`, the (left-padded) prompt then the new tokens, padded after EOS."""

    sequences: torch.Tensor
    stats: SpecStats


def vocab_size(model) -> int:
    """Rows of the model's output embedding: the size of its logits."""
    head = model.get_output_embeddings()
    if head is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


@contextmanager
def block_sparse_attention_of(model):
    """Route the model's attention through mmspec's layer for the duration of the block."""
    restore = use_block_sparse_attention(model)
    try:
        yield
    finally:
        restore()


class _Clock:
    """Stamps of a call's phases. `profile=True` on a CUDA device: CUDA events, read once when
    the call is over (no round waits for them); otherwise wall time, which on a GPU is the host's
    view (kernels launched, not finished): only the call's total is then synchronised."""

    def __init__(self, device: torch.device, profile: bool):
        self.device = device
        self.events = profile and device.type == "cuda"
        self.spans: dict = {}  # name -> event pairs, or seconds so far

    def now(self):
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, name: str, start, end) -> None:
        if self.events:
            self.spans.setdefault(name, []).append((start, end))
        else:
            self.spans[name] = self.spans.get(name, 0.0) + (end - start)

    def seconds(self, name: str) -> float:
        if self.events:
            return sum(a.elapsed_time(b) for a, b in self.spans.get(name, [])) / 1000
        return self.spans.get(name, 0.0)

    def finish(self) -> float:
        """Wait for the device once; the wall time now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _is_token_id(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _eos_ids(target, eos_token_id) -> torch.Tensor:
    """An id, a list of ids or a tensor of them (numpy ints too, as `target.generate` takes)."""
    if eos_token_id is None:
        eos_token_id = target.generation_config.eos_token_id
    if eos_token_id is None:
        return torch.zeros(0, dtype=torch.long)
    if isinstance(eos_token_id, torch.Tensor):
        ids = eos_token_id.flatten().tolist()
    elif _is_token_id(eos_token_id):
        ids = [eos_token_id]
    elif isinstance(eos_token_id, (list, tuple)):
        ids = list(eos_token_id)
    else:
        ids = None
    if ids is None or not all(_is_token_id(i) for i in ids):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return torch.tensor([int(i) for i in ids], dtype=torch.long)


# forward arguments the engine sets on every call: from the caller they would collide
_ENGINE_KWARGS = {"past_key_values", "cache", "use_cache", "position_ids",
                  "output_hidden_states", "return_dict", "cache_position", "block_sparse_mask"}


def _check_inputs(target, drafter, input_ids, attention_mask, max_new_tokens, pad_token_id):
    if not callable(getattr(drafter, "propose", None)):
        hint = (": wrap a small model as ModelDrafter(model)"
                if isinstance(drafter, torch.nn.Module) else "")
        raise TypeError(f"drafter must be a drafter (ModelDrafter, PromptLookupDrafter, "
                        f"DiffusionDrafter, ViSpecDrafter, ...), got {type(drafter).__name__}"
                        f"{hint}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise ValueError(f"input_ids must be a long tensor [B, L], got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    if input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must hold at least one token per row, got shape "
                         f"{tuple(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise ValueError(f"attention_mask must be a tensor [B, L] or None, got "
                             f"{type(attention_mask).__name__}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must match input_ids {tuple(input_ids.shape)}, got "
                             f"{tuple(attention_mask.shape)}")
        empty = ~attention_mask.bool().any(-1)
        if empty.any():
            raise ValueError(f"attention_mask: row {int(empty.nonzero()[0])} has no real token "
                             f"(all padding); every row needs a prompt")
        if not attention_mask[:, -1].bool().all():
            raise ValueError("attention_mask must be left-padded (every row's last token real); "
                             "set tokenizer.padding_side = 'left'")
    if input_ids.shape[0] > 1 and pad_token_id is None:
        raise ValueError(f"a batch of {input_ids.shape[0]} rows needs a padding token: pass "
                         f"pad_token_id=, set target.generation_config.pad_token_id or give "
                         f"the target an EOS id (which then pads, as in target.generate)")
    config = getattr(target, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text_config, "is_causal", True) is False:  # ran, then differed from its generate
        raise ValueError(f"target: its config says is_causal=False (a bidirectional diffusion "
                         f"LM); the target must be an autoregressive causal LM (a diffusion LM "
                         f"drafts: DiffusionDrafter)")
    check_target = getattr(drafter, "check_target", None)
    if check_target is not None:  # a drafter bound to one model (ViSpec): is it this one?
        check_target(target)
    drafter_vocab = getattr(drafter, "vocab_size", None)
    target_vocab = vocab_size(target)
    match_width = getattr(drafter, "match_target_width", None)
    padded = (drafter_vocab is not None and match_width is not None
              and padded_widths(drafter_vocab, target_vocab))
    if padded and getattr(drafter, "top_k", 1) > target_vocab:
        raise ValueError(f"top_k ({drafter.top_k}) must be at most the target's vocabulary "
                         f"({target_vocab} tokens)")
    if match_width is not None:
        match_width(target_vocab if padded else None)
    if drafter_vocab is not None and drafter_vocab != target_vocab and not padded:
        raise VocabularyMismatch(
            f"drafter vocabulary ({drafter_vocab} tokens) does not match the target's "
            f"({target_vocab} tokens); target and drafter must share a tokenizer and an output "
            f"vocabulary (widths within 1%, both multiples of 64, are taken as padding)")


# generation-config settings whose logits processors `generate` does not apply: refused, so that
# the output never silently differs from `target.generate`'s. (attribute, neutral values, sampling only)
_UNSUPPORTED = (
    ("no_repeat_ngram_size", (None, 0), False),
    ("encoder_repetition_penalty", (None, 1.0), False), ("bad_words_ids", (None,), False),
    ("suppress_tokens", (None,), False), ("begin_suppress_tokens", (None,), False),
    ("forced_bos_token_id", (None,), False), ("forced_eos_token_id", (None,), False),
    ("sequence_bias", (None,), False), ("min_length", (None, 0), False),
    ("min_new_tokens", (None, 0), False), ("min_p", (None,), True), ("typical_p", (None, 1.0), True),
    ("epsilon_cutoff", (None, 0.0), True), ("eta_cutoff", (None, 0.0), True),
    ("top_h", (None,), True), ("exponential_decay_length_penalty", (None,), False),
    ("guidance_scale", (None, 1.0), False), ("watermarking_config", (None,), False),
    ("stop_strings", (None,), False),
    # other decoding strategies than greedy / multinomial sampling
    ("num_beams", (None, 1), False), ("penalty_alpha", (None, 0.0), False),
    ("dola_layers", (None,), False),
    # one sequence per prompt
    ("num_return_sequences", (None, 1), False),
)

# what `target.generate` uses for a generation-config field left at None
_HF_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}


@functools.cache
def _hf_defaults() -> dict:
    from transformers import GenerationConfig

    return {**_HF_DEFAULTS,
            **getattr(GenerationConfig, "_get_default_generation_params", dict)()}


def _hf_default(name: str):
    return _hf_defaults()[name]


@functools.cache
def _blank_generation_config():
    """transformers' `GenerationConfig()`: its fields and their neutral values."""
    from transformers import GenerationConfig

    return GenerationConfig()


def _generation_settings(model_kwargs: dict) -> dict:
    """Take the generation-config settings (`repetition_penalty`, `num_return_sequences`, ...) out
    of `model_kwargs`: `target.generate` reads them from its kwargs, the model never sees them."""
    fields = {k for k in vars(_blank_generation_config()) if not k.startswith("_")}
    return {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in fields}


def _mask_from_padding(input_ids: torch.Tensor, pad: int, eos: torch.Tensor):
    """transformers' rule without an attention_mask: a prompt holding the pad id (one that is not
    an EOS id) is padded there; otherwise None (no padding)."""
    if pad in eos.tolist() or not bool((input_ids == pad).any()):
        return None
    return (input_ids != pad).long()


def sampling_config(target, do_sample, temperature, top_k, top_p,
                    settings: dict | None = None) -> SamplingConfig:
    """The target's sampling rule, resolved as `target.generate` does: an argument left at None
    takes the target's generation config, and a field unset there transformers' global default
    (greedy; when sampling, temperature 1.0, top-k 50, top-p 1.0). `settings`: other generation
    settings passed to the call, which must leave the output as `generate` makes it."""
    gen = target.generation_config
    settings = dict(settings or {})
    blank = _blank_generation_config()
    known = {name for name, _, _ in _UNSUPPORTED} | {"repetition_penalty"}  # checked below
    hints = {"max_length": "give max_new_tokens instead"}
    for name in ("return_dict_in_generate", "output_scores", "output_logits",
                 "output_attentions"):
        hints[name] = ("not supported: generate returns SpecOutput (.sequences, .stats); run "
                       "target.generate for scores, logits or attentions")
    for name, value in settings.items():  # a setting no logits processor here would apply
        if name not in known and value != getattr(blank, name):
            why = hints.get(name, "mmspec.generate does not apply this generation setting (its "
                                  "output would differ from target.generate's); leave it out or "
                                  "use target.generate")
            raise ValueError(f"{name}={value!r}: {why}")

    def resolve(name, value):
        if value is None:
            value = getattr(gen, name, None)
        return _hf_default(name) if value is None else value

    do_sample = bool(resolve("do_sample", do_sample))
    penalty = settings.get("repetition_penalty", getattr(gen, "repetition_penalty", None))
    if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float))
                                or not penalty > 0):
        where = "repetition_penalty" if "repetition_penalty" in settings else \
            "target.generation_config.repetition_penalty"
        raise ValueError(f"{where} must be a number > 0, got {penalty!r}")
    penalty = None if penalty in (None, 1.0) else float(penalty)
    for name, neutral, sampling_only in _UNSUPPORTED:
        if name in settings:
            value = settings[name]
            if value not in neutral and (do_sample or not sampling_only):
                raise ValueError(
                    f"{name}={value!r} changes the target's distribution and mmspec.generate "
                    f"does not apply it; leave it out (or {name}={neutral[-1]!r})")
            continue
        value = getattr(gen, name, None)
        if value not in neutral and (do_sample or not sampling_only):
            raise ValueError(
                f"target.generation_config.{name}={value!r} changes the target's distribution and "
                f"mmspec.generate does not apply it; set target.generation_config.{name} = "
                f"{neutral[-1]!r} (target.generate then gives the same output)")
    if not do_sample:
        return SamplingConfig(False, repetition_penalty=penalty)
    top_k = resolve("top_k", top_k)
    return SamplingConfig(True, resolve("temperature", temperature), top_k or None,
                          resolve("top_p", top_p), penalty)


def sampling_processors(cfg: SamplingConfig, attention_mask=None) -> NodeProcessors:
    """`cfg` as the transformers processors `target.generate` builds for it (repetition
    penalty, skipping each row's left padding as transformers 5.24 does, then temperature, top-k,
    top-p), for the engine's `NodeProcessors`."""
    procs = []
    if cfg.repetition_penalty is not None:
        padding = None if attention_mask is None else (attention_mask != 0).int().argmax(dim=1)
        procs.append(RepetitionPenaltyLogitsProcessor(float(cfg.repetition_penalty),
                                                      prompt_ignore_length=padding))
    if cfg.do_sample:
        if cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(float(cfg.temperature)))
        if cfg.top_k is not None:
            procs.append(TopKLogitsWarper(int(cfg.top_k)))
        if cfg.top_p is not None and cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(float(cfg.top_p)))
    return NodeProcessors(procs, cfg.do_sample)


def _pick(scores: torch.Tensor, do_sample: bool, generator) -> torch.Tensor:
    """scores `[B, V]` (processed) -> long `[B]`, greedy or sampled."""
    if not do_sample:
        return scores.argmax(-1)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


def _hidden(out, layers):
    """The drafter's features: hidden states of `layers`, concatenated `[B, L, H * len(layers)]`."""
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1)


def _prefill(target, input_ids, attention_mask, model_kwargs, layers, windows):
    """The prompt forward, as `target.generate` runs it (no mask without padding, last logits
    only). With sliding windows, into a cache that keeps every entry (`windows.py`)."""
    position_ids = prefill_position_ids(target, input_ids, attention_mask, model_kwargs)
    if "logits_to_keep" in inspect.signature(target.forward).parameters:
        model_kwargs = {"logits_to_keep": 1, **model_kwargs}
    mask = None if bool(attention_mask.all()) else attention_mask
    inputs = target.prepare_inputs_for_generation(
        input_ids, attention_mask=mask,
        position_ids=position_ids,
        use_cache=True, is_first_iteration=True, **model_kwargs,
        **cache_kwargs(target.prepare_inputs_for_generation,
                       admission.engine_cache(target, windows)))
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
             pad_token_id=None, generator=None, on_round=None, profile=False,
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
        **model_kwargs: passed to the target's prefill (`pixel_values`, `image_grid_thw`, ...);
            as in `target.generate`, a name the model does not take is an error, and so is a
            generation setting `generate` does not apply (`no_repeat_ngram_size=`, ...).
    """
    if "generation_config" in model_kwargs:  # transformers' typo check named it a typo
        raise ValueError("generation_config=: not taken; pass its settings as arguments "
                         "(do_sample=, temperature=, top_k=, top_p=, repetition_penalty=, "
                         "eos_token_id=) or set target.generation_config")
    engine_owned = sorted(set(model_kwargs) & _ENGINE_KWARGS)
    if engine_owned:
        raise ValueError(f"{', '.join(engine_owned)}: generate runs the target's cache, positions "
                         f"and outputs itself; pass only model inputs (pixel_values, ...)")
    settings = _generation_settings(model_kwargs)  # taken out of model_kwargs
    cfg = sampling_config(target, do_sample, temperature, top_k, top_p, settings)
    validate = getattr(target, "_validate_model_kwargs", None)  # transformers' typo check
    if validate is not None:
        validate(dict(model_kwargs))
    eos = _eos_ids(target, eos_token_id)
    if pad_token_id is None:
        pad_token_id = target.generation_config.pad_token_id
    if pad_token_id is None and len(eos):  # target.generate's fallback
        pad_token_id = int(eos[0])
    if isinstance(pad_token_id, torch.Tensor) and pad_token_id.numel() == 1:
        pad_token_id = pad_token_id.item()
    if pad_token_id is not None and not _is_token_id(pad_token_id):
        raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
    pad_token_id = None if pad_token_id is None else int(pad_token_id)
    if attention_mask is None and pad_token_id is not None and isinstance(input_ids, torch.Tensor):
        attention_mask = _mask_from_padding(input_ids, pad_token_id, eos)
    if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
        max_new_tokens = int(max_new_tokens)  # a numpy int (a tensor stays refused)
    _check_inputs(target, drafter, input_ids, attention_mask, max_new_tokens, pad_token_id)
    check_model_inputs = getattr(drafter, "check_inputs", None)
    if check_model_inputs is not None:  # a drafter that knows its target's inputs (ViSpec)
        check_model_inputs(model_kwargs)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer needs a batch of 1 row, got {input_ids.shape[0]}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    asked_eos = None if eos_token_id is None else tuple(eos.tolist())  # for the drafter
    return run(target, drafter, input_ids, attention_mask, max_new_tokens, model_kwargs,
               rule=sampling_processors(cfg, attention_mask), stop=None, eos=eos, asked_eos=asked_eos,
               sampling=cfg if cfg.do_sample else None, streamer=streamer,
               pad=0 if pad_token_id is None else pad_token_id, generator=generator,
               on_round=on_round, profile=profile)


def run(target, drafter, input_ids, attention_mask, max_new_tokens, model_kwargs,
        **loop) -> SpecOutput:
    """The checked call's admission, the target's attention switch and the drafter's `end()`
    around the loop (`_generate`'s keyword arguments in `loop`); shared by `generate` and
    `speculative` (`hf_generate.py`)."""
    windows = sliding_windows(target)
    probe = _admit(target, drafter, input_ids, attention_mask, windows, max_new_tokens)
    with block_sparse_attention_of(target), torch.no_grad():
        try:
            return _generate(target, drafter, input_ids, attention_mask.long(), max_new_tokens,
                             model_kwargs, windows, probe, **loop)
        except IndexError as err:  # a learned position table (GPT-2, OPT) indexed past its end
            _refuse_past_positions(target, input_ids.shape[1], max_new_tokens, err)
            raise
        finally:  # inside the target's switch: a drafter sharing the model restores it first
            end = getattr(drafter, "end", None)
            if end is not None:
                end()


def _admit(target, drafter, input_ids, attention_mask, windows, max_new_tokens):
    """The target's probe (`admission.py`), and the refusals it implies for this call, before the
    prefill: a batch whose rows would leave holes, a tree drafter (or any round through a mask,
    with sliding windows) where no tree verification is exact."""
    admission.check_length(target, input_ids.shape[1] + max_new_tokens)
    probe = admission.probe(target, input_ids, attention_mask, windows)
    if probe is None:
        return None
    name = type(target).__name__
    if input_ids.shape[0] > 1 and not probe.holes:
        raise admission.UnsupportedTarget(
            f"{name}: a batch of {input_ids.shape[0]} rows leaves holes where rows reject "
            f"different numbers of tokens, and this model does not verify exactly around them "
            f"({probe.why}; it takes its positions or biases from cache slots, not "
            f"position_ids); pass one prompt per call")
    if probe.tree_mode is None and (windows or getattr(drafter, "top_k", 1) > 1):
        _refuse_trees(name, probe, windows)
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
        hidden = ~verify_token_mask(tree, slots.cache_valid)  # [B, N, C + N]
        attn = torch.zeros((), dtype=dtype, device=hidden.device).masked_fill(
            hidden, torch.finfo(dtype).min)[:, None]  # [B, 1, N, C + N]
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
              on_round, profile=False, put_prompt=True) -> SpecOutput:
    """The loop. A round reads the device once (`host = ...tolist()`): every host decision after
    the draft (the accepted lengths, EOS, stats, streamed tokens) comes from that read, and every
    one before it from the previous round's. What the drafter and the target's forward do inside
    is theirs (`tests/decoding/test_syncs.py` counts both)."""
    device = input_ids.device
    stats = SpecStats()
    clock = _Clock(device, profile)
    start = time.perf_counter()
    layers = tuple(getattr(drafter, "target_hidden_layers", (-1,))) if getattr(
        drafter, "needs_target_hidden", False) else ()
    need_hidden = bool(layers)
    vocab = vocab_size(target)
    b = input_ids.shape[0]

    p0 = clock.now()
    logits, cache, prompt_pos, hidden = _prefill(target, input_ids, attention_mask, model_kwargs,
                                                 layers, windows)
    recurrent = admission.check_cache(target, cache, b)  # before the first token
    state_layers = rec.recurrent_layers(cache) if recurrent else []
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
                           hidden, model_kwargs, generator, asked_eos, sampling)
        ta = clock.now()
        draft = drafter.propose(state) if depth_cap > 0 else Draft.empty(b, device)
        tb = clock.now()
        tree = build_tree(slots.ids[:, -1], draft, vocab, defer_checks=True)
        # finished rows and nodes deeper than a row's budget are never committed: drop them, so
        # no position runs past prompt + max_new_tokens (GPT-2's table ends there) or grows in a
        # finished row
        remaining_t = torch.tensor(remaining, device=device)
        tree.valid &= (rows.live_t[:, None] & (tree.depth <= remaining_t[:, None])) | (tree.depth == 0)
        mask = _tree_mask(tree, slots, windows)
        if recurrent and mask is not None:
            raise admission.UnsupportedTarget(
                f"{type(target).__name__}: its cache holds recurrent state (linear attention "
                f"or SSM), through which a draft tree's branches would mix; draft chains "
                f"(ModelDrafter(top_k=1), PromptLookupDrafter)")
        saved = rec.snapshot(state_layers) if recurrent else None
        tc = clock.now()
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
        new = torch.cat([path_tokens, bonus[:, None]], dim=1)  # [B, K]
        new[torch.arange(b, device=device), depth] = bonus
        num, hit = rows.cut(new, depth + 1)  # cut at EOS and max_new_tokens
        rows.write(new, num)
        drafted = (tree.valid[:, 1:] & rows.live_t[:, None]).sum(-1)
        # the round's one device-to-host read
        host = torch.cat([torch.stack([depth, num, hit.long(), drafted]).flatten(),
                          new.flatten(), tree.checks]).tolist()
        raise_draft_errors(host[-4:], draft, vocab)
        depth_h, num_h, drafted_h = host[:b], host[b: 2 * b], host[3 * b: 4 * b]
        new_h = [host[4 * b + r * new.shape[1]: 4 * b + (r + 1) * new.shape[1]] for r in range(b)]
        num_h, hit_h = _stop_at_criteria(rows, stop, num_h, [bool(h) for h in host[2 * b: 3 * b]])
        live_h, live = list(rows.live), rows.live_t
        rows.advance(num_h, hit_h)

        # commit the root and the accepted nodes at cache slots [C, C + K); holes where shorter
        k = max(d for d, alive in zip(depth_h, live_h) if alive) + 1
        keep, keep_valid = keep[:, :k], keep_valid[:, :k]
        if recurrent:  # one row, a chain: replay the committed tokens where one was rejected
            _roll_back(target, cache, state_layers, saved, tree, slots, k, stats, clock)
        else:
            kv_cache.commit_path(cache, slots.ids.shape[1] - 1, keep, in_place=tree.is_chain)
        slots.append(path_tokens[:, : k - 1], keep_valid[:, 1:], bonus, depth, live)
        if need_hidden:
            h = _hidden(out, layers)  # [B, N, H']
            hidden = h.gather(1, keep[..., None].expand(-1, -1, h.shape[-1]))  # [B, K, H]
        if streamer is not None and num_h[0] > 0:
            streamer.put(torch.tensor(new_h[0][: num_h[0]]))
        accepted_h = [min(d, n) if alive else 0 for d, n, alive in zip(depth_h, num_h, live_h)]
        result = VerifyResult(
            num_accepted=torch.where(live, depth, 0),
            new_tokens=[new[r, : num_h[r]] for r in range(b)],
            accepted_nodes=[keep[r, 1: 1 + (depth_h[r] if live_h[r] else 0)] - 1 for r in range(b)],
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
            _fill_times(stats, clock)
        if on_round is not None:
            on_round(draft, result, stats)

    if streamer is not None:
        streamer.end()
    sequences = rows.sequences
    stats.total_time = clock.finish() - start
    _fill_times(stats, clock)
    return SpecOutput(sequences, stats)


def _roll_back(target, cache, state_layers, saved, tree, slots, k, stats, clock) -> None:
    """Recurrent state (`recurrent.py`): keep the verification's state where all `k` fed tokens
    were committed, else restore the snapshot and feed the `k` committed ones again."""
    start = slots.ids.shape[1] - 1
    if k == tree.tokens.shape[1]:
        rec.crop_attention(cache, start + k)
        return
    rec.crop_attention(cache, start)
    rec.restore(state_layers, saved)
    t0 = clock.now()
    rec.replay(target, tree.tokens[:, :k],
               slots.root_pos + torch.arange(k, device=tree.tokens.device),
               torch.cat([slots.cache_valid, tree.valid[:, :k]], 1).long(),
               cache_kwargs(target.forward, cache))
    t1 = clock.now()
    clock.add("forward", t0, t1)  # a target forward too
    clock.add("replay", t0, t1)
    stats.replays += 1


def _fill_times(stats, clock) -> None:
    stats.prefill_time = clock.seconds("prefill")
    stats.draft_time = clock.seconds("draft")
    stats.verify_time = clock.seconds("round") - stats.draft_time
    stats.target_forward_time = clock.seconds("forward")
    stats.replay_time = clock.seconds("replay")
