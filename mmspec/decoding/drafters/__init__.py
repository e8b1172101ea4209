from .model_drafter import ModelDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["ModelDrafter", "PromptLookupDrafter"]
