"""What the drafter needs from each supported target class, behind one small interface.

`adapter_for(target)` returns a `TargetAdapter` that knows, for an unmodified transformers VLM:
- its text config, image token id, input embeddings and `lm_head`;
- each image's features as the LLM sees them (`image_features`: the projected vision features that
  the model scatters into `inputs_embeds`, LLaVA-NeXT's packed anyres tiles and newline tokens, or
  Qwen2.5-VL's merged patches), one tensor per image, in prompt order;
- the prompt's positions (`prompt_positions`): `attention_mask.cumsum - 1` for LLaVA, the three
  M-RoPE axes (`get_rope_index`, with `rope_deltas`) for Qwen2.5-VL;
- which image tokens belong to which image (`image_slots`), so several images per prompt, even
  back to back, each get their own compressed token and global vector.
"""

from __future__ import annotations

import torch

from mmspec.decoding.admission import UnsupportedTarget

class UnsupportedTargetClass(UnsupportedTarget, TypeError):
    """A target class ViSpec has no adapter for (a TypeError too, as it always was)."""


SUPPORTED = ("LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
             "Qwen2_5_VLForConditionalGeneration")


class TargetAdapter:
    """LLaVA-1.5 (`LlavaForConditionalGeneration`); the other classes override what differs."""

    position_axes = 1
    qkv_bias = False

    def __init__(self, target):
        self.target = target
        self.text_config = target.config.get_text_config(decoder=True)
        self.image_token_id = target.config.image_token_id

    def check_inputs(self, extras: dict) -> None:
        """ValueError naming a model input the target's own prefill would fail on without a
        word (the class's processor outputs it); `generate` asks before the prefill."""

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.target.get_input_embeddings().weight

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.target.get_output_embeddings()

    def rope(self) -> tuple:
        """(theta, mrope_section or None) from the text config."""
        params = getattr(self.text_config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", getattr(self.text_config, "rope_theta", 10000.0))
        return float(theta), None

    def _feature_kwargs(self, extras: dict) -> dict:
        cfg = self.target.config  # a generate() kwarg overrides the config, as for the target
        kwargs = {name: extras[name] if extras.get(name) is not None else getattr(cfg, name)
                  for name in ("vision_feature_layer", "vision_feature_select_strategy")}
        # a Pixtral vision tower (Pixtral / Mistral LLaVA checkpoints) needs each image's size to
        # drop its padding and split the features per image; without, images run together
        if extras.get("image_sizes") is not None:
            kwargs["image_sizes"] = extras["image_sizes"]
        return kwargs

    def image_features(self, extras: dict) -> list:
        """K tensors `[n_k, d]`, one per image in prompt order; [] without `pixel_values`."""
        pixel_values = extras.get("pixel_values")
        if pixel_values is None:
            return []
        out = self.target.model.get_image_features(pixel_values=pixel_values, return_dict=True,
                                                    **self._feature_kwargs(extras))
        return [f.reshape(-1, f.shape[-1]) for f in out.pooler_output]

    def prompt_positions(self, input_ids, attention_mask, extras: dict) -> torch.Tensor:
        """long `[A, B, L]`: the target's positions of the prompt, as `generate` computes them."""
        kwargs = {**extras, "input_ids": input_ids, "attention_mask": attention_mask}
        pos = self.target._prepare_position_ids_for_generation(input_ids, kwargs)
        return pos[None] if pos.ndim == 2 else pos

    def root_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The engine's root positions `[B, 1]` or `[A', B, 1]` -> `[A, B, 1]`."""
        return position_ids[None] if position_ids.ndim == 2 else position_ids

    def image_slots(self, input_ids: torch.Tensor, counts: list) -> list:
        """Assign image tokens to images in order: K pairs (row, long `[n_k]` slot indices).

        Images fill the image-token positions in row-major order, exactly as the target's
        `masked_scatter` does.
        """
        rows, cols = (input_ids == self.image_token_id).nonzero(as_tuple=True)
        if len(rows) != sum(counts):
            raise ValueError(f"input_ids has {len(rows)} image tokens (id {self.image_token_id}) but "
                             f"the image features have {sum(counts)} tokens over {len(counts)} "
                             f"image(s) {counts}; the prompt must hold one image token per feature")
        slots, start = [], 0
        for n in counts:
            row = rows[start: start + n]
            if not bool((row == row[0]).all()):
                raise ValueError(f"image {len(slots)} has its {n} image tokens split across rows "
                                 f"{sorted(set(row.tolist()))} of input_ids")
            slots.append((int(row[0]), cols[start: start + n]))
            start += n
        return slots


class LlavaNextAdapter(TargetAdapter):
    def check_inputs(self, extras: dict) -> None:
        if extras.get("pixel_values") is not None and extras.get("image_sizes") is None:
            raise ValueError("image_sizes: LLaVA-NeXT prompts with images need it (from the "
                             "processor) to unpad their anyres tiles, got none")

    def _feature_kwargs(self, extras: dict) -> dict:
        if extras.get("image_sizes") is None:
            raise ValueError("LLaVA-NeXT prompts with images need image_sizes (from the "
                             "processor) to unpad their anyres tiles, got none")
        return super()._feature_kwargs(extras)


class Qwen2_5_VLAdapter(TargetAdapter):
    position_axes = 3
    qkv_bias = True  # vispec.md §1.2: the Qwen drafter configs set qkv_bias

    def rope(self) -> tuple:
        theta, _ = super().rope()
        params = getattr(self.text_config, "rope_parameters", None) or {}
        section = params.get("mrope_section")
        return theta, None if section is None else tuple(section)

    def check_inputs(self, extras: dict) -> None:
        for pixels, grid in (("pixel_values", "image_grid_thw"),
                             ("pixel_values_videos", "video_grid_thw")):
            if extras.get(pixels) is not None and extras.get(grid) is None:
                raise ValueError(f"{grid}: Qwen2.5-VL prompts with {pixels} need it (from the "
                                 f"processor), got none")
        if extras.get("pixel_values") is not None and "mm_token_type_ids" not in extras:
            raise ValueError("mm_token_type_ids: Qwen2.5-VL prompts with images need it (from "
                             "the processor) to compute M-RoPE positions, got none")

    def _feature_kwargs(self, extras: dict) -> dict:
        return {"image_grid_thw": extras["image_grid_thw"]}

    def prompt_positions(self, input_ids, attention_mask, extras: dict) -> torch.Tensor:
        if "mm_token_type_ids" not in extras and "pixel_values" in extras:
            raise ValueError("Qwen2.5-VL prompts with images need mm_token_type_ids (from the "
                             "processor) to compute M-RoPE positions")
        pos = super().prompt_positions(input_ids, attention_mask, extras)
        return pos[-3:]  # [4, B, L] -> the three M-RoPE axes (the first row is the text index)

    def root_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        if position_ids.ndim == 2:  # a text-only prompt: all three axes equal
            return position_ids[None].expand(3, -1, -1)
        return position_ids[-3:]


_ADAPTERS = {"LlavaForConditionalGeneration": TargetAdapter,
             "LlavaNextForConditionalGeneration": LlavaNextAdapter,
             "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLAdapter}


def adapter_for(target) -> TargetAdapter:
    name = type(target).__name__
    if name not in _ADAPTERS:
        raise UnsupportedTargetClass(
            f"target: unsupported class {name}; ViSpec supports {', '.join(SUPPORTED)}")
    return _ADAPTERS[name](target)


def target_signature(target) -> dict:
    """What a saved drafter records about its target: class, sizes, an embedding signature."""
    adapter = adapter_for(target)
    weight = adapter.embed_weight.detach()
    return {"class": type(target).__name__,
            "name_or_path": getattr(target.config, "_name_or_path", ""),
            "hidden_size": int(weight.shape[1]),
            "vocab_size": int(adapter.lm_head.weight.shape[0]),
            # column sums over the vocabulary: differ between checkpoints, survive dtype casts;
            # 8 columns in fp32, not the whole matrix (2 GB for a 7B Qwen)
            "embedding_signature": [round(float(x), 4) for x in weight[:, :8].float().sum(0)]}


def signature_mismatch(saved: dict, target) -> str:
    """'' when `target` is the one `saved` describes, else what differs."""
    now = target_signature(target)
    for key in ("class", "hidden_size", "vocab_size"):
        if saved.get(key) != now[key]:
            return f"{key}: saved {saved.get(key)!r}, target {now[key]!r}"
    a = torch.tensor(saved.get("embedding_signature", []))
    b = torch.tensor(now["embedding_signature"])
    if a.shape != b.shape or not torch.allclose(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max())):
        return f"embedding_signature: saved {a.tolist()}, target {b.tolist()}"
    return ""
