"""Ready-to-run zoo set-ups: a target, its inputs and its drafters, as `make run`, the demos and the
benchmarks use them. Every preset reads `assets/zoo/` only (no network).

    vlm_preset()   the zoo VLM (tiny LLaVA) on its sample scene, drafters ViSpec / text-only /
                   EAGLE-3
    text_preset()  the zoo text target on a held-out stdlib window, drafters DLM (CPS+ADL) / AR / PLD
                   / EAGLE-3
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmspec.zoo.registry import ZOO_DLM_K, load
from mmspec.zoo.vlm_processor import open_image, vlm_inputs


@dataclass
class Preset:
    """target: the verifying model (eval, float32). tokenizer: decodes its ids (streaming).
    inputs: keyword arguments of `mmspec.generate` / `target.generate` (input_ids, pixel_values...).
    drafters: name -> factory of a fresh drafter (drafters keep per-call state).
    """

    name: str
    target: torch.nn.Module
    tokenizer: Any
    inputs: dict
    drafters: dict[str, Callable[[], Any]]
    default_drafter: str
    eos_token_id: int | list | None = None
    description: str = ""
    extras: dict = field(default_factory=dict)


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it (`make run` runs from the
    repository root: assets/zoo/vlm-target/sample.png), else absolute: a file the reader can open."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def vlm_preset(image: str | Path | None = None, prompt: str | None = None) -> Preset:
    """The zoo VLM on image file `image` (default: its held-out sample scene) with question
    `prompt`; a missing or unreadable file is a FileNotFoundError or ValueError naming it."""
    zoo_target = load("vlm-target")
    target, processor = zoo_target.model, zoo_target.tokenizer
    image_path = Path(image) if image is not None else zoo_target.path / "sample.png"
    prompt = prompt if prompt is not None else zoo_target.card.get("sample_prompt",
                                                                    "Describe the image.")
    inputs = vlm_inputs(processor, open_image(image_path), prompt)

    def bound(name):  # a zoo drafter bound to this target
        return lambda: load(name, target=target).model

    return Preset(
        name="vlm", target=target, tokenizer=processor.tokenizer, inputs=inputs,
        drafters={"vispec": bound("vlm-vispec"), "text-only": bound("vlm-text-drafter"),
                  "eagle3": bound("vlm-eagle3")},
        default_drafter="vispec", eos_token_id=processor.tokenizer.eos_token_id,
        description=(f"zoo VLM `vlm-target` on {_shown(image_path)}, question {prompt!r}"),
        extras={"image": image_path, "prompt": prompt})


def heldout_code_prompt(tokenizer, tokens: int = 192) -> torch.Tensor:
    """`tokens` tokens from the middle of the first long-enough held-out stdlib file, `[1, tokens]`."""
    from mmspec.zoo.corpus import source_files

    for path in source_files("heldout"):
        try:
            ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids
        except UnicodeDecodeError:
            continue
        if ids.shape[1] >= 4 * tokens:
            start = (ids.shape[1] - tokens) // 2
            return ids[:, start:start + tokens]
    raise RuntimeError(f"no held-out stdlib file has {4 * tokens} tokens")


def text_preset(prompt: str | None = None) -> Preset:
    """The zoo text target; `prompt` None means a held-out stdlib window (code it never saw)."""
    from mmspec.decoding.drafters import ModelDrafter, PromptLookupDrafter
    from mmspec.diffusion import CPSConfig, DFlashDrafter, DiffusionDrafter, DiffusionDrafterConfig
    from mmspec.diffusion.adl import ADLConfig
    from mmspec.zoo.paths import model_path

    zoo_target = load("text-target")
    target, tokenizer = zoo_target.model, zoo_target.tokenizer
    if prompt is None:
        ids = heldout_code_prompt(tokenizer)
    elif not prompt.strip():
        raise ValueError("prompt must be non-empty text, got an empty string")
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    eos = tokenizer.eos_token_id
    dlm = load("text-dlm")
    drafter_model = load("text-drafter").model
    return Preset(
        name="text", target=target, tokenizer=tokenizer, inputs={"input_ids": ids},
        drafters={
            "diffusion": lambda: DiffusionDrafter(dlm.model, dlm.mask_token_id, target,
                                                  eos_token_id=eos,
                                                  config=DiffusionDrafterConfig(
                                                      shift=dlm.shift, prefix_cache=True,
                                                      adl=ADLConfig(*ZOO_DLM_K))),
            # samples like the target under a sampling call, greedy under a greedy one
            "model": lambda: ModelDrafter(drafter_model, 5, sample=True),
            "prompt-lookup": lambda: PromptLookupDrafter(),
            "eagle3": lambda: load("text-eagle3", target=target).model,  # the zoo's CPU tree
            # with DiffuSpec's path search over each block: more tokens a round than its chain
            "dflash": lambda: DFlashDrafter.from_pretrained(model_path("text-dflash"), target,
                                                            path_search=CPSConfig()).eval(),
        },
        default_drafter="diffusion", eos_token_id=eos,
        description=f"zoo text pair: `text-target` verifying, `text-dlm` drafting (CPS + ADL "
                    f"with k in [{ZOO_DLM_K[0]}, {ZOO_DLM_K[1]}], prefix KV cache)",
        extras={"dlm": dlm})
