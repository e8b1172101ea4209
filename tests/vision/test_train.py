"""Training: a few steps lower the loss, checkpoints resume exactly, the command line runs."""

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_vlms import llava_prompt, no_eos, tiny_llava, tiny_llava_processor
from transformers import AutoModelForImageTextToText

from mmspec.train_scaffold import linear_schedule
from mmspec.vision import ViSpecDrafter
from mmspec.vision import train as train_mod
from mmspec.vision.train import (
    TrainConfig,
    main,
    sample_loss,
    target_answers,
    target_fingerprint,
    train,
)

CFG = TrainConfig(steps=12, lr=3e-3, warmup_steps=2, noise=0.0, answer_tokens=16, eval_every=0,
                  checkpoint_every=0)


@pytest.fixture(scope="module")
def samples():
    return [{"input_ids": ids, **extras}
            for ids, extras in (llava_prompt(images=n, seed=s) for n, s in [(1, 0), (2, 1)])]


def _fresh(llava, text_only=False):
    torch.manual_seed(0)
    return ViSpecDrafter.from_target(llava, text_only=text_only)


def _mean_loss(drafter, llava, samples):
    answers = target_answers(llava, samples, CFG.answer_tokens, None)
    with torch.no_grad():
        return sum(float(sample_loss(drafter, llava, s, a, CFG)[0])
                   for s, a in zip(samples, answers)) / len(samples)


@pytest.mark.parametrize("text_only", [False, True])
def test_a_few_steps_lower_the_loss(llava, samples, text_only):
    drafter = _fresh(llava, text_only)
    before = _mean_loss(drafter, llava, samples)
    losses = train(drafter, llava, samples, CFG)
    after = _mean_loss(drafter, llava, samples)
    assert len(losses) == CFG.steps
    assert after < 0.9 * before, (before, after)


def test_loss_has_every_term_and_the_rollout(llava, samples):
    answer = target_answers(llava, samples[:1], CFG.answer_tokens, None)[0]
    cfg = TrainConfig(ce_weight=0.1, rollout_steps=2, noise=0.0)
    loss, parts = sample_loss(_fresh(llava), llava, samples[0], answer, cfg)
    assert set(parts) == {f"{t}{r}" for t in ("feature", "tv", "rank", "ce") for r in range(3)}
    # the rollouts see the drafter's own features, not the target's: their terms differ
    assert parts["tv1"] != parts["tv0"] and parts["tv2"] != parts["tv1"]
    weights = {"feature": 1.0, "tv": 10.0, "rank": 0.1, "ce": 0.1}
    assert float(loss.detach()) == pytest.approx(sum(weights[k[:-1]] * v for k, v in parts.items()), rel=1e-5)


