"""What `generate` checks and resolves before it decodes: its arguments, the target's generation
config as `target.generate` resolves it (greedy or sampling, temperature, top-k, top-p, the
repetition penalty, transformers' global defaults), and the settings whose logits processors the
direct API does not apply, which it refuses so that the output never silently differs (through
`target.generate(custom_generate=mmspec.speculative(...))` transformers' own processors apply
them: `hf_generate.py`)."""

from __future__ import annotations

import copy
import functools
import numbers
from dataclasses import dataclass

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .vocab import VocabularyMismatch, padded_widths
from .processors import NodeProcessors
from .sampling import SamplingConfig
from .draft import Drafter


def vocab_size(model) -> int:
    """Rows of the model's output embedding: the size of its logits."""
    head = model.get_output_embeddings()
    if head is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


# forward arguments the engine sets on every call: from the caller they would collide
ENGINE_KWARGS = {"past_key_values", "cache", "use_cache", "position_ids",
                  "output_hidden_states", "return_dict", "cache_position", "block_sparse_mask"}


def is_token_id(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def eos_ids(target, eos_token_id, gen=None) -> torch.Tensor:
    """An id, a list of ids or a tensor of them (numpy ints too, as `target.generate` takes);
    None: the generation config's (`gen`, by default the target's)."""
    if eos_token_id is None:
        eos_token_id = (target.generation_config if gen is None else gen).eos_token_id
    if eos_token_id is None:
        return torch.zeros(0, dtype=torch.long)
    if isinstance(eos_token_id, torch.Tensor):
        ids = eos_token_id.flatten().tolist()
    elif is_token_id(eos_token_id):
        ids = [eos_token_id]
    elif isinstance(eos_token_id, (list, tuple)):
        ids = list(eos_token_id)
    else:
        ids = None
    if ids is None or not all(is_token_id(i) for i in ids):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return torch.tensor([int(i) for i in ids], dtype=torch.long)


def check_inputs(target, drafter: Drafter, input_ids, attention_mask, max_new_tokens,
                 pad_token_id):
    """The call's inputs, and the drafter's fit to the target (`Drafter`'s checks, its vocabulary)."""
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
        raise ValueError("target: its config says is_causal=False (a bidirectional diffusion "
                         "LM); the target must be an autoregressive causal LM (a diffusion LM "
                         "drafts: DiffusionDrafter)")
    drafter.check_target(target)  # a drafter bound to one model (ViSpec): is it this one?
    _check_vocabulary(drafter, vocab_size(target))


def _check_vocabulary(drafter: Drafter, target_vocab: int) -> None:
    """The drafter's ids are the target's: equal widths, or widths padded differently within one
    tokenizer (`padded_widths`) that the drafter takes on (`Drafter.match_target_width`)."""
    drafter_vocab = drafter.vocab_size
    padded = drafter_vocab is not None and padded_widths(drafter_vocab, target_vocab)
    # every call tells the drafter, so a width set for one target does not outlive it
    widened = drafter.match_target_width(target_vocab if padded else None) and padded
    if widened and drafter.top_k > target_vocab:
        raise ValueError(f"top_k ({drafter.top_k}) must be at most the target's vocabulary "
                         f"({target_vocab} tokens)")
    if drafter_vocab is not None and drafter_vocab != target_vocab and not widened:
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


def generation_settings(model_kwargs: dict) -> dict:
    """Take the generation-config settings (`repetition_penalty`, `num_return_sequences`, ...) out
    of `model_kwargs`: `target.generate` reads them from its kwargs, the model never sees them."""
    fields = {k for k in vars(_blank_generation_config()) if not k.startswith("_")}
    return {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in fields}


# `generate`'s `max_new_tokens` when neither the call nor its `generation_config=` sets one
DEFAULT_MAX_NEW_TOKENS = 32
# fields of a `GenerationConfig` that record where it came from, not how to generate
_METADATA = {"transformers_version"}


@dataclass(frozen=True)
class CallSettings:
    """A `generate` call's settings, resolved as `target.generate` resolves them (`resolve_call`).

    max_new_tokens: new tokens per row, at most.
    sampling:       the target's sampling rule (greedy, or temperature / top-k / top-p) and
                    repetition penalty.
    eos:            long `[E]`, the ids a row stops at (none: `[0]`-shaped).
    asked_eos:      the EOS ids the call itself passed (for the drafter), else None.
    pad_token_id:   the id after a row's end, or None (then a batch of one row).
    attention_mask: `[B, L]` or None (no padding).
    model_kwargs:   the model's own inputs for the prefill (`pixel_values`, ...).
    """

    max_new_tokens: int
    sampling: SamplingConfig
    eos: torch.Tensor
    asked_eos: tuple | None
    pad_token_id: int | None
    attention_mask: torch.Tensor | None
    model_kwargs: dict


def resolve_call(target, input_ids, generation_config, kwargs: dict) -> CallSettings:
    """`generate`'s keyword arguments as transformers' `generate` reads them: the fields of a
    `GenerationConfig` (`max_new_tokens`, `do_sample`, `eos_token_id`, ...) over those of
    `generation_config=` over the target's, then transformers' defaults; `attention_mask`; and
    the model's inputs, which the target checks by name (an unknown one is an error naming it)."""
    model_kwargs = dict(kwargs)
    engine_owned = sorted(set(model_kwargs) & ENGINE_KWARGS)
    if engine_owned:
        raise ValueError(f"{', '.join(engine_owned)}: generate runs the target's cache, positions "
                         f"and outputs itself; pass only model inputs (pixel_values, ...)")
    attention_mask = model_kwargs.pop("attention_mask", None)
    settings = generation_settings(model_kwargs)  # taken out of model_kwargs
    gen, given = _base_generation_config(target, generation_config)
    if "max_length" in given and not {"max_new_tokens"} & (set(given) | set(settings)):
        raise ValueError(f"generation_config.max_length={given['max_length']!r}: give "
                         f"max_new_tokens instead")
    max_new_tokens = settings.pop("max_new_tokens", given.get("max_new_tokens",
                                                              DEFAULT_MAX_NEW_TOKENS))
    asked = {name: settings.pop(name, None) for name in ("do_sample", "temperature", "top_k",
                                                          "top_p", "eos_token_id",
                                                          "pad_token_id")}
    cfg = sampling_config(target, asked["do_sample"], asked["temperature"], asked["top_k"],
                          asked["top_p"], settings, gen)
    validate = getattr(target, "_validate_model_kwargs", None)  # transformers' typo check
    if validate is not None:
        validate(dict(model_kwargs))
    eos = eos_ids(target, asked["eos_token_id"], gen)
    pad = _pad_token_id(asked["pad_token_id"], gen, eos)
    if attention_mask is None and pad is not None and isinstance(input_ids, torch.Tensor):
        attention_mask = mask_from_padding(input_ids, pad, eos)
    if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
        max_new_tokens = int(max_new_tokens)  # a numpy int (a tensor stays refused)
    eos_given = asked["eos_token_id"] if asked["eos_token_id"] is not None else \
        given.get("eos_token_id")
    return CallSettings(max_new_tokens, cfg, eos,
                        None if eos_given is None else tuple(eos.tolist()), pad,
                        attention_mask, model_kwargs)


def _base_generation_config(target, generation_config):
    """-> (the generation config the call's own settings go over: `generation_config=`'s set
    fields over the target's, as transformers merges them; the fields it set)."""
    if generation_config is None:
        return target.generation_config, {}
    from transformers import GenerationConfig

    if not isinstance(generation_config, GenerationConfig):
        raise ValueError(f"generation_config must be a transformers GenerationConfig or None, "
                         f"got {type(generation_config).__name__}")
    given = {k: v for k, v in vars(generation_config).items()
             if not k.startswith("_") and k not in _METADATA and v is not None}
    gen = copy.deepcopy(target.generation_config)
    for name, value in given.items():
        setattr(gen, name, value)
    return gen, given


def _pad_token_id(pad_token_id, gen, eos: torch.Tensor) -> int | None:
    """The pad id: the call's, else the generation config's, else (as `target.generate`) the
    first EOS id; None where there is none."""
    if pad_token_id is None:
        pad_token_id = gen.pad_token_id
    if pad_token_id is None and len(eos):  # target.generate's fallback
        pad_token_id = int(eos[0])
    if isinstance(pad_token_id, torch.Tensor) and pad_token_id.numel() == 1:
        pad_token_id = pad_token_id.item()
    if pad_token_id is not None and not is_token_id(pad_token_id):
        raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
    return None if pad_token_id is None else int(pad_token_id)


def mask_from_padding(input_ids: torch.Tensor, pad: int, eos: torch.Tensor):
    """transformers' rule without an attention_mask: a prompt holding the pad id (one that is not
    an EOS id) is padded there; otherwise None (no padding)."""
    if pad in eos.tolist() or not bool((input_ids == pad).any()):
        return None
    return (input_ids != pad).long()


def sampling_config(target, do_sample, temperature, top_k, top_p,
                    settings: dict | None = None, gen=None) -> SamplingConfig:
    """The target's sampling rule, resolved as `target.generate` does: an argument left at None
    takes the generation config (`gen`: the call's `generation_config=` over the target's, by
    default the target's), and a field unset there transformers' global default (greedy; when
    sampling, temperature 1.0, top-k 50, top-p 1.0). `settings`: other generation settings
    passed to the call, which must leave the output as `generate` makes it."""
    gen = target.generation_config if gen is None else gen
    source = "generation_config" if gen is not target.generation_config else \
        "target.generation_config"
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
            f"{source}.repetition_penalty"
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
                f"{source}.{name}={value!r} changes the target's distribution and "
                f"mmspec.generate does not apply it; set {source}.{name} = "
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
