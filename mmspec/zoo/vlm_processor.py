"""The VLM zoo's processor: a small byte-level BPE trained on the scene texts, an `<image>` token and
a LLaVA-1.5 chat template, wrapped with a 64x64 CLIP image processor as a `LlavaProcessor`.

    processor = train_processor(texts)           # mmspec.zoo.training.tokenizer
    processor.save_pretrained(path); LlavaProcessor.from_pretrained(path)   # offline round trip
    inputs = vlm_inputs(processor, image, "Describe the image.")   # input_ids, attention_mask,
                                                                    # pixel_values, chat-templated
    # image: a PIL image, a path to an image file or a [3, H, W] tensor (uint8, float in [0, 1])

The prompt reads `USER: <image>\\n{question} ASSISTANT:` (LLaVA-1.5's conversation format) and an
answer is ` {answer}</s>`. The processor expands `<image>` into the 64 patch tokens of the 8x8 grid
(CLIP's CLS feature is dropped: `vision_feature_select_strategy="default"`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from transformers import CLIPImageProcessorPil, LlavaProcessor, PreTrainedTokenizerFast

from mmspec.zoo.scenes import IMAGE_SIZE

PAD, BOS, EOS, IMAGE = "<pad>", "<s>", "</s>", "<image>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IMAGE)  # ids 0-3
VOCAB_SIZE = 512  # the scene language has ~150 words: almost all become single tokens
PATCH_SIZE = 8  # (64 / 8)^2 = 64 image tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}USER: "
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    " {% else %}ASSISTANT: {% for c in m['content'] %}{{ c['text'] }}{% endfor %}</s>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def make_processor(tokenizer: PreTrainedTokenizerFast) -> LlavaProcessor:
    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", image_token=IMAGE,
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


def load_processor(path) -> LlavaProcessor:
    return LlavaProcessor.from_pretrained(str(path), local_files_only=True)


def chat_prompt(processor, question: str) -> str:
    """The processor's chat template around one image and `question`; a processor without one
    (a base checkpoint) gets its image token, a newline and the question as they are."""
    if getattr(processor, "chat_template", None) is None:
        return f"{getattr(processor, 'image_token', '<image>')}\n{question}"
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(conv, add_generation_prompt=True)


def open_image(path) -> Image.Image:
    """The image file at `path` as RGB; FileNotFoundError or ValueError naming the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image {str(path)!r} does not exist or is not a file")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as err:  # not an image, or a truncated one
        raise ValueError(f"image {str(path)!r} is not an image file Pillow can read: "
                         f"{err}") from None


def as_image(image) -> Image.Image:
    """`image` as an RGB PIL image: a PIL image, a path to an image file (`open_image`), or a
    tensor `[3, H, W]`, uint8 or float in [0, 1] (torchvision's convention)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        return open_image(image)
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image: expected a PIL image, a path to an image file or a [3, H, W] "
                        f"tensor, got {type(image).__name__}")
    if image.ndim != 3 or image.shape[0] != 3 or not image.numel():
        raise ValueError(f"image: expected a tensor [3, H, W] (RGB, channels first), got shape "
                         f"{list(image.shape)}")
    image = image.detach().cpu()
    if image.is_floating_point():
        if not 0 <= float(image.min()) <= float(image.max()) <= 1:
            raise ValueError(f"image: a float tensor must hold values in [0, 1], got "
                             f"[{float(image.min())}, {float(image.max())}]")
        image = (image * 255).round().to(torch.uint8)
    elif image.dtype != torch.uint8:
        raise ValueError(f"image: expected a uint8 or float tensor, got {image.dtype}")
    return Image.fromarray(image.permute(1, 2, 0).numpy())  # [H, W, 3]


def vlm_inputs(processor, image, question: str) -> dict:
    """Processor outputs `{input_ids [1, L], attention_mask [1, L], pixel_values [1, 3, 64, 64]}`
    for one image (anything `as_image` takes) and one question, chat-templated: what
    `target.generate` and `mmspec.generate` take as keyword arguments. Works with any processor
    that has a chat template (LLaVA, LLaVA-NeXT, Qwen2.5-VL)."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string about the image, got {question!r}")
    return dict(processor(text=chat_prompt(processor, question), images=[as_image(image)],
                          return_tensors="pt"))


def answer_ids(processor, answer: str) -> list[int]:
    """Token ids of an assistant answer as the template writes it: ` {answer}</s>`."""
    tok = processor.tokenizer
    return tok(" " + answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
