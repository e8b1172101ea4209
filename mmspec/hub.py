"""`resolve_model`: a model argument (a folder, a zoo entry name or a Hugging Face hub id) as the
local folder to load it from, found as transformers' `from_pretrained` finds it.

The order: a local folder as given; a zoo entry's name (`text-target`, `vlm-vispec`: its folder in
`assets/zoo/`); then the hub id in the local Hugging Face cache (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`), so it works offline from the cache; last, unless
`HF_HUB_OFFLINE` is set, a download into that cache of the files our loaders read (configs,
tokenizer files, safetensors weights; `.bin` weights only where a repo has no safetensors).

The environment is read at each call, not at import as `huggingface_hub.constants` reads it, so a
program (or a test) that sets `HF_HUB_CACHE` or `HF_HUB_OFFLINE` after importing transformers is
obeyed.
"""

from __future__ import annotations

import os
from pathlib import Path


# what a download fetches; weights formats our loaders never read are left on the hub
_WANTED = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_TRUE = {"1", "on", "yes", "true"}


class ModelNotFound(FileNotFoundError):
    """No folder, zoo entry or hub id of that name could be found (or fetched)."""


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment names it now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache"),
                                            "huggingface")
    return Path(home, "hub").expanduser()


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) as set now."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_hub_id(text: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def resolve_model(path_or_id: str | os.PathLike, argument: str | None = None) -> Path:
    """The local folder of `path_or_id`: a folder, a zoo entry name or a hub id (see the module
    docstring for the order). Raises `ModelNotFound` with one line naming the folder and the hub
    id tried, after `argument: ` when given (the caller's parameter name)."""
    try:
        return _resolve(str(path_or_id))
    except ModelNotFound as err:
        if argument is None:
            raise
        raise ModelNotFound(f"{argument}: {err}") from None


def _resolve(text: str) -> Path:
    if not text:  # Path("") is the current folder, which is a folder
        raise ModelNotFound("expected a model folder or a Hugging Face hub id, got ''")
    if Path(text).is_dir():
        return Path(text)
    from mmspec.zoo.paths import model_path  # lazy: the zoo's loaders import this module

    if model_path(text) != text:  # a zoo entry's name
        return Path(model_path(text))
    if not _is_hub_id(text):
        raise ModelNotFound(f"no such model folder {text} (nor a Hugging Face hub id: "
                            f"those read ORG/NAME)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        folder = Path(snapshot_download(text, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        folder = None
    # a snapshot that another tool cached in part (transformers' AutoConfig fetches config.json
    # alone) is completed online, as from_pretrained completes it
    if folder is not None and (hub_offline() or _has_weights(folder)):
        return folder
    zoo_names = "" if "/" in text or folder is not None else _zoo_hint()
    if hub_offline():
        raise ModelNotFound(f"no model folder {text}, and the hub id {text} is not in the "
                            f"Hugging Face cache {cache} (HF_HUB_OFFLINE is set, so nothing "
                            f"downloads){zoo_names}")
    return _download(text, cache, zoo_names)


def _has_weights(folder: Path) -> bool:
    return any(folder.rglob("*.safetensors")) or any(folder.rglob("*.bin"))


def _download(repo_id: str, cache: Path, zoo_names: str) -> Path:
    """Fetch the files our loaders read (`_WANTED`; `.bin` weights where there are no
    safetensors) into `cache`."""
    from huggingface_hub import list_repo_files, snapshot_download
    from huggingface_hub.errors import HTTPError

    try:
        files = list_repo_files(repo_id)
        wanted = _WANTED + ([] if any(f.endswith(".safetensors") for f in files) else ["*.bin"])
        return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=wanted))
    except (HTTPError, OSError) as err:  # no such repo, gated, no network (the transport's base)
        first = " ".join(str(err).split())[:200]
        raise ModelNotFound(f"no model folder {repo_id}, and the hub id {repo_id} is neither in "
                            f"the Hugging Face cache {cache} nor could be downloaded ({first}; "
                            f"without network, HF_HUB_OFFLINE=1 skips the download){zoo_names}"
                            ) from None


def _zoo_hint() -> str:
    from mmspec.zoo.registry import available

    return f"; zoo entries: {', '.join(available())}"

