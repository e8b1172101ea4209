"""`speculative(drafter)`: mmspec's draft-verify loop inside transformers' own `generate`.

    spec = mmspec.speculative(mmspec.ModelDrafter(small_model, num_tokens=5))
    out = target.generate(**inputs, custom_generate=spec, max_new_tokens=256, do_sample=True,
                          temperature=0.7, repetition_penalty=1.1, streamer=streamer)
    spec.stats.mean_accepted

transformers' public hook `custom_generate=Callable` (`GenerationMixin.generate`, step 9) hands the
callable what `generate` prepared: the expanded `input_ids`, the resolved `GenerationConfig`, the
`LogitsProcessorList` and `StoppingCriteriaList` it built from every setting, and the model kwargs.
mmspec then runs its loop with them: the processors on the target's logits at every verified node,
each node with its own path as the prefix (`processors.py`), so position-wise settings are exact
and sampling draws from the distribution `target.generate` samples from; the stopping criteria on
the committed tokens. Settings that cannot be exact under speculation are refused with their
reason (`_INEXACT`, `processors._REFUSED`).

Two things transformers 5.24 drops for a callable (`_extract_generation_mode_kwargs` rebuilds its
arguments from the callable's own new parameters): the `streamer`, which it has already given the
prompt (taken back here from `generate`'s frame), and the `tokenizer`, so `stop_strings=` fails
inside transformers; pass `stopping_criteria=[StopStringCriteria(tokenizer, stop_strings)]`.
"""

from __future__ import annotations

import inspect
import sys

import torch
from transformers import GenerationMixin
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .draft import as_drafter
from .generate import run
from .loop import LoopOptions
from .static import check_compile
from .settings import check_inputs
from .processors import NodeProcessors, StopRule, refuse_processors
from .sampling import SamplingConfig

# generation settings no round can make exact: (name, is it set, why)
_INEXACT = (
    ("num_beams", lambda v: v is not None and v > 1,
     "beam search keeps num_beams hypotheses per row and re-ranks them by their joint score; "
     "the draft-verify loop commits one sequence per row"),
    ("penalty_alpha", lambda v: v is not None and v > 0,
     "contrastive search re-ranks the top-k candidates by a forward through each one, a rule "
     "other than the target's next-token distribution"),
    ("dola_layers", lambda v: v is not None,
     "DoLa contrasts the last layer's logits with early layers' at every step; the verification "
     "forward computes the last layer's only"),
    ("prompt_lookup_num_tokens", lambda v: v is not None,
     "prompt lookup is transformers' own drafter; mmspec drafts with its drafter "
     "(mmspec.PromptLookupDrafter)"),
    ("output_scores", bool, "speculative returns the sequences, not per-step scores"),
    ("output_logits", bool, "speculative returns the sequences, not per-step logits"),
    ("output_attentions", bool, "speculative returns the sequences, not attentions"),
    ("output_hidden_states", bool, "speculative returns the sequences, not hidden states"),
)

# model kwargs `generate` prepared for its own loop: the engine makes its own
_PREPARED = ("attention_mask", "position_ids", "cache", "past_key_values", "logits_to_keep",
             "use_cache", "cache_position")

_GENERATE_CODE = inspect.unwrap(GenerationMixin.generate).__code__


def _generate_frame_locals() -> dict:
    """The locals of the `GenerationMixin.generate` call that called the callable (empty when
    something else called it)."""
    frame = sys._getframe(2)
    return frame.f_locals if frame.f_code is _GENERATE_CODE else {}


def _refuse_settings(gen, caller: dict) -> None:
    for name, is_set, why in _INEXACT:
        value = getattr(gen, name, None)
        if is_set(value):
            raise ValueError(f"{name}={value!r}: {why}; leave it out with "
                             f"custom_generate=mmspec.speculative(...)")
    if caller.get("assistant_model") is not None:
        raise ValueError("assistant_model: custom_generate=mmspec.speculative(drafter) drafts with "
                         "its drafter; leave assistant_model out (or wrap it: "
                         "mmspec.ModelDrafter(assistant_model))")


