"""A drafter written with `save_pretrained(format="speculators")` against the `speculators`
package itself, in a separate venv (the package pins an older transformers than mmspec's).

Skipped unless MMSPEC_SPECULATORS_VENV=1: it then uses the venv at
`$XDG_CACHE_HOME/mmspec/speculators-venv` (default `~/.cache/mmspec/...`), building it first if
it is missing (pip, a few minutes, once), and takes about a minute on two CPU cores.
The checks themselves are `speculators_venv_check.py`, run with that venv's python.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mmspec import EagleDrafter

from .test_drafter import _config, eagle3_state, target, write  # noqa: F401

SPECULATORS = "speculators==0.9.0"  # the release eagle_speculators.py follows
VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmspec" / \
    "speculators-venv"
CHECK = Path(__file__).with_name("speculators_venv_check.py")
pytestmark = pytest.mark.skipif(os.environ.get("MMSPEC_SPECULATORS_VENV") != "1",
                                reason=f"MMSPEC_SPECULATORS_VENV=1 runs it (venv {VENV}, built "
                                       f"when missing)")


def _venv_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        # the torch already here, so pip need not fetch another build
        built = subprocess.run([str(python), "-m", "pip", "install", "-q", SPECULATORS,
                                f"torch=={torch.__version__}"], capture_output=True, text=True)
        if built.returncode:
            pytest.skip(f"pip could not install {SPECULATORS} into {VENV}: "
                        f"{built.stderr.strip().splitlines()[-1:]}")
        # speculators requires torchvision and torchaudio but imports neither; PyPI's builds of
        # them do not load against a CPU or local torch and break `import transformers`
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision",
                        "torchaudio"], check=True)
    if subprocess.run([str(python), "-c", "import speculators"], capture_output=True).returncode:
        pytest.skip(f"{VENV} has no importable speculators package")
    return python


def test_written_folder_validates_loads_and_computes_in_speculators(target, tmp_path):
    python = _venv_python()
    target.save_pretrained(tmp_path / "verifier")  # the package reads the verifier's config
    drafter = EagleDrafter.from_pretrained(write(tmp_path / "safeailab", _config(True),
                                                 eagle3_state()), target, depth=4)
    folder = drafter.save_pretrained(tmp_path / "spec", verifier=str(tmp_path / "verifier"))

    # mmspec's drafter on one prefill: entry i pairs the features of slot i with token i + 1
    g = torch.Generator().manual_seed(5)
    n, head = 7, drafter.head
    features = torch.randn(1, n, 3 * head.cfg.target_hidden_size, generator=g)
    tokens = torch.randint(0, head.cfg.vocab_size, (1, n), generator=g)
    with torch.no_grad():
        embeds = drafter.embed_weight[tokens]
        x = head.layer_input(embeds, features, from_target=True)
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
        hidden, _ = head(x, embeds, torch.arange(n)[None], None, causal)
        logits = head.draft_logits(hidden, drafter.lm_head_weight)
    save_file({"features": features, "tokens": tokens, "logits": logits.contiguous()},
              str(tmp_path / "reference.safetensors"))

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this mmspec's deps
    run = subprocess.run([str(python), str(CHECK), str(folder),
                          str(tmp_path / "reference.safetensors")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert run.stdout.count("\n") == 3  # config, weights, forward
