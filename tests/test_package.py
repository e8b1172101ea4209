"""The top-level names: lazy, listed, and each the object its subpackage defines."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import mmspec


def test_every_exported_name_resolves_and_is_listed():
    # dir() missed the lazy names (tab completion); ViSpecDrafter was only in mmspec.vision
    from mmspec import decoding, diffusion, eagle, vision

    assert set(mmspec.__all__) <= set(dir(mmspec))
    assert vision.EagleDrafter is eagle.EagleDrafter  # still importable from its old room
    for name in mmspec.__all__:
        source = (vision if name == "ViSpecDrafter" else eagle if name == "EagleDrafter" else
                  diffusion if hasattr(diffusion, name) else
                  decoding)
        assert getattr(mmspec, name) is getattr(source, name), name


def _imported_modules(path: Path) -> set:
    """The modules that file `path` imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


@pytest.mark.parametrize("room, below, above", [
    ("eagle", (), "mmspec.vision"),  # ViSpec builds on EAGLE's head, never the reverse
    ("zoo", ("training",), "mmspec.zoo.training"),  # loading the zoo needs none of its training
])
def test_rooms_import_downward_only(room, below, above):
    package = Path(mmspec.__file__).parent / room
    files = [p for p in package.rglob("*.py") if p.relative_to(package).parts[0] not in below]
    upward = {f"{p.relative_to(package.parent)}: {name}" for p in files
              for name in _imported_modules(p) if name == above or name.startswith(above + ".")}
    assert files and not upward


def test_the_kernels_import_no_transformers():
    code = "import sys, mmspec, mmspec.kernels; dir(mmspec); print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_declared_dependency_is_imported():
    # einops was declared and imported nowhere; a dependency nothing imports is weight to install
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    modules = {"pillow": "PIL"}
    not_imported = {"ninja": "a build tool torch.utils.cpp_extension runs",
                    "ftfy": "diffusers' Wan pipelines import it without a guard"}
    source = "\n".join(p.read_text() for p in (root / "mmspec").rglob("*.py"))
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0].lower()
        if name in not_imported:
            continue
        module = modules.get(name, name)
        assert re.search(rf"^\s*(import|from) {module}\b", source, re.M), name
