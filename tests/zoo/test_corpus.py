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