def test_resume_continues_exactly(tmp_path, llava, samples, monkeypatch, interrupt_on_call):
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 6, "checkpoint_every": 3, "noise": 0.2})
    full = _fresh(llava)
    train(full, llava, samples, cfg, out_dir=tmp_path / "full")

    original = interrupt_on_call(train_mod, "sample_loss", 5)  # crashes on step 5
    with pytest.raises(KeyboardInterrupt, match=r"^the checkpoint in .*cut is at step 3 of 6 "
                                                r"\(every 3 steps\); rerun with --resume"):
        train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path / "cut")
    monkeypatch.setattr(train_mod, "sample_loss", original)
    resumed = _fresh(llava)
    losses = train(resumed, llava, samples, cfg, out_dir=tmp_path / "cut", resume=True)
    assert len(losses) == 3  # steps 4-6 only
    a, b = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_train_makes_vispecs_update_written_out_by_hand(llava, samples):
    # the loop is the shared TrainLoop's; the update stays ViSpec's: AdamW on the linear schedule,
    # a backward per sample of its share of the mean, zeros for unreached parameters, gradient
    # values clipped, the feature noise of each (step, slot), the picks of one seeded stream
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 3, "batch_size": 2, "noise": 0.2,
                         "grad_clip": 0.05})
    trained = _fresh(llava)
    losses = train(trained, llava, samples, cfg)

    ref = _fresh(llava).train()
    answers = target_answers(llava, samples, cfg.answer_tokens, None)
    params = [p for p in ref.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas)
    sched = linear_schedule(opt, cfg.warmup_steps, cfg.steps)
    rng, expected = random.Random(cfg.seed), []
    for step in range(cfg.steps):
        opt.zero_grad()
        picks, total = [rng.randrange(len(samples)) for _ in range(2)], 0.0
        for slot, i in enumerate(picks):
            loss, _ = sample_loss(ref, llava, samples[i], answers[i], cfg,
                                  train_mod._noise_generator(cfg.seed, step, slot))
            (loss / 2).backward()
            total += float(loss.detach())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        expected.append(total / 2)
    assert losses == expected
    a, b = trained.state_dict(), ref.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_step_without_images_steps_the_adaptor_as_several_processes_do(tmp_path, llava):
    # one process left the unused adaptor without a gradient (AdamW skipped it) while the
    # all-reduce of several gave it zeros (AdamW decays it): zeros in both now
    text = [{"input_ids": torch.tensor([[1, 5, 6, 7, 8, 9]])}]
    drafter = _fresh(llava)
    before = {k: v.clone() for k, v in drafter.adaptor.state_dict().items()}
    train(drafter, llava, text, TrainConfig(**{**CFG.__dict__, "steps": 2}), out_dir=tmp_path)
    optimizer = torch.load(tmp_path / "checkpoint" / "optimizer.bin", weights_only=True)
    steps = [int(s["step"]) for s in optimizer["state"].values()]
    assert steps == [2] * len(list(drafter.parameters()))
    after = drafter.adaptor.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in ("queries", "k_proj.weight"))


@pytest.mark.parametrize("first_text_only", [True, False])
def test_resume_refuses_the_other_variant(tmp_path, llava, samples, first_text_only):
    # the checkpoint's weights went into the other variant: a missing/unexpected keys traceback
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 1})
    train(_fresh(llava, first_text_only), llava, samples, cfg, out_dir=tmp_path)
    flag = " (--text-only)" if first_text_only else ""
    with pytest.raises(ValueError, match=rf"resume: the checkpoint in .*checkpoint holds a "
                                         rf"drafter with text_only={first_text_only}"
                                         rf"{re.escape(flag)}, this run's "
                                         rf"text_only={not first_text_only}"):
        train(_fresh(llava, not first_text_only), llava, samples, cfg, out_dir=tmp_path,
              resume=True)


def test_command_line(tmp_path, llava, samples, capsys):
    llava.save_pretrained(tmp_path / "target")
    torch.save(samples * 2, tmp_path / "samples.pt")
    main(["--target", str(tmp_path / "target"), "--data", str(tmp_path / "samples.pt"),
          "--out", str(tmp_path / "out"), "--steps", "4", "--lr", "1e-3", "--warmup-steps", "1",
          "--answer-tokens", "8", "--eval-every", "2", "--eval-new-tokens", "6",
          "--held-out", "0.25"])
    assert (tmp_path / "out" / "answers.pt").is_file()
    assert "held-out tau" in capsys.readouterr().out
    loaded = ViSpecDrafter.from_pretrained(tmp_path / "out", llava)
    assert not loaded.config.text_only


def test_command_line_with_images_and_prompts(tmp_path, llava, capsys):
    """The .jsonl path: the target's processor builds the prompts, one of them with two images."""
    llava.save_pretrained(tmp_path / "target")
    tiny_llava_processor().save_pretrained(tmp_path / "target")
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    rows = [{"image": str(tmp_path / "0.png"), "prompt": "w9 w10"},
            # relative paths are read beside the .jsonl (they were read from the working dir)
            {"image": ["1.png", "2.png"], "prompt": "w11"},
            {"image": str(tmp_path / "2.png"), "prompt": "w12 w13 w14"}]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    main(["--target", str(tmp_path / "target"), "--data", str(tmp_path / "data.jsonl"),
          "--out", str(tmp_path / "out"), "--steps", "3", "--lr", "1e-3", "--warmup-steps", "1",
          "--answer-tokens", "6", "--eval-every", "3", "--eval-new-tokens", "4",
          "--held-out", "0.3", "--suffix", "w20"])
    answers = torch.load(tmp_path / "out" / "answers.pt")
    assert len(answers) == 2 and all(len(a) == 6 for a in answers.values())  # 1 row held out
    assert "held-out tau" in capsys.readouterr().out
    ViSpecDrafter.from_pretrained(tmp_path / "out", llava)


