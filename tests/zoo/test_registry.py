import pytest

import mmspec.zoo
from mmspec.zoo.paths import ZOO_DIR

TEXT = ("text-dlm", "text-drafter", "text-target")


def test_text_entries_are_listed():
    assert set(TEXT) <= set(mmspec.zoo.available())


@pytest.mark.parametrize("name", mmspec.zoo.available())
def test_every_entry_loads_offline(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = mmspec.zoo.load(name)
    assert entry.name == name and not entry.model.training
    assert entry.card["name"] == name
    assert (ZOO_DIR / name / "model.safetensors").is_file()
    assert not list((ZOO_DIR / name).glob("*.bin"))  # safetensors only


def test_target_names_its_drafters():
    target = mmspec.zoo.load("text-target")
    assert set(target.drafters) == {"text-drafter", "text-dlm"}
    assert all(d in mmspec.zoo.available() for d in target.drafters)


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown zoo model 'text-gpt'.*text-target"):
        mmspec.zoo.load("text-gpt")


def test_text_zoo_fits_its_budget():
    total = sum(f.stat().st_size for name in (*TEXT, "text-tokenizer")
                for f in (ZOO_DIR / name).iterdir())
    assert total <= 26e6, f"text zoo takes {total / 1e6:.1f} MB, budget 26 MB"


def test_the_whole_zoo_fits_in_40_mb():
    """The issue's budget: every file under assets/zoo/, all models together."""
    total = sum(f.stat().st_size for f in ZOO_DIR.rglob("*") if f.is_file())
    assert total <= 40e6, f"assets/zoo takes {total / 1e6:.1f} MB, budget 40 MB"


def test_zoo_dir_may_be_a_string(tmp_path):
    """`load(name, "some/folder")` as users write it (a str, not a Path), and an empty folder
    lists nothing."""
    assert mmspec.zoo.available(str(tmp_path)) == []
    with pytest.raises(ValueError, match="unknown zoo model 'text-target'.*none"):
        mmspec.zoo.load("text-target", str(tmp_path))
    assert mmspec.zoo.load("text-drafter", str(ZOO_DIR)).name == "text-drafter"