def _drafter_sampling(gen) -> SamplingConfig | None:
    """The call's warping for a drafter that proposes from it (`ModelDrafter(sample=True)`)."""
    if not gen.do_sample:
        return None
    top_p = gen.top_p if gen.top_p is not None else 1.0
    return SamplingConfig(True, float(gen.temperature or 1.0),
                          int(gen.top_k) if gen.top_k else None, float(top_p))


class Speculative:
    """The `custom_generate` callable (`speculative`). `stats`: the last call's `SpecStats`."""

    def __init__(self, drafter, on_round=None, profile: bool = False, compile=False):
        as_drafter(drafter)  # a TypeError now rather than at the first call
        self.drafter, self.on_round, self.profile = drafter, on_round, profile
        self.compile_config = check_compile(compile)
        self.stats = None

    def __call__(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                 synced_gpus=False, streamer=None, generator=None, **model_kwargs):
        # `generator`: not a parameter of transformers' own loops, so `generate` passes it here
        caller = _generate_frame_locals()
        if streamer is None:  # transformers 5.24 gave it the prompt, then dropped it
            streamer = caller.get("streamer")
        gen = generation_config
        if synced_gpus:
            raise ValueError("synced_gpus=True: the rounds of speculative decoding differ per "
                             "process; run one process per model")
        _refuse_settings(gen, caller)
        batch = input_ids.shape[0]
        refuse_processors(logits_processor, batch)
        if model_kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds: speculative decoding needs input_ids (the drafter "
                             "and the committed sequence are token ids)")
        cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError("cache: a cache that already holds entries; speculative decoding "
                             "starts from the prompt (pass the whole prompt, no cache)")
        attention_mask = model_kwargs.get("attention_mask")
        model_kwargs = {k: v for k, v in model_kwargs.items() if k not in _PREPARED}
        stop = StopRule(stopping_criteria)
        if stop.max_length is None:
            raise ValueError("max_length: speculative decoding needs a length budget (pass "
                             "max_new_tokens=)")
        max_new_tokens = stop.max_length - input_ids.shape[1]
        eos = (stop.eos.cpu() if stop.eos is not None else torch.zeros(0, dtype=torch.long))
        pad = gen._pad_token_tensor
        pad = None if pad is None else int(pad)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        drafter = as_drafter(self.drafter)  # read per call: its attributes may have changed
        check_inputs(model, drafter, input_ids, attention_mask, max_new_tokens, pad)
        drafter.check_inputs(model_kwargs)
        if streamer is not None and batch != 1:
            raise ValueError(f"streamer needs a batch of 1 row, got {batch}")
        options = LoopOptions(
            rule=NodeProcessors(logits_processor, bool(gen.do_sample)), eos=eos,
            pad=0 if pad is None else pad, stop=stop, asked_eos=tuple(eos.tolist()),
            sampling=_drafter_sampling(gen), streamer=streamer, generator=generator,
            on_round=self.on_round, profile=self.profile, put_prompt=False)
        prompt = {"input_ids": input_ids, "attention_mask": attention_mask,
                  "model_kwargs": model_kwargs}
        out = run(model, drafter, prompt, max_new_tokens, options, self.compile_config)
        self.stats = out.stats
        if gen.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=out.sequences)
        return out.sequences


def speculative(drafter, on_round=None, profile: bool = False, compile=False) -> Speculative:
    """A `custom_generate=` callable for `target.generate` that decodes speculatively with
    `drafter`, losslessly: the output is distributed exactly as `target.generate`'s with the same
    settings (greedy: equal). `generate`'s own arguments all apply (`max_new_tokens`, sampling
    settings, processors, stopping criteria, `streamer`, batches with `attention_mask`), plus
    `generator=` (a `torch.Generator` for the draws). `on_round`, `profile`, `compile`: as in
    `mmspec.generate`. The last call's `SpecStats` are on `.stats`."""
    return Speculative(drafter, on_round, profile, compile)
