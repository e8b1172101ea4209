"""The model zoo: small models of real architectures, trained here on data found on every machine,
shipped in `assets/zoo/` and loaded with no network.

    import mmspec.zoo
    mmspec.zoo.available()                 # ['text-dlm', 'text-drafter', 'text-target', ...]
    target = mmspec.zoo.load("text-target")
    target.model, target.tokenizer, target.drafters

    video = mmspec.zoo.load("video-dit")  # .model: PixelWanPipeline, .model.transformer: Wan DiT
    video.model("a red circle moving right", num_frames=4, height=32, width=32).frames

Training recipes: `python -m mmspec.zoo.train_text --help`, `python -m mmspec.zoo.train_video`.
"""

from mmspec.zoo.registry import ZooModel, available, load

__all__ = ["ZooModel", "available", "load"]
