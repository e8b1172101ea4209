import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mmspec.zoo
from mmspec.zoo.paths import ZOO_DIR

TEXT = ("text-dflash", "text-dlm", "text-drafter", "text-eagle3", "text-target")


def test_text_entries_are_listed():
    assert set(TEXT) <= set(mmspec.zoo.available())


# run before anything else in a fresh interpreter: no socket connects, whatever the library
_NO_NETWORK = """
import socket
def refuse(self, address, *args):
    raise OSError(f"test: network blocked, connect to {address}")
socket.socket.connect = socket.socket.connect_ex = refuse
"""


def test_every_entry_loads_offline(tmp_path):
    # huggingface_hub reads HF_HUB_OFFLINE when imported: set in this process's environment it
    # came too late, so the loads run in a fresh interpreter that has it from the start, with
    # sockets refused, proxies pointing nowhere and an empty Hugging Face cache
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HTTP_PROXY": "http://192.0.2.1:9",
           "HTTPS_PROXY": "http://192.0.2.1:9", "PYTHONPATH": str(ZOO_DIR.parents[1])}
    script = _NO_NETWORK + """
import json, mmspec.zoo
loaded = {}
for name in mmspec.zoo.available():
    entry = mmspec.zoo.load(name)
    loaded[name] = [entry.name, entry.card["name"], entry.model.training]
print(json.dumps(loaded))
"""
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(loaded) == mmspec.zoo.available()
    assert all(row == [name, name, False] for name, row in loaded.items())
    for name in loaded:
        assert (ZOO_DIR / name / "model.safetensors").is_file()
        assert not list((ZOO_DIR / name).glob("*.bin"))  # safetensors only


def test_the_offline_check_would_see_a_connect():
    script = _NO_NETWORK + "import socket; socket.create_connection(('192.0.2.1', 80), 1)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "network blocked" in done.stderr


def test_target_names_its_drafters():
    target = mmspec.zoo.load("text-target")
    assert set(target.drafters) == {"text-drafter", "text-dlm", "text-eagle3", "text-dflash"}
    assert all(d in mmspec.zoo.available() for d in target.drafters)


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown zoo model 'text-gpt'.*text-target"):
        mmspec.zoo.load("text-gpt")


def stored_bytes(files, zoo_dir=ZOO_DIR) -> int:
    """Bytes on disk of `files`, each real file once: the zoo shares its tokenizers through
    relative symlinks (text-target/tokenizer.json -> ../text-tokenizer/tokenizer.json). A link
    out of `zoo_dir` fails: the zoo would not hold what it needs."""
    real = set()
    for f in files:
        resolved = f.resolve()
        assert resolved.is_relative_to(zoo_dir.resolve()), f"{f} links out of the zoo: {resolved}"
        if resolved.is_file():
            real.add(resolved)
    return sum(f.stat().st_size for f in real)


def test_text_zoo_fits_its_budget():
    """26 MB until `text-dflash` (issue 46), 27 MB for its first layer, 29 MB since its second: a
    DFlash layer is as wide as the target (320: it reads the target's embedding and feeds its LM
    head), so its first layer and the fusion of three target layers took 2.9 MB in fp16, where
    the text zoo had 2.8 MB left, and the second layer 2.3 MB more (the grown drafter's tau:
    BENCHMARKS.md `text` and the DFlash section after it). 29.5 MB since its third layer: its
    MLPs narrowed from 960 to 672 to make room, 0.7 MB more in all. The whole zoo stays in the
    issue's 48 MB below."""
    total = stored_bytes(f for name in (*TEXT, "text-tokenizer")
                         for f in (ZOO_DIR / name).iterdir())
    assert total <= 29.5e6, f"text zoo takes {total / 1e6:.1f} MB, budget 29.5 MB"


