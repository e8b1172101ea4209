"""Use a `Qwen2ForCausalLM` bidirectionally, as Dream does (Qwen2 layers with full attention).

Two switches are needed in transformers 5.x: `config.is_causal = False` makes the mask builder
return a bidirectional (padding-only) mask, and each attention module's `is_causal` must be False
too, because when that mask is skipped (no padding) SDPA falls back to the module flag and would
silently attend causally again (the McGill-NLP/llm2vec#74 pitfall).
"""

from __future__ import annotations

import torch


def make_bidirectional(model: torch.nn.Module) -> torch.nn.Module:
    model.config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model
