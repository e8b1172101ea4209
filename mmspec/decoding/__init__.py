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

Layout: `draft.py` (the drafter contract: `Drafter` and what it sees), `generate.py` (the entry
point: arguments, the verifier choice, the call around the loop), `settings.py` (arguments and
generation-config resolution), `loop.py` (the round loop: prefill, draft, verify, accept,
commit), `rows.py` (the rows' and slots' bookkeeping, with a worked example), `verifier.py` (how
the target runs: the `Verifier` interface and its eager implementation), `static.py` (its
compiled one, `compile=True`), `admission.py` (the probe and refusals before the first token),
`recurrent.py` (hybrid targets' rollback), `clock.py` (timing), `hf_generate.py` (`speculative`,
the `custom_generate` callable), `processors.py` (transformers' logits processors and stopping
criteria per tree node), `tree.py` (tree and mask), `verify.py` (greedy and rejection sampling),
`sampling.py` (temperature / top-k / top-p for drafters), `kv_cache.py` (path commit),
`positions.py` (tree and M-RoPE positions), `stats.py`, `drafters/` (built-in drafters; the diffusion drafters are `mmspec.diffusion`); the
`mmspec generate` command is `mmspec/cli/generate.py`. docs/drafters.md: write your own drafter.
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
