"""The zoo's one tokenizer trainer: the text tokenizer and the VLM processor's, each with its
special tokens first and its roles, byte-level (every string round-trips)."""

from mmspec.zoo import tokenizer, vlm_processor
from mmspec.zoo.training.tokenizer import train_processor, train_tokenizer

TEXTS = ["a red circle at the left of a blue square; the square is above the circle."] * 8


def test_the_text_tokenizer_has_eos_pad_and_mask_first():
    tok = train_tokenizer(TEXTS, vocab_size=300)
    assert tok.convert_tokens_to_ids(list(tokenizer.SPECIAL_TOKENS)) == [0, 1]
    assert tok.eos_token == tok.pad_token == tokenizer.EOS_TOKEN
    assert tok.mask_token == tokenizer.MASK_TOKEN
    text = "déjà vu: ünïcode → never <unk>"
    assert tok.decode(tok(text).input_ids) == text


def test_the_vlm_processor_has_its_special_tokens_first_and_the_chat_words_as_tokens():
    tok = train_processor(TEXTS).tokenizer
    assert tok.convert_tokens_to_ids(list(vlm_processor.SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.image_token) == (
        vlm_processor.PAD, vlm_processor.BOS, vlm_processor.EOS, vlm_processor.IMAGE)
    assert tok.tokenize("USER: ASSISTANT:") == ["USER", ":", "ĠASSISTANT", ":"]
