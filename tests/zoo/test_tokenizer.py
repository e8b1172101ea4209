from mmspec.zoo.corpus import read_texts
from mmspec.zoo.tokenizer import EOS_TOKEN, MASK_TOKEN, VOCAB_SIZE


def test_special_tokens_follow_dream(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE
    assert tokenizer.eos_token == tokenizer.pad_token == EOS_TOKEN
    assert tokenizer.mask_token == MASK_TOKEN
    assert (tokenizer.eos_token_id, tokenizer.mask_token_id) == (0, 1)
    # the mask is one token, never produced by ordinary text
    assert tokenizer.encode(MASK_TOKEN) == [1]
    assert 1 not in tokenizer.encode("x = [mask] <mask> |mask|")


def test_roundtrip_and_compression_on_heldout(tokenizer):
    text = read_texts("heldout")[0][:4000]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert len(text.encode()) / len(ids) > 2.5  # BPE learned code, not bytes
