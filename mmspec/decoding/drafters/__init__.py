"""Drafters on top of the engine's contract (`mmspec.decoding.draft`).

ModelDrafter            a small AR model (chain or EAGLE-2-style tree)
PromptLookupDrafter     n-gram copy from the prompt and the output

The diffusion drafters (DiffuSpec, DFlash) live in `mmspec.diffusion`.
"""

from .model_drafter import ModelDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["ModelDrafter", "PromptLookupDrafter"]