def test_resume_with_a_bf16_target_keeps_fp32_master_weights(tmp_path, samples):
    # the checkpoint went back through from_pretrained, which cast it to the target's bf16
    target = no_eos(tiny_llava()).to(torch.bfloat16)
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 4, "checkpoint_every": 3})
    drafter = _fresh(target).float()
    train(drafter, target, samples, cfg, out_dir=tmp_path)
    saved = ViSpecDrafter.from_pretrained(tmp_path / "checkpoint", target, dtype=torch.float32)
    resumed = _fresh(target).float()
    train_mod._load_drafter_weights(resumed, tmp_path / "checkpoint")
    a, b = saved.state_dict(), resumed.state_dict()
    assert a["head.fc.weight"].dtype == torch.float32
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], a[k].bfloat16().float()) for k in a)  # fp32 detail kept


def test_answer_cache_knows_the_image_and_the_length(tmp_path, llava, samples):
    # the key was (index, input_ids): the same prompt with another image got the old answer
    cache = tmp_path / "answers.pt"
    first = target_answers(llava, samples[:1], 8, cache)[0]
    other = {**samples[0], "pixel_values": samples[0]["pixel_values"].flip(-1)}
    assert torch.equal(target_answers(llava, [other], 8, cache)[0],
                       target_answers(llava, [other], 8, None)[0])
    assert len(target_answers(llava, samples[:1], 12, cache)[0]) == 12
    assert torch.equal(target_answers(llava, samples[:1], 8, cache)[0], first)


def test_answer_cache_knows_the_target(tmp_path, llava, samples):
    # the key had no target: a cache made with one target fed its answers to another's training
    cache = tmp_path / "answers.pt"
    first = target_answers(llava, samples[:1], 8, cache)[0]
    penalised = no_eos(tiny_llava())
    penalised.generation_config.repetition_penalty = 1.5
    for target in (no_eos(tiny_llava(seed=1)), penalised):
        own = target_answers(target, samples[:1], 8, None)[0]
        assert not torch.equal(own, first)
        assert torch.equal(target_answers(target, samples[:1], 8, cache)[0], own)
    # another dtype is another target; the same model loaded from another folder is not
    fingerprint = target_fingerprint(llava)
    assert target_fingerprint(no_eos(tiny_llava()).to(torch.bfloat16)) != fingerprint
    for folder in ("a", "b"):
        llava.save_pretrained(tmp_path / folder)
        loaded = no_eos(AutoModelForImageTextToText.from_pretrained(tmp_path / folder))
        assert target_fingerprint(loaded) == fingerprint


def test_a_refused_generation_setting_fails_before_training(llava, samples):
    llava.generation_config.no_repeat_ngram_size = 3
    try:
        with pytest.raises(ValueError, match="no_repeat_ngram_size"):
            train(_fresh(llava), llava, samples, CFG, held_out=samples[:1])
    finally:
        llava.generation_config.no_repeat_ngram_size = None


