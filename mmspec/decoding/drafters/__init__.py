"""Drafters on top of the engine's contract (`mmspec.decoding.draft`).

DiffusionDrafter        DiffuSpec: diffusion-LM lattice + CPS + ADL (`diffusion.py`)
NaiveDiffusionDrafter   the baseline: argmax path of the lattice, fixed k
"""

from .adl import ADLConfig, AdaptiveDraftLength, FixedDraftLength
from .cps import CPSConfig
from .diffusion import DiffusionDrafter, DiffusionDrafterConfig, NaiveDiffusionDrafter
from .lattice import Lattice, build_lattice
from .lm_proxy import CausalLMProxy
from .ngram_proxy import NgramProxy

__all__ = [
    "ADLConfig",
    "AdaptiveDraftLength",
    "CPSConfig",
    "CausalLMProxy",
    "DiffusionDrafter",
    "DiffusionDrafterConfig",
    "FixedDraftLength",
    "Lattice",
    "NaiveDiffusionDrafter",
    "NgramProxy",
    "build_lattice",
]
