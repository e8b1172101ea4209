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
`head.py` (EAGLE draft head), `drafter.py` (the drafter contract), `losses.py` + `train.py`
(online training, of ViSpec drafters and, with `--arch eagle3`, of EAGLE-3 drafters). The EAGLE-2
dynamic tree is `mmspec.decoding.dynamic_tree`, shared with `ModelDrafter`.
ViSpec builds on `mmspec.eagle` (its RoPE, tree attention and EAGLE's checkpoints; never the
reverse), whose `EagleDrafter` (SafeAILab EAGLE-1/2 and EAGLE-3 checkpoints as drafters for any
causal LM target) is also importable from here.
`vispec_official.py`: the ViSpec authors' checkpoints, in their semantics (`ViSpecDrafter.
from_pretrained` returns an `OfficialViSpecDrafter` for their layout).
"""

from mmspec.eagle import EagleDrafter

from .config import ViSpecConfig
from .drafter import ViSpecDrafter

__all__ = ["EagleDrafter", "ViSpecConfig", "ViSpecDrafter"]
