"""The model zoo: small models of real architectures, trained here on data found on every machine,
shipped in `assets/zoo/` and loaded with no network.

    import mmspec.zoo
    mmspec.zoo.available()                 # ['text-dlm', 'text-drafter', 'text-target', ...]
    target = mmspec.zoo.load("text-target")
    target.model, target.tokenizer, target.drafters

    video = mmspec.zoo.load("video-dit")  # .model: PixelWanPipeline, .model.transformer: Wan DiT
    video.model("a red circle moving right", num_frames=4, height=32, width=32).frames

    vlm = mmspec.zoo.load("vlm-target")     # LLaVA + its LlavaProcessor
    vispec = mmspec.zoo.load("vlm-vispec", target=vlm.model)
    inputs = mmspec.zoo.vlm_inputs(vlm.tokenizer, mmspec.zoo.render(seed), "Describe the image.")
    mmspec.generate(vlm.model, vispec.model, **inputs, max_new_tokens=128)

Training lives apart from the loading above, in `mmspec.zoo.training`:
`python -m mmspec.zoo.training.train_text --help` (and `train_vlm`, `train_video`).
"""

from mmspec.zoo.registry import ZooModel, available, load
from mmspec.zoo.scenes import render
from mmspec.zoo.vlm_processor import vlm_inputs

__all__ = ["ZooModel", "available", "load", "render", "vlm_inputs"]