def test_the_whole_zoo_fits_in_48_mb():
    """The budget: every file under assets/zoo/, all models together. The issue's 40 MB, raised
    to 42 MB by the lead for `text-eagle3`: at 39.30 MB no EAGLE-3 layer at the text target's
    width fitted (its fixed projections alone are 1.23 MB), and the text pair had no EAGLE-3
    drafter of the issue's list (BENCHMARKS.md, "How the EAGLE-3 drafters were trained").
    Raised to 48 MB by issue 46 for `text-dflash`: at 41.83 MB the 2.9 MB of one DFlash layer at
    the target's width (as above) did not fit in 42."""
    total = stored_bytes(ZOO_DIR.rglob("*"))
    assert total <= 48e6, f"assets/zoo takes {total / 1e6:.1f} MB, budget 48 MB"


def test_the_budget_counts_a_shared_file_once_and_refuses_links_out(tmp_path):
    zoo = tmp_path / "zoo"
    (zoo / "a").mkdir(parents=True)
    (zoo / "b").mkdir()
    (zoo / "a" / "tokenizer.json").write_bytes(b"x" * 100)
    (zoo / "b" / "tokenizer.json").symlink_to("../a/tokenizer.json")
    assert stored_bytes(zoo.rglob("*"), zoo) == 100
    (tmp_path / "outside.json").write_bytes(b"y" * 10)
    (zoo / "b" / "config.json").symlink_to("../../outside.json")
    with pytest.raises(AssertionError, match="links out of the zoo"):
        stored_bytes(zoo.rglob("*"), zoo)


def test_shared_files_are_links_every_entry_loads_through():
    # AutoTokenizer / the processor read through the links: each entry's tokenizer is whole
    from transformers import AutoTokenizer

    links = sorted(f for f in ZOO_DIR.rglob("*") if f.is_symlink())
    assert links and all(not Path(os.readlink(f)).is_absolute() for f in links)
    for folder in sorted({f.parent for f in links}):
        assert len(AutoTokenizer.from_pretrained(str(folder), local_files_only=True)) > 100


def test_zoo_dir_may_be_a_string(tmp_path):
    """`load(name, "some/folder")` as users write it (a str, not a Path), and an empty folder
    lists nothing."""
    assert mmspec.zoo.available(str(tmp_path)) == []
    with pytest.raises(ValueError, match="unknown zoo model 'text-target'.*none"):
        mmspec.zoo.load("text-target", str(tmp_path))
    assert mmspec.zoo.load("text-drafter", str(ZOO_DIR)).name == "text-drafter"


def _copy_entry(name, tmp_path):
    import shutil

    shutil.copytree(ZOO_DIR / name, tmp_path / name)
    return tmp_path / name


