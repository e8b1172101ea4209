"""`available()` and `load(name)`: the shipped zoo, read from `assets/zoo/` with no network.

An entry is a folder of `assets/zoo/` holding a `card.json` whose `kind` has a loader here.
Weights are safetensors only (fp16 on disk, upcast to float32 on load for CPU speed).
VLM entries: `vlm-target` (LLaVA, with its `LlavaProcessor`), `vlm-assistant` (text-only Llama for
HF assisted generation), `vlm-vispec` / `vlm-text-drafter` (`ViSpecDrafter`s bound to a target),
`vlm-eagle3` and `text-eagle3` (EAGLE-3 `EagleDrafter`s, bound alike), `text-dflash` (a
`DFlashDrafter`, bound alike).
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from transformers import LlamaForCausalLM, LlavaForConditionalGeneration, Qwen2ForCausalLM

from mmspec.diffusion.bidirectional import make_bidirectional
from mmspec.zoo.cards import read_card
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.tokenizer import load_tokenizer
from mmspec.zoo.vlm_processor import load_processor


@dataclass
class ZooModel:
    """A loaded zoo entry.

    model:     the network, in eval mode, float32; for `video-dit` a `PixelWanPipeline`
               (`mmspec.zoo.video_pipeline`) whose `.transformer` is a `WanTransformer3DModel`.
    tokenizer: its tokenizer (or processor).
    card:      the model card (`card.json`): data, steps, losses, wall time, command, conventions.
    drafters:  names of zoo entries trained to draft for this model (targets only).
    mask_token_id, shift: diffusion drafters only. `shift=True` means the logits at position i
               predict token i+1 (Dream), so a mask at position p is filled from `logits[p-1]`.
    """

    name: str
    model: Any
    tokenizer: Any
    card: dict
    drafters: tuple[str, ...] = ()
    mask_token_id: Optional[int] = None
    shift: Optional[bool] = None
    path: Path = field(default=ZOO_DIR)


def _check_config(cls, directory: Path) -> None:
    """The folder's config.json exists and is `cls`'s: without it transformers builds the
    class's full-size default model (a 7B-sized Qwen2 ate all 24 GiB of a CPU machine) before
    it finds that the weights do not fit."""
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no config.json (a {cls.__name__} entry needs one)")
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{path} is not a JSON object: {err}") from None
    if model_type != cls.config_class.model_type:
        raise ValueError(f"{path}: model_type {model_type!r}, but the card's kind loads a "
                         f"{cls.__name__} ({cls.config_class.model_type!r})")


def _weights_error(path: Path, err: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors file ({err}); re-export or "
                      f"restore it (git checkout assets/zoo)")


def _from_pretrained(cls, directory: Path):
    """`cls.from_pretrained` of a zoo folder that refuses weights not matching the config:
    transformers only logs missing tensors and initialises them at random."""
    from safetensors import SafetensorError

    _check_config(cls, directory)
    try:
        model, info = cls.from_pretrained(str(directory), dtype=torch.float32,
                                          use_safetensors=True, local_files_only=True,
                                          output_loading_info=True)
    except SafetensorError as err:  # cut short or empty: the header names no file
        raise _weights_error(directory / "model.safetensors", err) from None
    tied = {"lm_head.weight"} if model.config.get_text_config().tie_word_embeddings else set()
    problems = {kind: sorted(set(info.get(kind) or ()) - tied)
                for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        raise ValueError(f"{directory}/model.safetensors does not match its {cls.__name__} "
                         f"config: " + "; ".join(f"{kind.replace('_', ' ')} {keys[:6]}"
                                                 f"{' ...' if len(keys) > 6 else ''}"
                                                 for kind, keys in problems.items()))
    return model


def _load_text(name: str, directory: Path, card: dict) -> ZooModel:
    model = _from_pretrained(Qwen2ForCausalLM, directory)
    model.eval()
    tokenizer = load_tokenizer(directory)
    if card["kind"] == "diffusion-lm":
        if getattr(model.config, "mask_token_id", None) is None:
            raise ValueError(f"{directory}: the card says diffusion-lm but config.json has no "
                             f"mask_token_id (a causal LM's config?)")
        make_bidirectional(model)
        return ZooModel(name, model, tokenizer, card, mask_token_id=model.config.mask_token_id,
                        shift=model.config.diffusion_shift, path=directory)
    return ZooModel(name, model, tokenizer, card, drafters=tuple(card.get("drafters", ())),
                    path=directory)


def video_parts(state: dict, transformer, text_encoder):
    """((module, its slice of `state`), ...): a `video-dit` file holds both modules' weights under
    the prefixes `transformer.` and `text_encoder.` (UMT5 ties `embed_tokens` to `shared`, so
    either name may be absent)."""
    return tuple((module, {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
                 for prefix, module in (("transformer.", transformer),
                                        ("text_encoder.", text_encoder)))


def load_video_components(directory: Path):
    """(WanTransformer3DModel, UMT5EncoderModel, tokenizer) of a `video-dit` folder, float32, eval."""
    from diffusers import WanTransformer3DModel
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    directory = Path(directory)
    try:
        state = load_file(str(directory / "model.safetensors"))
    except SafetensorError as err:
        raise _weights_error(directory / "model.safetensors", err) from None
    config = json.loads((directory / "transformer_config.json").read_text())
    config["patch_size"] = tuple(config["patch_size"])
    transformer = WanTransformer3DModel(**config)
    text_encoder = UMT5EncoderModel(UMT5Config.from_json_file(str(directory / "text_encoder_config.json")))
    for module, part in video_parts({k: v.float() for k, v in state.items()}, transformer,
                                    text_encoder):
        missing, unexpected = module.load_state_dict(part, strict=False)
        missing = [k for k in missing if not k.endswith("embed_tokens.weight")]
        if missing or unexpected:
            raise ValueError(f"{directory}/model.safetensors does not match its "
                             f"{type(module).__name__} config: missing {missing}, unexpected "
                             f"{unexpected}")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    return (transformer.eval(), text_encoder.eval().requires_grad_(False), tokenizer)


def _load_video(name: str, directory: Path, card: dict) -> ZooModel:
    from diffusers import FlowMatchEulerDiscreteScheduler

    from mmspec.zoo.video_pipeline import PixelWanPipeline

    transformer, text_encoder, tokenizer = load_video_components(directory)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=card["training"]["shift"])
    pipe = PixelWanPipeline(tokenizer=tokenizer, text_encoder=text_encoder,
                            transformer=transformer, scheduler=scheduler)
    spec = card["spec"]  # a card from before multi-grid training names one grid, in its spec
    grids = card["training"].get("grids", [[spec["frames"], spec["height"], spec["width"]]])
    pipe.trained_grids = tuple(tuple(g) for g in grids)
    pipe.card_path = directory / "card.json"
    return ZooModel(name, pipe, tokenizer, card, path=directory)


def _load_vlm(name: str, directory: Path, card: dict) -> ZooModel:
    model = _from_pretrained(LlavaForConditionalGeneration, directory)
    return ZooModel(name, model.eval(), load_processor(directory), card,
                    drafters=tuple(card.get("drafters", ())), path=directory)


def _load_assistant(name: str, directory: Path, card: dict) -> ZooModel:
    model = _from_pretrained(LlamaForCausalLM, directory)
    return ZooModel(name, model.eval(), load_tokenizer(directory), card, path=directory)


# The zoo drafters' tree on a CPU: a 10-token chain. Verifying ViSpec's GPU tree (30 tokens, top-8,
# 4 levels) costs several decode steps on one core (compute-bound), and the zoo's formulaic scene
# descriptions reward depth over width: the chain accepts more tokens and runs faster than the
# GPU tree (BENCHMARKS.md `vlm`, held-out scenes, 1 thread).
ZOO_TREE = {"depth": 10, "top_k": 1, "total_tokens": 11}

# DraftAttention's tile (latent tokens) for the zoo video DiT, whose frames are 16x16 or 32x32
# tokens: `video_dit.generate`'s default on it, the demo's and BENCHMARKS.md `video`'s (its plot
# names it). The paper's (8, 16), sized for Wan's 30x52-token frames, leaves 2 tiles a 32x32
# frame here, too coarse to select blocks by (BENCHMARKS.md, "Figures taken out of package
# comments"); 8-token 2x4 tiles keep more of this model's attention at equal density than 4x4
# ones at every trained size, for about the same CPU time end to end (BENCHMARKS.md
# `video_grids_tiles`, `video_grids_speed`). On a GPU blocks under 16 tokens take the torch
# backend, not the Triton kernel: this is the CPU demo model; Wan-sized models keep their own tiles.
ZOO_VIDEO_TILE = (2, 4)

# ADL's block range for the zoo DLM (DiffuSpec's is [20, 30], sized for a GPU where verifying 30
# tokens costs about one decode step). On a CPU verifying 20 tokens costs several decode steps and
# the DLM commits a few tokens a round, so a short block is cheaper at almost the same tau
# (BENCHMARKS.md `text`, the two prefix-cache rows).
ZOO_DLM_K = (4, 10)


def _load_vispec(name: str, directory: Path, card: dict,
                 target: Optional[torch.nn.Module] = None) -> ZooModel:
    from mmspec.vision import ViSpecDrafter  # the text zoo loads without the vision stack

    if target is None:
        target = load(card["target"], directory.parent).model
    drafter = ViSpecDrafter.from_pretrained(directory, target, **ZOO_TREE).eval()
    return ZooModel(name, drafter, load_processor(directory.parent / card["target"]), card,
                    path=directory)


def _load_eagle3(name: str, directory: Path, card: dict,
                 target: Optional[torch.nn.Module] = None) -> ZooModel:
    """An `EagleDrafter` (EAGLE-3, speculators format without the embedding: the target's) bound
    to `target`, drafting the zoo's CPU tree."""
    from mmspec.eagle import EagleDrafter  # lazy: the text zoo loads without the drafter stack

    target_dir = directory.parent / card["target"]
    if target is None:
        target = load(card["target"], directory.parent).model
    drafter = EagleDrafter.from_pretrained(directory, target, **ZOO_TREE).eval()
    vlm = read_card(target_dir).get("kind") == "vlm"
    tokenizer = load_processor(target_dir) if vlm else load_tokenizer(target_dir)
    return ZooModel(name, drafter, tokenizer, card, path=directory)


def _load_dflash(name: str, directory: Path, card: dict,
                 target: Optional[torch.nn.Module] = None) -> ZooModel:
    """A `DFlashDrafter` (z-lab layout, no embedding and no LM head: the target's) bound to
    `target`."""
    from mmspec.diffusion import DFlashDrafter

    target_dir = directory.parent / card["target"]
    if target is None:
        target = load(card["target"], directory.parent).model
    drafter = DFlashDrafter.from_pretrained(directory, target).eval()
    return ZooModel(name, drafter, load_tokenizer(target_dir), card, path=directory)


_LOADERS = {"causal-lm": _load_text, "diffusion-lm": _load_text, "vlm": _load_vlm,
            "vlm-assistant": _load_assistant, "vispec": _load_vispec, "eagle3": _load_eagle3,
            "dflash": _load_dflash, "video-dit": _load_video}


_BOUND = ("vispec", "eagle3", "dflash")  # drafters bound to an already loaded target


def available(zoo_dir: str | Path = ZOO_DIR) -> list[str]:
    """Names of the loadable zoo entries in `zoo_dir` (a folder of entries), sorted."""
    zoo_dir = Path(zoo_dir)
    if not zoo_dir.is_dir():
        return []
    names = []
    for d in sorted(zoo_dir.iterdir()):
        if not (d / "card.json").is_file():
            continue
        try:
            kind = read_card(d).get("kind")
        except (ValueError, OSError) as err:  # one torn card must not hide the other entries
            logging.getLogger(__name__).warning("zoo: skipping %s, unreadable card.json: %s",
                                                d.name, err)
            continue
        if kind in _LOADERS:
            names.append(d.name)
    return names


# card fields each kind's loader reads, beyond `kind`
_CARD_FIELDS = {"video-dit": (("training", "shift"),), "vispec": (("target",),),
                "eagle3": (("target",),), "dflash": (("target",),)}


def _check_card(directory: Path, card: dict) -> None:
    for fields in _CARD_FIELDS.get(card["kind"], ()):
        value = card
        for i, key in enumerate(fields):
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"{directory / 'card.json'}: a {card['kind']!r} card needs "
                                 f"{'.'.join(fields[:i + 1])!r}")
            value = value[key]


