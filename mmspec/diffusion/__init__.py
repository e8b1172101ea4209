"""Diffusion-LM drafting: drafters that propose a block of tokens in parallel, on top of the
engine's drafter contract (`mmspec.decoding.draft`).

DiffusionDrafter        DiffuSpec: diffusion-LM lattice + CPS + ADL (`diffusion.py`)
NaiveDiffusionDrafter   the baseline: argmax path of the lattice, fixed k
DFlashDrafter           DFlash / DFlash2 block-diffusion drafters (z-lab/dflash checkpoints)

Layout: `lattice.py` (one bidirectional pass: a distribution per masked position), `cps.py`
(causal path search over it), `path_tree.py` (its paths as a verified tree), `adl.py` (adaptive
draft length), `lm_proxy.py` / `ngram_proxy.py` (CPS's causal scorers), `vocab.py` (the
drafter's vocabulary against the target's), `dlm_loading.py` (Dream-style checkpoints, no remote
code), `bidirectional.py` (a causal transformers model run with full attention); DFlash:
`dflash.py` (the drafter), `dflash_model.py` (the network), `dflash_checkpoint.py` (their folders).
Dependencies point down: this package uses `mmspec.decoding`, never the other way.
"""

from .adl import AdaptiveDraftLength, ADLConfig, FixedDraftLength
from .cps import CPSConfig
from .dflash import DFlashDrafter
from .diffusion import DiffusionDrafter, DiffusionDrafterConfig, NaiveDiffusionDrafter
from .lattice import Lattice, build_lattice
from .lm_proxy import CausalLMProxy
from .ngram_proxy import NgramProxy

__all__ = [
    "ADLConfig",
    "AdaptiveDraftLength",
    "CPSConfig",
    "CausalLMProxy",
    "DFlashDrafter",
    "DiffusionDrafter",
    "DiffusionDrafterConfig",
    "FixedDraftLength",
    "Lattice",
    "NaiveDiffusionDrafter",
    "NgramProxy",
    "build_lattice",
]
