"""`mmspec.vision.train` under a launcher: two processes train as one with twice the batch."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_train_worker import CFG, HELD_OUT, samples
from tiny_vlms import no_eos, tiny_llava

from mmspec.vision import ViSpecDrafter
from mmspec.vision.train import TrainConfig, sample_loss, target_answers, train

WORKER = Path(__file__).with_name("dist_train_worker.py")


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(WORKER), str(out)],
                         capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return out, run.stdout


def test_two_processes_train_as_one_with_twice_the_batch(two_processes, tmp_path, capsys):
    two_processes, printed = two_processes
    target = no_eos(tiny_llava())
    torch.manual_seed(0)  # process 0's start, which train broadcasts to process 1
    drafter = ViSpecDrafter.from_target(target)
    cfg = TrainConfig(**{**CFG.__dict__, "batch_size": 2})
    losses = train(drafter, target, samples(), cfg, held_out=samples(HELD_OUT), out_dir=tmp_path)
    # the held-out tau, shared out over the processes, is the single process's (printed once)
    taus = [line for line in capsys.readouterr().out.splitlines() if "held-out tau" in line]
    assert len(taus) == 2 and [line for line in printed.splitlines() if "tau" in line] == taus
    ranks = [torch.load(two_processes / f"rank{r}.pt") for r in (0, 1)]
    for rank in ranks:
        assert rank["losses"] == pytest.approx(losses, rel=1e-5)
        for name, value in drafter.state_dict().items():
            torch.testing.assert_close(rank["state"][name], value, atol=1e-6, rtol=1e-5)
    # process 0 wrote the drafter, each process a share of the answers, all of them once
    saved = ViSpecDrafter.from_pretrained(two_processes, target, dtype=torch.float32)
    torch.testing.assert_close(saved.state_dict()["head.fc.weight"],
                               drafter.state_dict()["head.fc.weight"], atol=1e-6, rtol=1e-5)
    shares = [torch.load(two_processes / f"answers-{r}.pt") for r in (0, 1)]
    assert [len(s) for s in shares] == [2, 1]
    single = torch.load(tmp_path / "answers.pt")
    assert {**shares[0], **shares[1]}.keys() == single.keys()
    assert all(torch.equal(single[k], a) for share in shares for k, a in share.items())


def test_a_step_of_batch_two_reports_the_mean_loss_of_its_two_samples():
    target = no_eos(tiny_llava())
    cfg = TrainConfig(**{**CFG.__dict__, "batch_size": 2, "steps": 1, "noise": 0.0})
    data = samples()
    answers = target_answers(target, data, cfg.answer_tokens, None)
    rng = random.Random(cfg.seed)
    picks = [rng.randrange(len(data)) for _ in range(2)]
    torch.manual_seed(0)
    fresh = ViSpecDrafter.from_target(target).train()
    with torch.no_grad():
        expected = sum(float(sample_loss(fresh, target, data[i], answers[i], cfg)[0])
                       for i in picks) / 2
    torch.manual_seed(0)
    losses = train(ViSpecDrafter.from_target(target), target, data, cfg)
    assert losses == [pytest.approx(expected, rel=1e-5)]