def _kill_the_second_save_at(point, monkeypatch):
    """Make the step-6 checkpoint save (the second) die: while writing its trainer.pt (its weights
    already written), or between the renames that swap it in (no `checkpoint` on disk)."""
    calls = [0]
    if point == "trainer.pt":
        real = torch.save

        def dies(obj, f, *args, **kwargs):
            if str(f).endswith("trainer.pt"):
                calls[0] += 1
                if calls[0] == 2:
                    raise KeyboardInterrupt
            return real(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", dies)
    else:
        real = Path.rename

        def dies(self, to):
            if Path(to).name == "checkpoint":
                calls[0] += 1
                if calls[0] == 2:
                    raise KeyboardInterrupt
            return real(self, to)

        monkeypatch.setattr(Path, "rename", dies)
    return calls


@pytest.mark.parametrize("point", ["trainer.pt", "swap"])
def test_a_run_killed_while_saving_a_checkpoint_resumes_exactly(tmp_path, llava, samples,
                                                                monkeypatch, point):
    # the weights were overwritten in place before trainer.pt: a kill between the two left the
    # step-6 weights with the step-3 step, optimizer and RNG states, and --resume took them
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 6, "checkpoint_every": 3, "noise": 0.2})
    full = _fresh(llava)
    train(full, llava, samples, cfg, out_dir=tmp_path / "full")

    with monkeypatch.context() as patch:
        calls = _kill_the_second_save_at(point, patch)
        with pytest.raises(KeyboardInterrupt):
            train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path / "cut")
        assert calls[0] == 2
    cut = tmp_path / "cut"
    resumed = _fresh(llava)
    losses = train(resumed, llava, samples, cfg, out_dir=cut, resume=True)
    assert len(losses) == 3  # steps 4-6, from the whole step-3 checkpoint
    a, b = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in cut.glob("checkpoint*")) == ["checkpoint"]  # no leftovers
    assert torch.load(cut / "checkpoint" / "trainer.pt", weights_only=True)["step"] == 6


def test_a_rerun_without_resume_refuses_to_overwrite_the_checkpoint(tmp_path, llava, samples):
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 2})
    train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path)
    before = (tmp_path / "checkpoint" / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match=r"checkpoint exists: pass --resume"):
        train(_fresh(llava), llava, samples, TrainConfig(**{**cfg.__dict__, "seed": 1}),
              out_dir=tmp_path)
    assert (tmp_path / "checkpoint" / "model.safetensors").read_bytes() == before
    assert torch.load(tmp_path / "checkpoint" / "trainer.pt", weights_only=True)["step"] == 2


def test_interrupted_target_answers_are_kept_and_resumed(tmp_path, llava, monkeypatch):
    # answers.pt was written once, after the last answer: an interrupt lost every answer
    samples = [{"input_ids": i, **e} for i, e in (llava_prompt(seed=s) for s in range(5))]
    expected = target_answers(llava, samples, 8, None)
    cache, real, on_disk = tmp_path / "answers.pt", llava.generate, []

    def killed_at_the_4th(*args, **kwargs):  # a kill: what is on disk is what was saved
        if len(on_disk) == 3:
            on_disk.append(len(torch.load(cache, weights_only=True)))
            raise KeyboardInterrupt
        on_disk.append(None)
        return real(*args, **kwargs)

    monkeypatch.setattr(llava, "generate", killed_at_the_4th)
    with pytest.raises(KeyboardInterrupt):
        target_answers(llava, samples, 8, cache, save_every_s=0)
    assert on_disk[-1] == 3  # saved as they came, not only at the end
    assert len(torch.load(cache, weights_only=True)) == 3
    calls = []
    monkeypatch.setattr(llava, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    answers = target_answers(llava, samples, 8, cache)
    assert len(calls) == 2  # only the missing ones
    assert all(torch.equal(a, b) for a, b in zip(answers, expected))
    assert len(torch.load(cache, weights_only=True)) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["answers.pt"]  # no temp file left


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory, llava):
    """A saved tiny target and 20 ready samples, for `main`."""
    folder = tmp_path_factory.mktemp("cli")
    llava.save_pretrained(folder / "target")
    torch.save([{"input_ids": i, **e} for i, e in (llava_prompt(seed=s) for s in range(20))],
               folder / "samples.pt")
    return ["--target", str(folder / "target"), "--data", str(folder / "samples.pt"),
            "--out", str(folder / "out")]


@pytest.fixture
def main_train(monkeypatch):
    """Runs `main` up to `train`, recording what it would train on."""
    seen = {}

    def record(drafter, target, train_set, cfg, held_out, out_dir, resume, fit_vocabulary,
               save_format):
        seen.update(train=len(train_set), held=len(held_out), cfg=cfg, drafter=drafter,
                    fit_vocabulary=fit_vocabulary, save_format=save_format)

    monkeypatch.setattr(train_mod, "train", record)
    return seen