def _why_not_loadable(name: str, zoo_dir: Path) -> str:
    """Why `name` in `zoo_dir` is no loadable entry, for the error of `load`."""
    if not zoo_dir.is_dir():
        return f"zoo_dir {zoo_dir}: no such folder"
    if (zoo_dir / "card.json").is_file():
        return (f"zoo_dir {zoo_dir} is itself an entry; pass the folder of entries, "
                f"zoo_dir={zoo_dir.parent}")
    directory = zoo_dir / name
    if (directory / "card.json").is_file():
        try:
            card = read_card(directory)
        except (ValueError, OSError) as err:
            return str(err)
        kind = card.get("kind")
        if kind is None:
            return (f"{directory / 'card.json'} has no 'kind'; expected one of "
                    f"{', '.join(sorted(_LOADERS))}")
        return (f"{name!r} is a {kind!r} entry, which load() does not load (it loads "
                f"{', '.join(sorted(_LOADERS))})")
    names = available(zoo_dir)
    return (f"unknown zoo model {name!r}; available: {', '.join(names) or 'none'} "
            f"(in {zoo_dir})")


def load(name: str | Path, zoo_dir: str | Path = ZOO_DIR, *,
         target: Optional[torch.nn.Module] = None) -> ZooModel:
    """Load zoo entry `name` (see `available()`) from `assets/zoo/<name>/`, or the entry folder
    `name` itself (a path to a folder with a `card.json`; its parent is then the zoo folder).

    `target`: ViSpec, EAGLE-3 and DFlash drafters only (`vlm-vispec`, `vlm-text-drafter`,
    `vlm-eagle3`, `text-eagle3`, `text-dflash`): the already loaded target to bind the drafter to
    (it must be the card's target). None loads the target named in the card.
    """
    zoo_dir = Path(zoo_dir)
    if (Path(name) / "card.json").is_file() and (isinstance(name, Path) or "/" in str(name)):
        entry = Path(name).resolve()
        name, zoo_dir = entry.name, entry.parent
    name = str(name)
    if name not in available(zoo_dir):
        raise ValueError(_why_not_loadable(name, zoo_dir))
    directory = zoo_dir / name
    card = read_card(directory)
    _check_card(directory, card)
    if target is not None and card["kind"] not in _BOUND:
        raise ValueError(f"target: only ViSpec, EAGLE-3 and DFlash drafters are bound to a "
                         f"target; {name!r} is a {card['kind']!r} entry")
    with _no_loading_bars():
        if card["kind"] in _BOUND:
            return _LOADERS[card["kind"]](name, directory, card, target)
        return _LOADERS[card["kind"]](name, directory, card)


@contextmanager
def _no_loading_bars():
    """Without transformers' "Loading weights" bar: a zoo entry loads from disk in milliseconds,
    and the bar (two lines of escapes in a log) came with every `load` in a user's program."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
