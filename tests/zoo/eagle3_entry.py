"""The checks both zoo EAGLE-3 entries share (`vlm-eagle3`, `text-eagle3`)."""

import torch
from safetensors.torch import load_file

import mmspec.zoo
from mmspec import EagleDrafter
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.registry import ZOO_TREE


def load_bound_eagle3(name: str, target):
    """`zoo.load(name, target=target)`, checked: an EAGLE-3 `EagleDrafter` bound to `target`, in
    eval mode, drafting the zoo tree, shipped without an embedding and reading the target's."""
    bound = mmspec.zoo.load(name, target=target)
    drafter = bound.model
    assert isinstance(drafter, EagleDrafter) and drafter.target is target
    assert drafter.config.arch == "eagle3" and not drafter.training
    assert (drafter.config.depth, drafter.config.top_k) == (ZOO_TREE["depth"], ZOO_TREE["top_k"])
    shipped = load_file(str(ZOO_DIR / name / "model.safetensors"))
    assert "embed_tokens.weight" not in shipped  # the target's embedding, not a copy
    assert torch.equal(drafter.embed_weight, target.get_input_embeddings().weight)
    return bound
