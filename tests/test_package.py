"""The top-level names: lazy, listed, and each the object its subpackage defines."""

import subprocess
import sys

import mmspec


def test_every_exported_name_resolves_and_is_listed():
    # dir() missed the lazy names (tab completion); ViSpecDrafter was only in mmspec.vision
    from mmspec import decoding, vision
    from mmspec.decoding import drafters

    assert set(mmspec.__all__) <= set(dir(mmspec))
    for name in mmspec.__all__:
        source = (vision if name in ("ViSpecDrafter", "EagleDrafter") else
                  drafters if hasattr(drafters, name) and not hasattr(decoding, name) else
                  decoding)
        assert getattr(mmspec, name) is getattr(source, name), name


def test_the_kernels_import_no_transformers():
    code = "import sys, mmspec, mmspec.kernels; dir(mmspec); print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
