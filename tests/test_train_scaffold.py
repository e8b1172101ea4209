"""The training scaffold: transformers' schedules at the rates the trainers ran by hand, and a
run's checkpoint is accelerate's state folder, swapped in whole, refused in the old format."""

import math

import pytest
import torch

from mmspec.train_scaffold import (META, RunRefused, TrainLoop, command, cosine_schedule,
                                   linear_schedule, read_meta, refuse_old_format, save_swapped)


def _rates(make, warmup, steps, lr=2.0):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched, rates = make(opt, warmup, steps), []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def _zoo_lr_at(lr, warmup, steps, step):  # the zoo trainers' lr_at, three copies before
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _vispec_factor(warmup, steps, step):  # mmspec.vision.train's LambdaLR factor before
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))


@pytest.mark.parametrize("warmup, steps", [(0, 5), (1, 1), (3, 10), (10, 10), (30, 600)])
def test_the_linear_schedule_has_vision_trains_rates(warmup, steps):
    rates = _rates(linear_schedule, warmup, steps)
    assert rates == pytest.approx([2.0 * _vispec_factor(warmup, steps, s) for s in range(steps)],
                                  rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("warmup, steps", [(1, 6), (3, 10), (30, 600), (200, 2000)])
def test_the_cosine_schedule_is_lr_at_one_step_on_after_the_warm_up(warmup, steps):
    # the same warm-up; transformers' cosine is lr_at's one step earlier (floor at the last step)
    rates = _rates(cosine_schedule, warmup, steps)
    assert rates[:warmup] == pytest.approx([_zoo_lr_at(2.0, warmup, steps, s)
                                            for s in range(warmup)], rel=1e-12)
    assert rates[warmup:] == pytest.approx([_zoo_lr_at(2.0, warmup, steps, s + 1)
                                            for s in range(warmup, steps)], rel=1e-12)
    assert rates[-1] == pytest.approx(0.2)


def test_a_loop_saves_accelerate_state_swapped_in_and_resumes_it(tmp_path):
    def loop(ckpt):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        return TrainLoop(model, opt, cosine_schedule(opt, 1, 4), ckpt, {"seed": 0},
                         save_every_s=1e9)

    def steps(run, upto):
        bar = run.steps(4, "test")
        for step in bar:
            if step == upto:
                break
            x = torch.randn(5, 3, generator=torch.Generator().manual_seed(step))
            run.update(run.model(x).square().mean(), step, bar)

    straight, cut = loop(tmp_path / "a"), loop(tmp_path / "b")
    steps(straight, 4)
    steps(cut, 2)
    cut.save()
    assert sorted(p.name for p in tmp_path.glob("b*")) == ["b"]  # the staging folders are gone
    names = {p.name for p in (tmp_path / "b").iterdir()}
    assert {"optimizer.bin", "scheduler.bin", "pytorch_model.bin", META} <= names
    meta = read_meta(tmp_path / "b")
    assert (meta["step"], meta["run"], len(meta["losses"])) == (2, {"seed": 0}, 2)
    resumed = loop(tmp_path / "b")
    assert resumed.resume(meta) == 2
    steps(resumed, 4)
    assert resumed.losses == straight.losses
    assert all(torch.equal(a, b) for a, b in zip(straight.model.state_dict().values(),
                                                 resumed.model.state_dict().values()))


def test_a_save_killed_before_its_swap_keeps_the_previous_checkpoint(tmp_path):
    save_swapped(tmp_path / "ckpt", lambda folder: (folder / "x").write_text("1"))

    def killed(folder):
        (folder / "x").write_text("2")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_swapped(tmp_path / "ckpt", killed)
    assert read_meta(tmp_path / "ckpt") is None  # settles: the half-written one is removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert (tmp_path / "ckpt" / "x").read_text() == "1"


def test_an_old_one_file_checkpoint_is_refused_in_one_line(tmp_path):
    old = tmp_path / "ckpt.pt"
    refuse_old_format(old, tmp_path / "ckpt")  # none there: nothing to refuse
    old.write_bytes(b"")
    with pytest.raises(RunRefused, match=r"ckpt.pt is a checkpoint of an earlier mmspec .* "
                                         r"cannot be resumed"):
        refuse_old_format(old, tmp_path / "ckpt")


def test_the_command_to_resume_adds_resume_once():
    assert command("mmspec.x", ["--out", "a b"]) == "python -m mmspec.x --out 'a b'"
    assert command("mmspec.x", ["--out", "a"], resume=True) == \
        command("mmspec.x", ["--out", "a", "--resume"], resume=True) == \
        "python -m mmspec.x --out a --resume"


def test_the_trainers_share_one_scaffold():
    from mmspec.train_scaffold import RunExists
    from mmspec.vision import train as vision_train
    from mmspec.zoo.training import train_text, train_video, train_vlm

    assert vision_train.RunExists is RunExists and issubclass(vision_train.ResumeError, RunRefused)
    for module in (train_text, train_video, train_vlm, vision_train):
        for own in ("lr_at", "_schedule", "_command", "_all_reduce_grads"):  # each had its own
            assert not hasattr(module, own), (module, own)


class _Stream:
    """A `states` entry: a counter that accelerate checkpoints beside the optimizer."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def _two_part_model():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.used, model.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    return model


def test_value_clipping_and_summed_grads_update_as_a_hand_written_step(tmp_path):
    # vision.train's update: per-sample backward, zeros for the parameters the step did not
    # reach (AdamW then decays them), each gradient entry clipped to [-0.01, 0.01]
    def batch(step):
        return torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(step))

    model = _two_part_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    loop = TrainLoop(model, opt, linear_schedule(opt, 1, 3), tmp_path / "ckpt", {}, clip_norm=None,
                     clip_value=0.01, sum_grads=True)
    bar = loop.steps(3, "test")
    for step in bar:
        loop.zero_grad()
        for x in batch(step):
            loop.backward(model.used(x).square().mean() / 2)
        loop.apply(float(step), step, bar)

    ref = _two_part_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1)
    sched = linear_schedule(ref_opt, 1, 3)
    for step in range(3):
        ref_opt.zero_grad()
        for x in batch(step):
            (ref.used(x).square().mean() / 2).backward()
        for p in ref.unused.parameters():
            p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_value_(ref.parameters(), 0.01)
        ref_opt.step()
        sched.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 ref.state_dict().values()))
    assert loop.losses == [0.0, 1.0, 2.0] and loop.done == 3


def test_a_loop_that_saves_its_model_itself_checkpoints_it_and_its_states(tmp_path):
    model, stream = _two_part_model(), _Stream()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    loop = TrainLoop(model, opt, linear_schedule(opt, 1, 3), tmp_path / "ckpt", {},
                     save_model=lambda folder: torch.save(model.state_dict(), folder / "w.pt"),
                     states=(stream,))
    assert loop.model is model  # not wrapped: the trainer owns its saving
    stream.n = 5
    loop.save()
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"w.pt", "custom_checkpoint_0.pkl", "optimizer.bin", META} <= names
    assert "pytorch_model.bin" not in names
    again = _Stream()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    TrainLoop(model, opt, linear_schedule(opt, 1, 3), tmp_path / "ckpt", {},
              save_model=lambda folder: None, states=(again,)).resume(read_meta(tmp_path / "ckpt"))
    assert again.n == 5


@pytest.mark.parametrize("clips", [{"clip_value": 0.5}, {"clip_norm": None}])
def test_a_loop_takes_one_clipping(tmp_path, clips):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"^TrainLoop: give one of clip_norm and clip_value, the "
                                         r"other None; got clip_norm="):
        TrainLoop(model, opt, linear_schedule(opt, 1, 3), tmp_path, {}, **clips)
    loop = TrainLoop(model, opt, linear_schedule(opt, 1, 3), None, {})
    with pytest.raises(ValueError, match=r"no checkpoint folder \(ckpt None\)"):
        loop.save()
