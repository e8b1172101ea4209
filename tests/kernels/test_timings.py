"""`backend="auto"` from a measured timing table (a fake one here, at a monkeypatched path)."""

import json
import logging

import pytest
import torch

from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.__main__ import main as mmspec_main
from mmspec.kernels import tune
from mmspec.kernels.backends import timings
from mmspec.kernels.backends import registry
from mmspec.kernels.backends.registry import resolve_backend

CPU = timings.device_name(torch.device("cpu"))


@pytest.fixture
def table(tmp_path, monkeypatch):
    """`table(entries)` writes a fake table where `auto` looks; `table(text=...)` raw text."""
    path = tmp_path / timings.TABLE_NAME
    monkeypatch.setattr(timings, "table_path", lambda: path)
    timings.forget()

    def write(entries=(), text=None):
        path.write_text(text if text is not None else json.dumps(
            {"version": 1, "entries": list(entries)}))
        timings.forget()

    yield write
    timings.forget()


def entry(density, ms, device=CPU, dtype="float32", head_dim=16):
    return {"device": device, "dtype": dtype, "head_dim": head_dim, "density": density, "ms": ms}


def case(kept, of=8, d=16, dtype=torch.float32, block=16):
    """q, k, v and a mask keeping `kept` of `of` key blocks in every row (density kept / of)."""
    n = of * block
    q = torch.randn(1, 2, n, d).to(dtype)
    blocks = torch.zeros(1, 1, of, of, dtype=torch.bool)
    blocks[..., :kept] = True
    return q, q, q, BlockSparseMask.from_dense(blocks, block, n, n)


def auto(q, k, v, mask):
    return resolve_backend("auto", q, k, v, mask).name


def test_auto_picks_the_tables_fastest_per_density(table):
    table([entry(0.25, {"torch": 2.0, "flex": 1.0}), entry(1.0, {"reference": 1.0, "torch": 3.0})])
    assert auto(*case(2)) == "flex"  # density 0.25
    assert auto(*case(8)) == "reference"  # density 1
    assert auto(*case(5)) == "reference"  # 0.625: nearer to 1 than to 0.25 (in log scale)
    assert auto(*case(3)) == "flex"  # 0.375: nearer to 0.25


def test_auto_keeps_the_fixed_order_without_a_near_entry(table):
    assert auto(*case(2)) == "torch"  # no table file at all
    table([entry(0.25, {"flex": 1.0, "torch": 2.0}), entry(1.0, {"reference": 1.0})])
    assert auto(*case(1, of=16)) == "torch"  # density 1/16: over 2x below the nearest, 0.25
    assert auto(*case(2, d=32)) == "torch"  # a head dim never measured
    assert auto(*case(2, dtype=torch.bfloat16)) == "torch"  # a dtype never measured


def test_auto_ignores_entries_for_another_device(table):
    table([entry(0.25, {"flex": 1.0, "torch": 2.0}, device="NVIDIA H100 80GB HBM3")])
    assert auto(*case(2)) == "torch"
    table([entry(0.25, {"flex": 1.0, "torch": 2.0})])
    assert auto(*case(2)) == "flex"


def test_auto_skips_a_measured_backend_whose_constraints_fail(table):
    # Triton (interpreted here) refuses blocks that are not powers of two: the next one runs
    table([entry(0.25, {"triton": 1.0, "flex": 2.0, "torch": 3.0})])
    assert auto(*case(2, block=16)) == "triton"
    assert auto(*case(2, block=24)) == "flex"


def test_one_ranking_for_every_density_reads_no_density(table, monkeypatch):
    # the density is a device sync on a GPU: read only where the rankings differ
    table([entry(0.1, {"flex": 1.0, "torch": 2.0}), entry(1.0, {"flex": 5.0, "torch": 9.0})])

    def no_read(self):
        raise AssertionError("density read")

    monkeypatch.setattr(BlockSparseMask, "density", no_read)
    assert auto(*case(8)) == "flex"


@pytest.mark.parametrize("text", ["{not json", json.dumps({"version": 1, "entries": [
    entry(3.0, {"flex": 1.0})]}), json.dumps([1, 2])])
def test_a_corrupt_table_warns_once_and_keeps_the_fixed_order(table, caplog, text):
    table(text=text)
    with caplog.at_level(logging.WARNING, logger=timings.__name__):
        assert auto(*case(2)) == "torch"
        assert auto(*case(3)) == "torch"
    records = [r for r in caplog.records if r.name == timings.__name__]
    assert len(records) == 1 and "\n" not in records[0].getMessage()
    assert "ignoring the backend timing table" in records[0].getMessage()


def test_block_sparse_attention_runs_the_chosen_backend(table, monkeypatch):
    table([entry(0.25, {"reference": 1.0, "torch": 2.0})])
    q, k, v, mask = case(2)
    real, calls = registry.get_backend("reference"), []

    def spy(*args):
        calls.append(1)
        return real.fn(*args)

    monkeypatch.setitem(registry._BACKENDS, "reference", registry.Backend("reference", spy))
    out = block_sparse_attention(q, k, v, mask)
    assert calls == [1]
    torch.testing.assert_close(out, real.fn(q, k, v, mask, 16 ** -0.5, 0.0)[0])


def test_tune_writes_a_table_that_auto_reads(table, tmp_path):
    assert tune.main(["--device", "cpu", "--n", "128", "--heads", "1", "--block", "32",
                      "--head-dims", "16", "--densities", "1,0.25", "--repeats", "1"]) == 0
    data = json.loads(timings.table_path().read_text())
    assert [e["density"] for e in data["entries"]] == [1.0, 0.25]
    assert all(e["device"] == CPU and e["head_dim"] == 16 and set(e["ms"]) == {"torch"}
               for e in data["entries"])
    assert timings.ranking(*case(2)[::3]) == ("torch",)


def test_tune_converts_benchmark_points(table, tmp_path):
    points = {"device": "NVIDIA H100 80GB HBM3", "points": [
        {"head_dim": 128, "mask": "random", "density": 0.1, "dense": {"SDPA default": 14.5},
         "backends_ms": {"triton": 2.0, "flex": 5.0}},
        {"head_dim": 128, "mask": "random", "density": 1.0, "dense": {}, "backends_ms": {}}]}
    src = tmp_path / "points.json"
    src.write_text(json.dumps(points))
    assert mmspec_main(["kernels", "tune", "--from-points", str(src)]) == 0  # the command line
    data = json.loads(timings.table_path().read_text())
    assert data["entries"] == [{"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
                                "head_dim": 128, "density": 0.1,
                                "ms": {"triton": 2.0, "flex": 5.0}}]
    # a second device's entries join the first's; the same device's replace its own
    assert tune.main(["--device", "cpu", "--n", "64", "--heads", "1", "--block", "32",
                      "--head-dims", "16", "--densities", "1", "--repeats", "1"]) == 0
    assert tune.main(["--device", "cpu", "--n", "64", "--heads", "1", "--block", "32",
                      "--head-dims", "8", "--densities", "1", "--repeats", "1"]) == 0
    data = json.loads(timings.table_path().read_text())
    assert [(e["device"], e["head_dim"]) for e in data["entries"]] == [
        ("NVIDIA H100 80GB HBM3", 128), (CPU, 8)]
    src.write_text("[]")
    with pytest.raises(SystemExit):  # one line from argparse naming the file
        tune.main(["--from-points", str(src)])
