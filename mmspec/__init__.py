"""mmspec: make multimodal and diffusion models generate faster without changing what they generate."""

__version__ = "0.1.0"

__all__ = [
    "ADLConfig",
    "DFlashDrafter",
    "DiffusionDrafter",
    "DiffusionDrafterConfig",
    "Draft",
    "EagleDrafter",
    "ModelDrafter",
    "NaiveDiffusionDrafter",
    "PromptLookupDrafter",
    "SpecOutput",
    "UnsupportedTarget",
    "ViSpecDrafter",
    "generate",
    "speculative",
]
# the diffusion drafters (DiffuSpec, DFlash), in diffusion/
_DIFFUSION = ("ADLConfig", "DFlashDrafter", "DiffusionDrafter", "DiffusionDrafterConfig",
              "NaiveDiffusionDrafter")


def __getattr__(name):
    # lazy: `mmspec.kernels` users should not pay for importing transformers
    if name in _DIFFUSION:
        from . import diffusion

        return getattr(diffusion, name)
    if name == "ViSpecDrafter":
        from . import vision

        return vision.ViSpecDrafter
    if name == "EagleDrafter":
        from . import eagle

        return eagle.EagleDrafter
    if name in __all__:
        from . import decoding

        return getattr(decoding, name)
    raise AttributeError(f"module 'mmspec' has no attribute {name!r}")


def __dir__():
    # the lazy names too (tab completion)
    return sorted(set(globals()) | set(__all__))
