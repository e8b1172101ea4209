"""The VLM zoo's processor: a small byte-level BPE trained on the scene texts, an `<image>` token and
a LLaVA-1.5 chat template, wrapped with a 64x64 CLIP image processor as a `LlavaProcessor`.

    processor = train_processor(texts)           # tokenizer training + the wrapper
    processor.save_pretrained(path); LlavaProcessor.from_pretrained(path)   # offline round trip
    inputs = vlm_inputs(processor, image, "Describe the image.")   # input_ids, attention_mask,
                                                                    # pixel_values, chat-templated

The prompt reads `USER: <image>\\n{question} ASSISTANT:` (LLaVA-1.5's conversation format) and an
answer is ` {answer}</s>`. The processor expands `<image>` into the 64 patch tokens of the 8x8 grid
(CLIP's CLS feature is dropped: `vision_feature_select_strategy="default"`).
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
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


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts + ["USER: ASSISTANT:"], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS,
                                   eos_token=EOS, extra_special_tokens={"image_token": IMAGE})


def make_processor(tokenizer: PreTrainedTokenizerFast) -> LlavaProcessor:
    images = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                   crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=PATCH_SIZE,
                          vision_feature_select_strategy="default", image_token=IMAGE,
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


def train_processor(texts: list[str]) -> LlavaProcessor:
    return make_processor(train_tokenizer(texts))


def load_processor(path) -> LlavaProcessor:
    return LlavaProcessor.from_pretrained(str(path), local_files_only=True)


def chat_prompt(processor, question: str) -> str:
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    return processor.apply_chat_template(conv, add_generation_prompt=True)


def vlm_inputs(processor, image, question: str) -> dict:
    """Processor outputs `{input_ids [1, L], attention_mask [1, L], pixel_values [1, 3, 64, 64]}`
    for one image and one question, chat-templated: what `target.generate` and
    `mmspec.generate` take as keyword arguments."""
    return dict(processor(text=chat_prompt(processor, question), images=[image],
                          return_tensors="pt"))


def answer_ids(processor, answer: str) -> list[int]:
    """Token ids of an assistant answer as the template writes it: ` {answer}</s>`."""
    tok = processor.tokenizer
    return tok(" " + answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
