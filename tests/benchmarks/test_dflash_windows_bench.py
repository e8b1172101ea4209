"""`benchmarks/dflash_windows.py`: DFlash candidates' tau on held-out windows, each output checked
against target-only greedy."""

import pytest
import torch

from benchmarks import dflash_windows
from mmspec.zoo.paths import ZOO_DIR


def test_the_table_has_a_row_per_drafter_and_a_column_per_search(capsys):
    dflash_windows.main([str(ZOO_DIR / "text-dflash"), "--windows", "1", "--new-tokens", "8"])
    table = capsys.readouterr().out.strip().splitlines()[-3:]
    assert table[0].count("|") == 2 + len(dflash_windows.SEARCHES)
    cells = table[2].strip("|").split("|")[1:]
    assert all(1.0 <= float(c) <= 8.0 for c in cells)  # at most 7 drafted + the bonus a forward


def test_an_output_unlike_the_targets_is_refused(monkeypatch):
    from mmspec import zoo
    from mmspec.diffusion import DFlashDrafter

    text = zoo.load("text-target")
    drafter = DFlashDrafter.from_pretrained(ZOO_DIR / "text-dflash", text.model)
    real = dflash_windows.generate

    def wrong(*a, **k):  # one committed token changed
        out = real(*a, **k)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % 4096
        return out

    monkeypatch.setattr(dflash_windows, "generate", wrong)
    with pytest.raises(AssertionError, match="differs from target-only greedy"):
        dflash_windows.window_tau(text.model, drafter, [torch.arange(2, 40)], 4, 0)
