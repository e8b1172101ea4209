"""Speculative decoding: a lossless draft-verify loop for any Hugging Face causal LM or VLM."""

from .draft import Draft, Drafter, DraftState, VerifyResult
from .drafters import ModelDrafter, PromptLookupDrafter
from .generate import SpecOutput, generate
from .stats import SpecStats

__all__ = [
    "Draft",
    "DraftState",
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "SpecOutput",
    "SpecStats",
    "VerifyResult",
    "generate",
]