@pytest.mark.parametrize("held_out", ["5", "1.0", "-0.5", "nan"])
def test_command_line_refuses_a_held_out_share_outside_0_to_1(cli_files, main_train, capsys,
                                                              held_out):
    # 5 (meaning 5%) or 1.0 left one training sample; a negative share sliced from the end
    with pytest.raises(SystemExit):
        main([*cli_files, "--held-out", held_out])
    assert f"--held-out must be a fraction in [0, 1), got {float(held_out)}" in \
        capsys.readouterr().err
    main([*cli_files, "--held-out", "0.1"])
    assert (main_train["train"], main_train["held"]) == (18, 2)


def test_command_line_warm_up_never_outlasts_the_run(cli_files, main_train, capsys):
    # the default warm-up (100 steps) with --steps 10 never reached --lr: the peak was 0.1 * lr
    main([*cli_files, "--steps", "10"])
    cfg = main_train["cfg"]
    assert cfg.warmup_steps == 10
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched, rates = linear_schedule(opt, cfg.warmup_steps, cfg.steps), []
    for _ in range(cfg.steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(rates) == 1.0
    main([*cli_files, "--steps", "300"])
    assert main_train["cfg"].warmup_steps == TrainConfig.warmup_steps  # 100, the default
    main([*cli_files, "--steps", "10", "--warmup-steps", "4"])
    assert main_train["cfg"].warmup_steps == 4
    with pytest.raises(SystemExit):
        main([*cli_files, "--steps", "10", "--warmup-steps", "20"])
    assert "--warmup-steps must be at most --steps (10)" in capsys.readouterr().err


def test_command_line_grows_a_text_only_drafter_into_a_vispec_one(cli_files, main_train,
                                                                  llava, tmp_path, capsys):
    # --drafter kept the saved variant: a stage-1 text-only drafter never got its adaptor
    stage1 = _fresh(llava, text_only=True)
    with torch.no_grad():
        stage1.head.fc.weight.mul_(2)  # not what a fresh drafter starts from
    stage1.save_pretrained(tmp_path / "stage1")
    main([*cli_files, "--drafter", str(tmp_path / "stage1")])
    grown = main_train["drafter"]
    assert not grown.config.text_only and grown.adaptor is not None
    saved = stage1.state_dict()
    assert all(torch.equal(grown.state_dict()[k], v) for k, v in saved.items())
    d = grown.config.hidden_size  # img_fc = [I | 0]: it drafts as the text drafter did
    assert torch.equal(grown.head.img_fc.weight, torch.cat([torch.eye(d), torch.zeros(d, d)], 1))
    assert "new: head.img_fc.weight, head.img_fc.bias, adaptor.queries" in capsys.readouterr().out
    main([*cli_files, "--drafter", str(tmp_path / "stage1"), "--text-only"])
    assert main_train["drafter"].config.text_only
    _fresh(llava).save_pretrained(tmp_path / "vispec")
    with pytest.raises(SystemExit):
        main([*cli_files, "--drafter", str(tmp_path / "vispec"), "--text-only"])
    assert re.search(r"error: --text-only: the --drafter in .*vispec is a ViSpec",
                     capsys.readouterr().err)


@pytest.mark.parametrize("changes,message", [
    ({"steps": 0}, r"TrainConfig.steps must be an int >= 1, got 0"),
    ({"eval_every": -1}, r"TrainConfig.eval_every must be an int >= 0 \(0: never\), got -1"),
    ({"rank_top": 0}, r"TrainConfig.rank_top must be an int >= 1"),
    ({"lr": 0.0}, r"TrainConfig.lr must be a finite number > 0, got 0.0"),
    ({"lr": float("nan")}, r"TrainConfig.lr must be a finite number > 0, got nan"),
    ({"tv_weight": -1.0}, r"TrainConfig.tv_weight must be a finite number >= 0"),
    ({"betas": (0.9, 1.5)}, r"TrainConfig.betas must be two numbers in \[0, 1\)"),
    ({"feature_weight": 0.0, "tv_weight": 0.0, "rank_weight": 0.0},
     "are all 0: there would be nothing to train on"),
])
def test_bad_train_config_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**changes)


