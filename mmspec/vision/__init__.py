"""mmspec.vision: ViSpec, a vision-aware speculative drafter for VLMs (arXiv 2509.15235).

Public names:
    ViSpecDrafter   the drafter (`from_target`, `text_only`, `save_pretrained`, `from_pretrained`)
    ViSpecConfig    its frozen config
Training: `python -m mmspec.vision.train`.
"""

from .config import ViSpecConfig
from .drafter import ViSpecDrafter

__all__ = ["ViSpecConfig", "ViSpecDrafter"]
