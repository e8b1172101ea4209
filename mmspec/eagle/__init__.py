"""mmspec.eagle: EAGLE drafters for any causal LM or VLM target (SafeAILab EAGLE-1/2, EAGLE-3).

    from mmspec import generate
    from mmspec.eagle import EagleDrafter

    drafter = EagleDrafter.from_pretrained("EAGLE3-LLaMA3.1-Instruct-8B", target, top_k=8)
    out = generate(target, drafter, input_ids, max_new_tokens=256)

Files: `drafter.py` (`EagleDrafter`, the drafter contract), `head.py` (the EAGLE-1/2 and EAGLE-3
draft heads, the checkpoints' module names), `checkpoint.py` (reading and checking a SafeAILab
folder), `speculators.py` (vLLM's `speculators` format, read and written), `eagle3_train.py`
(EAGLE-3's drafter, draft vocabulary and loss for `python -m mmspec.vision.train --arch eagle3`).
Shared with ViSpec's head (`mmspec.vision`, which builds on this room; this room imports nothing
from it): `rope.py` (1-D / M-RoPE), `tree_attention.py` (draft-tree levels through the shared
block-sparse layer), `draft_kv.py` (the draft KV cache and a round's tree nodes). The EAGLE-2
dynamic tree is `mmspec.decoding.dynamic_tree`, shared with `ModelDrafter`.
"""

from .drafter import EagleDrafter
from .head import EagleConfig

__all__ = ["EagleConfig", "EagleDrafter"]
