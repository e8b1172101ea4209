"""Speculative decoding: a lossless draft-verify loop for any Hugging Face causal LM or VLM.

    import mmspec
    drafter = mmspec.ModelDrafter(small_model, num_tokens=5)            # a chain
    drafter = mmspec.ModelDrafter(small_model, num_tokens=30, top_k=8)  # an EAGLE-2 tree
    drafter = mmspec.PromptLookupDrafter()                              # n-gram lookup, no model
    inputs = processor(images=img, text=prompt, return_tensors="pt")
    out = mmspec.generate(target, drafter, **inputs, max_new_tokens=256, do_sample=False,
                          streamer=TextStreamer(tokenizer, skip_special_tokens=True))
    out.sequences, out.stats.mean_accepted, out.stats.tokens_per_s
    # or inside transformers' generate, with all of its settings:
    spec = mmspec.speculative(drafter)
    ids = target.generate(**inputs, custom_generate=spec, max_new_tokens=256, streamer=streamer)

Layout: `draft.py` (the drafter contract), `generate.py` (the loop), `settings.py` (arguments
and generation-config resolution), `admission.py` (the probe and refusals before the first
token), `recurrent.py` (hybrid targets' rollback), `clock.py` (timing), `hf_generate.py`
(`custom_generate=mmspec.speculative(...)`), `processors.py` (transformers' processors per node), `tree.py` (tree and mask),
`hf_generate.py` (`speculative`, the `custom_generate` callable), `processors.py` (transformers'
logits processors and stopping criteria per tree node), `verify.py` (greedy and rejection
sampling), `sampling.py` (temperature / top-k / top-p for drafters),
`kv_cache.py` (path commit), `positions.py` (tree and M-RoPE positions), `stats.py`,
`drafters/` (built-in drafters; the diffusion drafters are `mmspec.diffusion`); the
`mmspec generate` command is `mmspec/cli/generate.py`.
"""

from .admission import UnsupportedTarget
from .draft import Draft, Drafter, DraftState, VerifyResult
from .drafters import ModelDrafter, PromptLookupDrafter
from .generate import SpecOutput, generate
from .hf_generate import speculative
from .stats import SpecStats

__all__ = [
    "Draft",
    "DraftState",
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SpecOutput",
    "SpecStats",
    "UnsupportedTarget",
    "VerifyResult",
    "generate",
    "speculative",
]
