"""Drafters on top of the engine's contract (`mmspec.decoding.draft`).

ModelDrafter            a small AR model (chain or EAGLE-2-style tree)
PromptLookupDrafter     n-gram copy from the prompt and the output
DiffusionDrafter        DiffuSpec: diffusion-LM lattice + CPS + ADL (`diffusion.py`)
NaiveDiffusionDrafter   the baseline: argmax path of the lattice, fixed k
"""

from .adl import AdaptiveDraftLength, ADLConfig, FixedDraftLength
from .cps import CPSConfig
from .diffusion import DiffusionDrafter, DiffusionDrafterConfig, NaiveDiffusionDrafter
from .lattice import Lattice, build_lattice
from .lm_proxy import CausalLMProxy
from .model_drafter import ModelDrafter
from .ngram_proxy import NgramProxy
from .prompt_lookup import PromptLookupDrafter

__all__ = [
    "ADLConfig",
    "AdaptiveDraftLength",
    "CPSConfig",
    "CausalLMProxy",
    "DiffusionDrafter",
    "DiffusionDrafterConfig",
    "FixedDraftLength",
    "Lattice",
    "ModelDrafter",
    "NaiveDiffusionDrafter",
    "NgramProxy",
    "PromptLookupDrafter",
    "build_lattice",
]
