import torch

from mmspec.zoo.corpus import read_texts, source_files, stdlib_root


def test_split_is_disjoint_deterministic_and_small():
    train, held = source_files("train"), source_files("heldout")
    assert set(train).isdisjoint(held)
    assert held == source_files("heldout")
    assert 0 < len(held) < 0.05 * len(train)
    assert all(stdlib_root() in p.parents for p in held)
    assert not any("site-packages" in p.as_posix() for p in train + held)


def test_bad_split_names_the_argument():
    import pytest
    with pytest.raises(ValueError, match="split must be"):
        source_files("test")


def test_heldout_texts_are_python():
    texts = read_texts("heldout")
    assert texts and sum("def " in t or "import " in t for t in texts) > len(texts) // 2


def test_token_stream_cache_follows_the_texts(tmp_path, monkeypatch):
    # keyed by the tokenizer only, another Python's stdlib reused the old stream (and card counts)
    from mmspec.zoo.paths import ZOO_DIR
    from mmspec.zoo.tokenizer import load_tokenizer
    from mmspec.zoo.training import data

    tokenizer = load_tokenizer(ZOO_DIR / "text-tokenizer")
    monkeypatch.setattr(data, "read_texts", lambda split: ["def f():\n    return 1\n"])
    one = data.token_stream(tokenizer, "heldout", tmp_path)
    monkeypatch.setattr(data, "read_texts", lambda split: ["x = 2\n", "y = 3\n"])
    two = data.token_stream(tokenizer, "heldout", tmp_path)
    assert not torch.equal(one, two) and int((two == tokenizer.eos_token_id).sum()) == 2
    assert torch.equal(data.token_stream(tokenizer, "heldout", tmp_path), two)  # from the cache
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".pt", ".pt"]  # no .tmp left
