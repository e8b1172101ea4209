"""The model zoo: small models of real architectures, trained here on data found on every machine,
shipped in `assets/zoo/` and loaded with no network.

    import mmspec.zoo
    mmspec.zoo.available()                 # ['text-dlm', 'text-drafter', 'text-target', ...]
    target = mmspec.zoo.load("text-target")
    target.model, target.tokenizer, target.drafters

Training recipes: `python -m mmspec.zoo.train_text --help`.
"""

from mmspec.zoo.registry import ZooModel, available, load

__all__ = ["ZooModel", "available", "load"]
