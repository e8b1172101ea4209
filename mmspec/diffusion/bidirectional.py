"""Use a `Qwen2ForCausalLM` bidirectionally, as Dream does (Qwen2 layers with full attention).

`config.is_causal = False` makes transformers' mask builder return a bidirectional (padding-only)
mask; in transformers 5.23 that alone gives full attention on the SDPA and eager paths (checked,
with and without an attention_mask). Each attention module's `is_causal` flag is cleared as well,
because backends that read that flag instead of a mask (flash-attention, or SDPA when the mask is
skipped) would otherwise silently attend causally (the McGill-NLP/llm2vec#74 pitfall).
"""

from __future__ import annotations

import torch


def make_bidirectional(model: torch.nn.Module) -> torch.nn.Module:
    model.config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model
