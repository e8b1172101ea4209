"""mmspec.vision: ViSpec, a vision-aware speculative drafter for VLMs (arXiv 2509.15235).

    from mmspec import generate
    from mmspec.vision import ViSpecDrafter

    drafter = ViSpecDrafter.from_pretrained("vispec-llava", target)  # or .from_target(target)
    out = generate(target, drafter, **processor_outputs, max_new_tokens=256)
    print(out.stats)  # tau with and without the bonus token

Targets: `LlavaForConditionalGeneration`, `LlavaNextForConditionalGeneration`,
`Qwen2_5_VLForConditionalGeneration`, unmodified. `ViSpecDrafter.text_only(target)` is the
ablation baseline (no adaptor, no global vector). Training: `python -m mmspec.vision.train`.

Files: `config.py` (ViSpecConfig), `targets.py` (per-class adapters), `adaptor.py` (learnable-query
image compression), `sequence.py` (the draft sequence: pairs, compressed images, global vectors),
`head.py` (EAGLE draft head), `rope.py` (1-D / M-RoPE), `drafter.py` (the drafter contract),
`losses.py` + `train.py` (online training). The EAGLE-2 dynamic tree is
`mmspec.decoding.dynamic_tree`, shared with `ModelDrafter`.
`eagle.py`, `eagle_head.py`, `eagle_checkpoint.py`: SafeAILab EAGLE-1/2 and EAGLE-3 checkpoints
as drafters for any causal LM target (`EagleDrafter.from_pretrained(path, target)`).
`vispec_official.py`: the ViSpec authors' checkpoints, in their semantics (`ViSpecDrafter.
from_pretrained` returns an `OfficialViSpecDrafter` for their layout).
"""

from .config import ViSpecConfig
from .drafter import ViSpecDrafter
from .eagle import EagleDrafter

__all__ = ["EagleDrafter", "ViSpecConfig", "ViSpecDrafter"]
