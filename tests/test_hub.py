"""`mmspec.hub.resolve_model`: folders, zoo names and hub ids, the hub ids from a cache in the
real layout (tests/hub_cache.py) with HF_HUB_OFFLINE=1, as on a machine without network."""

import pytest

from mmspec.hub import ModelNotFound, resolve_model
from mmspec.zoo.paths import ZOO_DIR
from tests.hub_cache import REVISION, add_to_cache, zoo_hub_cache


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub cache holding the zoo's text pair as mmspec/text-target and mmspec/text-drafter,
    named by HF_HUB_CACHE after huggingface_hub was imported (it reads its constants then)."""
    import huggingface_hub  # noqa: F401 (imported first, as in any program that loads models)

    cache = zoo_hub_cache(tmp_path / "hub", "text-target", "text-drafter")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_id_resolves_from_the_cache_offline(hub):
    folder = resolve_model("mmspec/text-target")
    assert folder == hub / "models--mmspec--text-target" / "snapshots" / REVISION
    assert (folder / "config.json").read_bytes() == (ZOO_DIR / "text-target" /
                                                     "config.json").read_bytes()


def test_hf_home_names_the_cache_when_hf_hub_cache_is_unset(tmp_path, monkeypatch):
    zoo_hub_cache(tmp_path / "home" / "hub", "text-drafter")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = resolve_model("mmspec/text-drafter")
    assert folder.parent.parent.name == "models--mmspec--text-drafter"


def test_a_local_folder_and_a_zoo_name_come_before_the_cache(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mmspec" / "text-target").mkdir(parents=True)
    assert resolve_model("mmspec/text-target").resolve() == tmp_path / "mmspec" / "text-target"
    assert resolve_model("text-drafter") == ZOO_DIR / "text-drafter"


def test_a_miss_names_the_folder_the_hub_id_and_the_cache(hub):
    with pytest.raises(ModelNotFound) as err:
        resolve_model("mmspec/nope", "path")
    message = str(err.value)
    assert message == (f"path: no model folder mmspec/nope, and the hub id mmspec/nope is not in "
                       f"the Hugging Face cache {hub} (HF_HUB_OFFLINE is set, so nothing "
                       f"downloads)")
    with pytest.raises(ModelNotFound, match=r"no such model folder /nowhere/at/all \(nor a "
                                            r"Hugging Face hub id"):
        resolve_model("/nowhere/at/all")
    # a bare name is also a zoo name that was mistyped
    with pytest.raises(ModelNotFound, match=r"zoo entries: text-dflash, text-dlm, text-drafter, .*vlm-vispec"):
        resolve_model("text-targte")


def test_online_a_download_fetches_only_what_the_loaders_read(hub, monkeypatch):
    import huggingface_hub
    monkeypatch.delenv("HF_HUB_OFFLINE")
    asked, cached = [], huggingface_hub.snapshot_download

    def snapshot_download(repo_id, *, cache_dir, local_files_only=False, allow_patterns=None):
        if local_files_only:  # the real lookup in the cache
            return cached(repo_id, cache_dir=cache_dir, local_files_only=True)
        asked.append(allow_patterns)
        return str(cache_dir / "fetched")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    for files in (["config.json", "model.safetensors", "pytorch_model.bin"],
                  ["config.json", "pytorch_model.bin"]):
        monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id, f=files: f)
        assert resolve_model("org/remote") == hub / "fetched"
    assert "*.safetensors" in asked[0] and "*.bin" not in asked[0]  # never both weights
    assert "*.bin" in asked[1]  # EAGLE's published drafters have only pytorch_model.bin
    # a snapshot cached without weights (AutoConfig fetched config.json) is completed online,
    # and taken as it is offline
    partial = add_to_cache(hub, "org/partial", ZOO_DIR / "text-target",
                           skip=("model.safetensors",))
    assert resolve_model("org/partial") == hub / "fetched" and len(asked) == 3
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("org/partial") == partial
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def no_network(repo_id):  # what the transport raises after its retries
        raise huggingface_hub.errors.HTTPError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "list_repo_files", no_network)
    with pytest.raises(ModelNotFound, match=r"^no model folder org/remote, and the hub id "
                                            r"org/remote is neither in the Hugging Face cache .* "
                                            r"nor could be downloaded \(Name or service not "
                                            r"known; without network, HF_HUB_OFFLINE=1"):
        resolve_model("org/remote")


def test_the_python_loaders_take_hub_ids(tmp_path, monkeypatch):
    import mmspec.zoo
    from mmspec import DiffusionDrafter, EagleDrafter
    from mmspec.vision import ViSpecDrafter

    monkeypatch.setenv("HF_HUB_CACHE", str(zoo_hub_cache(tmp_path, "text-dlm", "text-eagle3")))
    target = mmspec.zoo.load("text-target").model
    assert EagleDrafter.from_pretrained("mmspec/text-eagle3", target).config.hidden_size > 0
    assert DiffusionDrafter.from_pretrained("mmspec/text-dlm", target).mask_token_id is not None
    for loader in (EagleDrafter, DiffusionDrafter, ViSpecDrafter):
        with pytest.raises(FileNotFoundError, match=r"^path: no model folder org/none, and the "
                                                    r"hub id org/none is not in the Hugging "
                                                    r"Face cache"):
            loader.from_pretrained("org/none", target)