def test_the_cli_names_the_flag_of_what_does_not_load(cli_files, main_train, tmp_path, capsys):
    # each was a traceback: transformers' "Repo id must be in the form ..." for a missing target
    # folder, FileNotFoundError for the data, an image or the drafter (the jsonl needs a target
    # with a processor: the zoo's)
    from mmspec.zoo import render
    from mmspec.zoo.paths import ZOO_DIR

    target, data, out = cli_files[1], cli_files[3], cli_files[5]
    render(0).save(tmp_path / "ok.png")
    (tmp_path / "data.jsonl").write_text(
        '{"image": "%s", "prompt": "hi"}\n{"image": "%s", "prompt": "hi"}'
        % (tmp_path / "ok.png", tmp_path / "gone.png"))
    cases = [
        (["--target", str(tmp_path / "nope"), "--data", data],
         r"--target .*nope: cannot load it as a vision-language model \(no such folder"),
        (["--target", target, "--data", str(tmp_path / "nope.jsonl")],
         r"--data .*nope.jsonl: no such file"),
        (["--target", str(ZOO_DIR / "vlm-target"), "--data", str(tmp_path / "data.jsonl")],
         r"--data .*data.jsonl line 2: .*No such file or directory: .*gone.png"),
        ([*cli_files[:4], "--drafter", str(tmp_path / "nothing")],
         r"--drafter .*nothing: path: no such model folder .*nothing \(nor a Hugging Face"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit):
            main([*argv, "--out", out])
        assert re.search(f"error: {message}", capsys.readouterr().err), argv


def test_the_cli_names_the_flag_of_a_bad_config_value(capsys, tmp_path):
    from mmspec.vision.train import main

    with pytest.raises(SystemExit):
        main(["--target", "t", "--data", str(tmp_path / "d.pt"), "--out", str(tmp_path / "o"),
              "--lr", "-1"])
    assert "--lr must be a finite number > 0, got -1.0" in capsys.readouterr().err


GOOD_IDS = torch.tensor([[1, 5, 6]])


@pytest.mark.parametrize("data, message", [
    ([], r"expected a non-empty list of samples \(dicts with input_ids \[1, L\]\), got an empty "
         r"list"),
    ({"input_ids": GOOD_IDS}, r"expected a non-empty list of samples .*, got a dict"),
    ([{"input_ids": GOOD_IDS}, {"pixel_values": torch.zeros(1, 3, 32, 32)}],
     r"\[1\]: expected a dict with input_ids, got \['pixel_values'\]"),
    ([GOOD_IDS], r"\[0\]: expected a dict with input_ids, got Tensor"),
    ([{"input_ids": torch.ones(2, 5, dtype=torch.long)}],
     r"\[0\]: input_ids must be an integer tensor \[1, L\] \(one row, L >= 1\), got "
     r"torch.int64 \[2, 5\]"),
    ([{"input_ids": torch.ones(5, dtype=torch.long)}], r"got torch.int64 \[5\]"),
    ([{"input_ids": torch.ones(1, 0, dtype=torch.long)}], r"got torch.int64 \[1, 0\]"),
    ([{"input_ids": torch.ones(1, 5)}], r"got torch.float32 \[1, 5\]"),
    ([{"input_ids": [[1, 5, 6]]}], r"input_ids must be an integer tensor \[1, L\].*, got list"),
    ([{"input_ids": GOOD_IDS, "image_sizes": [[32, 32]]}],
     r"\[0\]: image_sizes must be a tensor \(a processor output\), got list"),
])
def test_load_samples_names_what_is_not_a_sample(tmp_path, data, message):
    # a [2, L] or 1-D input_ids, a list for a tensor failed later, deep in generate or the loss
    torch.save(data, tmp_path / "samples.pt")
    with pytest.raises(ValueError, match=rf"--data {re.escape(str(tmp_path))}/samples.pt"):
        train_mod.load_samples(tmp_path / "samples.pt", "unused", "")
    with pytest.raises(ValueError, match=message):
        train_mod.load_samples(tmp_path / "samples.pt", "unused", "")


@pytest.mark.parametrize("lines, message", [
    (["", "  "], r"data.jsonl: no samples, the file has no non-empty line"),
    (["", '{"image": "a.png"}'],
     r'data.jsonl line 2: expected \{"image": path or \[paths\], "prompt": text\}, got '
     r"\['image'\]"),
    (['["a.png", "hi"]'], r"line 1: expected .*, got list"),
    (['{"image": [], "prompt": "hi"}'],
     r'line 1: "image" must be a path or a non-empty list of paths, got \[\]'),
    (['{"image": 3, "prompt": "hi"}'], r'line 1: "image" must be a path .*, got 3'),
    (['{"image": "a.png", "prompt": null}'], r'line 1: "prompt" must be text, got None'),
    (["{'image': 'a.png'}"], r"line 1: not JSON \(Expecting property name"),
])
def test_load_samples_names_the_bad_jsonl_line(tmp_path, lines, message):
    (tmp_path / "data.jsonl").write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message):
        train_mod._load_jsonl(tmp_path / "data.jsonl", None, "")  # before any processor call