def test_a_checkpoint_missing_weights_is_refused(tmp_path):
    # transformers only logs missing tensors and initialises them at random: load accepted it
    from safetensors.torch import load_file, save_file

    entry = _copy_entry("text-drafter", tmp_path)
    state = load_file(str(entry / "model.safetensors"))
    dropped = sorted(k for k in state if ".layers.0." in k)
    save_file({k: v for k, v in state.items() if k not in dropped},
              str(entry / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not match its Qwen2ForCausalLM config: missing "
                                         r"keys \['model.layers.0"):
        mmspec.zoo.load("text-drafter", tmp_path)


def test_one_torn_card_does_not_hide_the_other_entries(tmp_path, caplog):
    _copy_entry("text-drafter", tmp_path)
    (_copy_entry("text-target", tmp_path) / "card.json").write_text('{"name": "text-tar')
    assert mmspec.zoo.available(tmp_path) == ["text-drafter"]
    assert "skipping text-target, unreadable card.json" in caplog.text
    assert mmspec.zoo.load("text-drafter", tmp_path).name == "text-drafter"


def test_cards_are_written_whole(tmp_path, monkeypatch):
    # card.json was overwritten first, then README.md: a failure between left them disagreeing
    from mmspec.zoo import cards

    cards.write_card(tmp_path, {"name": "x", "summary": "s", "kind": "causal-lm"})
    monkeypatch.setattr(cards, "_render", lambda body: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cards.write_card(tmp_path, {"name": "x", "summary": "s", "kind": "diffusion-lm"})
    assert cards.read_card(tmp_path)["kind"] == "causal-lm"
    monkeypatch.undo()
    cards.write_card(tmp_path, {"name": "x", "summary": "s", "kind": "diffusion-lm"})
    assert cards.read_card(tmp_path)["kind"] == "diffusion-lm"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "card.json"]


def test_a_folder_that_would_build_a_default_model_is_refused(tmp_path):
    # without config.json (or with another model's) transformers built Qwen2's full-size
    # default, 7B-sized: all the machine's memory, before it found that the weights did not fit
    import json

    entry = _copy_entry("text-drafter", tmp_path)
    (entry / "config.json").unlink()
    with pytest.raises(ValueError, match=r"text-drafter: no config.json \(a Qwen2ForCausalLM "
                                         r"entry needs one\)"):
        mmspec.zoo.load("text-drafter", tmp_path)
    vlm = _copy_entry("vlm-assistant", tmp_path)
    card = json.loads((vlm / "card.json").read_text())
    (vlm / "card.json").write_text(json.dumps({**card, "kind": "vlm"}))
    with pytest.raises(ValueError, match=r"config.json: model_type 'llama', but the card's kind "
                                         r"loads a LlavaForConditionalGeneration \('llava'\)"):
        mmspec.zoo.load("vlm-assistant", tmp_path)


def test_broken_entries_are_named(tmp_path):
    import json

    good = _copy_entry("text-drafter", tmp_path)
    (_copy_entry("text-target", tmp_path) / "card.json").write_text("[]")  # JSON, no object
    assert mmspec.zoo.available(tmp_path) == ["text-drafter"]  # the others still load
    with pytest.raises(ValueError, match=r"text-target/card.json must hold a JSON object, got "
                                         r"list"):
        mmspec.zoo.load("text-target", tmp_path)
    card = json.loads((good / "card.json").read_text())
    (good / "card.json").write_text(json.dumps({k: v for k, v in card.items() if k != "kind"}))
    with pytest.raises(ValueError, match=r"card.json has no 'kind'; expected one of causal-lm"):
        mmspec.zoo.load("text-drafter", tmp_path)
    (good / "card.json").write_text(json.dumps(card))
    data = (good / "model.safetensors").read_bytes()
    (good / "model.safetensors").write_bytes(data[: len(data) // 2])  # cut short
    with pytest.raises(ValueError, match=r"text-drafter/model.safetensors is not a readable "
                                         r"safetensors file"):
        mmspec.zoo.load("text-drafter", tmp_path)
    video = _copy_entry("video-dit", tmp_path)
    card = json.loads((video / "card.json").read_text())
    (video / "card.json").write_text(json.dumps({k: v for k, v in card.items()
                                                 if k != "training"}))
    with pytest.raises(ValueError, match=r"a 'video-dit' card needs 'training'"):
        mmspec.zoo.load("video-dit", tmp_path)


def test_load_by_path_and_the_folder_mistakes(tmp_path):
    entry = _copy_entry("text-drafter", tmp_path)
    assert mmspec.zoo.load(str(entry)).name == "text-drafter"
    assert mmspec.zoo.load(entry).path == entry
    for args, message in (((("text-tokenizer",)), "'text-tokenizer' is a 'tokenizer' entry, "
                                                   "which load\\(\\) does not load"),
                          (("text-drafter", tmp_path / "nope"), "zoo_dir .*nope: no such folder"),
                          (("x", entry), "is itself an entry; pass the folder of entries")):
        with pytest.raises(ValueError, match=message):
            mmspec.zoo.load(*args)


def test_loading_shows_no_weight_bars_and_leaves_transformers_bars_as_they_were(capfd,
                                                                                  monkeypatch):
    # every zoo.load in a user's program printed transformers' "Loading weights" bar
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(hf_logging, "_tqdm_active", True)  # as a fresh program has them
    mmspec.zoo.load("text-drafter")
    mmspec.zoo.load("vlm-vispec")  # loads its target too
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