def test_train_refuses_what_is_not_a_sample(llava):
    with pytest.raises(ValueError, match=r"^samples\[0\]: input_ids must be an integer"):
        train(_fresh(llava), llava, [{"input_ids": torch.tensor([1, 5, 6])}], CFG)
    with pytest.raises(ValueError, match=r"^held_out: expected a non-empty list .*got a dict"):
        train(_fresh(llava), llava, [{"input_ids": GOOD_IDS}], CFG,
              held_out={"input_ids": GOOD_IDS})


def test_resume_refuses_a_checkpoint_past_the_steps_or_another_lr(tmp_path, llava, samples):
    # --steps below the checkpoint's: nothing trained, and the checkpoint was rewritten as that
    # step over the states of the later one; another --lr was silently replaced by the saved one
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 4})
    train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path)
    fewer = TrainConfig(**{**cfg.__dict__, "steps": 2})
    with pytest.raises(ValueError, match=r"at step 4, past --steps 2; give --steps >= 4"):
        train(_fresh(llava), llava, samples, fewer, out_dir=tmp_path, resume=True)
    assert torch.load(tmp_path / "checkpoint" / "trainer.pt", weights_only=True)["step"] == 4
    other_lr = TrainConfig(**{**cfg.__dict__, "steps": 6, "lr": 1e-4})
    with pytest.raises(ValueError, match=r"trained with --lr 0.003, this run's is 0.0001"):
        train(_fresh(llava), llava, samples, other_lr, out_dir=tmp_path, resume=True)


def test_command_line_mistakes_are_messages(cli_files, tmp_path, capsys):
    # each was a traceback: a FileExistsError, AssertionError or RuntimeError
    out = tmp_path / "file"
    out.write_text("")
    args = [*cli_files[:4], "--out", str(out), "--steps", "1"]
    for argv, message in ((args, r"--out .*file is a file; give a folder"),
                          ([*args, "--device", "nope"], r"--device nope: "),
                          ([*args, "--device", "cuda"], r"--device cuda: this torch sees no "
                                                        r"CUDA device")):
        if "cuda" in argv and torch.cuda.is_available():
            continue
        with pytest.raises(SystemExit):
            main(argv)
        assert re.search(f"error: {message}", capsys.readouterr().err), argv
    with pytest.raises(SystemExit):
        main([*cli_files[:4], "--out", str(tmp_path / "o"), "--tv-weight", "0",
              "--feature-weight", "0", "--rank-weight", "0"])
    assert "--feature-weight" in capsys.readouterr().err


def test_a_checkpoint_of_the_old_format_is_refused_in_one_line(tmp_path, llava, samples):
    # its optimizer, scheduler and sample stream were in trainer.pt; now they are accelerate's
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 2})
    train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path)
    ckpt = tmp_path / "checkpoint"
    for state in ckpt.glob("*.bin"):
        state.unlink()
    torch.save({"step": 2, "optimizer": {}, "scheduler": {}, "sample_rng": None},
               ckpt / "trainer.pt")
    with pytest.raises(train_mod.ResumeError, match=r"^resume: the checkpoint in .*checkpoint is "
                                                    r"of an earlier mmspec .*cannot be resumed"):
        train(_fresh(llava), llava, samples, cfg, out_dir=tmp_path, resume=True)
