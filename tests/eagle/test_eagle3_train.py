"""EAGLE-3 training (`mmspec/eagle/eagle3_train.py`, `mmspec.vision.train --arch eagle3`): the
draft vocabulary, the training-time test equal to the drafter's own tree forward, and a tiny run
that trains, saves, loads back with `EagleDrafter.from_pretrained` and decodes exactly as
`target.generate`."""

import json

import torch
import torch.nn.functional as F
from tests.vision.tiny_vlms import (IMAGE, _seeded, _text_config, _vision_config, llava_prompt,
                                     no_eos)
from transformers import LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

import pytest
from mmspec import EagleDrafter, ViSpecDrafter, generate
from mmspec.decoding.draft import DraftState
from mmspec.eagle import drafter as eagle_module
from mmspec.eagle.eagle3_train import (
    draft_vocabulary,
    feature_layers,
    fit_draft_vocabulary,
    eagle3_loss,
    new_eagle3_drafter,
    target_argmax,
    training_passes,
)
from mmspec.vision.train import TrainConfig, main, train

CFG = TrainConfig(steps=80, lr=3e-3, warmup_steps=4, answer_tokens=16, eval_every=0,
                  checkpoint_every=0, rollout_steps=2)

# 4 layers: three distinct feature layers; wide init: peaked next-token laws to learn
TEXT = {**_text_config(), "num_hidden_layers": 4, "initializer_range": 0.3}


@pytest.fixture(scope="module")
def llama():
    cfg = LlamaConfig(**TEXT)
    return no_eos(_seeded(0, lambda: LlamaForCausalLM(cfg)))


@pytest.fixture(scope="module")
def llava():
    cfg = LlavaConfig(vision_config=_vision_config(32),
                      text_config=LlamaConfig(**TEXT),
                      image_token_id=IMAGE, projector_hidden_act="gelu", vision_feature_layer=-1,
                      image_seq_length=16)
    return no_eos(_seeded(0, lambda: LlavaForConditionalGeneration(cfg)))


def _prompts(n, seed, length=6, low=3, high=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.tensor([[1]]), torch.randint(low, high, (1, length), generator=g)],
                      1) for _ in range(n)]


def test_draft_vocabulary_is_the_most_frequent_tokens_by_id():
    answers = [torch.tensor([5, 5, 5, 9, 9, 3]), torch.tensor([9, 7])]
    # 5 and 9 thrice, then 3 before 7 (a tie, by id); draft id i is target id i + d2t[i]
    assert draft_vocabulary(answers, 12, 3).tolist() == [3, 4, 7]  # ids 3, 5, 9
    # more room than tokens seen: the unseen fill up by id
    assert draft_vocabulary(answers, 12, 6).tolist() == [0, 0, 1, 2, 3, 4]  # 0 1 3 5 7 9
    assert feature_layers(32) == (2, 16, 29) and feature_layers(4) == (1, 2, 3)


def test_training_passes_are_the_drafters_tree_forward(llama, monkeypatch):
    """Pass i at entry j is the tree node at depth i below entry j along the gold tokens, as
    `EagleDrafter.propose` and its tree step compute it at decoding time."""
    torch.manual_seed(0)
    drafter = new_eagle3_drafter(llama, draft_vocab_size=48)
    ids = _prompts(1, 3, length=11, low=60, high=120)[0]  # [1, 12]
    fit_draft_vocabulary(drafter, [ids[0]])  # every token of ids is in the draft vocabulary
    draft_ids = drafter.head.target_ids(torch.arange(48))
    assert not torch.equal(draft_ids, torch.arange(48))  # a real mapping
    with torch.no_grad():
        hs = llama(ids, output_hidden_states=True).hidden_states
        features = torch.cat([hs[i] for i in drafter.config.feature_layers], -1)  # [1, 12, 3d]
        steps = 3
        passes = training_passes(drafter, features[:, :-1], F.pad(ids, (0, steps))[:, 1:], steps)
    roots = []
    original = eagle_module.dynamic_tree
    monkeypatch.setattr(eagle_module, "dynamic_tree",
                        lambda step, logits, feature, *a: roots.append(feature) or original(
                            step, logits, feature, *a))
    for j in (3, 6):  # the root is the token of slot j + 1, its entry j
        state = DraftState(ids[:, : j + 2], torch.ones_like(ids[:, : j + 2]), 8, round=0,
                           target_hidden=features[:, : j + 1])  # the root is not fed yet
        with torch.no_grad():
            drafter.propose(state)
            h = roots[-1][:, None]  # [1, 1, d]
            torch.testing.assert_close(h[0, 0], passes[0][0, j])
            step = drafter._tree_step(torch.tensor([j + 1]))
            for depth in range(steps - 1):
                gold = int(ids[0, j + 2 + depth])
                token = (draft_ids == gold).nonzero()[0].reshape(1, 1)
                _, h = step(token, h, depth, torch.ones(1, 1, depth, dtype=torch.bool))
                torch.testing.assert_close(h[0, 0], passes[depth + 1][0, j])
        drafter.end()


def _trained(target, samples, out_dir, cfg=CFG):
    torch.manual_seed(0)
    drafter = new_eagle3_drafter(target, draft_vocab_size=48)
    losses = train(drafter, target, samples, cfg, out_dir=out_dir, fit_vocabulary=True)
    return drafter, losses


def _check_lossless(target, path, drafter, ids, extras):
    loaded = EagleDrafter.from_pretrained(path, target, depth=4, top_k=3, total_tokens=10)
    assert torch.equal(loaded.head.d2t, drafter.head.d2t)
    out = generate(target, loaded, ids, max_new_tokens=16, **extras)
    want = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=16, **extras)
    assert torch.equal(out.sequences, want)
    return out.stats


def test_a_tiny_run_trains_saves_loads_and_decodes_exactly(llama, tmp_path):
    samples = [{"input_ids": p} for p in _prompts(6, 0)]
    drafter, losses = _trained(llama, samples, tmp_path / "run")
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses
    stats = _check_lossless(llama, tmp_path / "run", drafter, samples[0]["input_ids"], {})
    # drafts mapped back through d2t are the target's tokens: a trained prompt is mostly accepted
    assert stats.mean_accepted > 1.8, stats


def test_supervise_all_trains_every_position_of_windows_without_answers(llama, tmp_path):
    """`supervise="all"` with no answers (`answer_tokens=0`): plain text windows, every entry
    supervised against the target's distribution, the draft vocabulary from the target's argmax
    at every position; the drafter learns the target's next-but-one token across the windows."""
    windows = [{"input_ids": p} for p in _prompts(4, 5, length=15, low=60, high=120)]
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 40, "answer_tokens": 0, "supervise": "all"})
    drafter, losses = _trained(llama, windows, tmp_path / "run", cfg)
    assert not (tmp_path / "run" / "answers.pt").exists()  # no answers were made
    empty = [torch.zeros(0, dtype=torch.long)] * len(windows)
    want = draft_vocabulary(target_argmax(llama, windows, empty), TEXT["vocab_size"], 48)
    assert torch.equal(drafter.head.d2t, want)
    assert losses[0] > 0 and sum(losses[-5:]) < 0.6 * sum(losses[:5]), losses
    with torch.no_grad():  # pass 0 over every entry of a trained window (prompt_len 0)
        _, parts = eagle3_loss(drafter, llama, windows[0]["input_ids"], 0, {}, 0)
    # 0.5 and 2.99 here; 0.0 and 7.3 when the answers alone are supervised (here: the last entry)
    assert parts["acc0"] > 0.3 and parts["ce0"] < 4.5, parts
    _check_lossless(llama, tmp_path / "run", drafter, windows[1]["input_ids"], {})


def test_supervise_settings_are_checked(llava):
    with pytest.raises(ValueError, match="answer_tokens 0 .* needs supervise='all'"):
        TrainConfig(answer_tokens=0)
    with pytest.raises(ValueError, match="supervise must be 'answers' or 'all', got 'prompt'"):
        TrainConfig(supervise="prompt")
    ids, extras = llava_prompt(images=1, seed=0)
    cfg = TrainConfig(**{**CFG.__dict__, "supervise": "all"})
    with pytest.raises(ValueError, match="supervise 'all' trains EAGLE-3 and DFlash drafters"):
        train(ViSpecDrafter.from_target(llava), llava, [{"input_ids": ids, **extras}], cfg)


def test_a_vlm_target_trains_through_its_images(llava, tmp_path):
    samples = [{"input_ids": ids, **extras}
               for ids, extras in (llava_prompt(images=1, seed=s) for s in range(3))]
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 30, "answer_tokens": 8})
    drafter, losses = _trained(llava, samples, tmp_path / "run", cfg)
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    ids, extras = llava_prompt(images=1, seed=7)  # not trained on
    _check_lossless(llava, tmp_path / "run", drafter, ids, extras)


def test_the_command_line_trains_a_causal_lm_target(llama, tmp_path, capsys):
    llama.save_pretrained(tmp_path / "target")
    torch.save([{"input_ids": p} for p in _prompts(4, 1)], tmp_path / "data.pt")
    main(["--arch", "eagle3", "--target", str(tmp_path / "target"), "--data",
          str(tmp_path / "data.pt"), "--out", str(tmp_path / "run"), "--steps", "3",
          "--answer-tokens", "8", "--draft-vocab-size", "40", "--held-out", "0",
          "--eval-every", "0", "--batched-answers"])
    assert len(torch.load(tmp_path / "run" / "answers.pt", weights_only=True)) == 4
    loaded = EagleDrafter.from_pretrained(tmp_path / "run", llama)
    assert loaded.config.draft_vocab_size == 40 and loaded.config.feature_layers == (1, 2, 3)
    with pytest.raises(SystemExit):
        main(["--arch", "eagle3", "--text-only", "--target", "x", "--data", "y", "--out", "z"])
    assert "--text-only is for --arch vispec" in capsys.readouterr().err
    # a smaller layer than the target's, trained on the windows alone
    main(["--arch", "eagle3", "--target", str(tmp_path / "target"), "--data",
          str(tmp_path / "data.pt"), "--out", str(tmp_path / "small"), "--steps", "2",
          "--answer-tokens", "0", "--supervise", "all", "--draft-vocab-size", "40",
          "--intermediate-size", "24", "--heads", "2", "--kv-heads", "1", "--held-out", "0",
          "--eval-every", "0", "--batched-answers"])
    small = EagleDrafter.from_pretrained(tmp_path / "small", llama).config
    assert (small.intermediate_size, small.num_heads, small.num_kv_heads) == (24, 2, 1)
    assert not (tmp_path / "small" / "answers.pt").exists()
    for flags, message in ((["--heads", "3"], "--heads: the EAGLE-3 layer takes head_dim"),
                           (["--supervise", "all", "--arch", "vispec"],
                            "--supervise, --intermediate-size, --heads and --kv-heads are for "
                            "--arch eagle3")):
        with pytest.raises(SystemExit):
            main(["--arch", "eagle3", "--target", str(tmp_path / "target"), "--data",
                  str(tmp_path / "data.pt"), "--out", str(tmp_path / "bad"), *flags])
        assert message in capsys.readouterr().err


def test_resume_continues_exactly(llama, tmp_path, monkeypatch, interrupt_on_call):
    from mmspec.vision import train as train_mod

    samples = [{"input_ids": p} for p in _prompts(3, 2)]
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 6, "checkpoint_every": 3})

    def fresh():
        torch.manual_seed(0)
        return new_eagle3_drafter(llama, draft_vocab_size=48)

    full = fresh()
    train(full, llama, samples, cfg, out_dir=tmp_path / "full", fit_vocabulary=True)
    original = interrupt_on_call(train_mod, "sample_loss", 5)  # crashes on step 5
    with pytest.raises(KeyboardInterrupt, match=r"cut is at step 3 of 6"):
        train(fresh(), llama, samples, cfg, out_dir=tmp_path / "cut", fit_vocabulary=True)
    monkeypatch.setattr(train_mod, "sample_loss", original)
    resumed = fresh()
    losses = train(resumed, llama, samples, cfg, out_dir=tmp_path / "cut", resume=True,
                   fit_vocabulary=True)
    assert len(losses) == 3  # steps 4-6 only
    a, b = full.head.state_dict(), resumed.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the run's log.jsonl (read by model cards): step 4, made before the kill and again after
    # it, once, with the resumed run's loss, which is the uninterrupted run's
    logged = [[json.loads(line) for line in (tmp_path / run / "log.jsonl").read_text().splitlines()]
              for run in ("full", "cut")]
    assert [r["step"] for r in logged[1]] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in logged[1]] == [r["loss"] for r in logged[0]]
    assert [r["loss"] for r in logged[1][3:]] == losses


def test_batched_answers_of_text_prompts_are_the_target_alone(llama, tmp_path):
    # precompute_answers batches prompts of equal length (no padding); a causal LM's samples
    # carry input_ids alone (the VLM ones add pixel_values)
    from mmspec.vision.train import precompute_answers, target_answers

    samples = [{"input_ids": p} for p in _prompts(5, 3)] + [{"input_ids": _prompts(1, 4, 9)[0]}]
    precompute_answers(llama, samples, 8, tmp_path / "answers.pt")
    cached = target_answers(llama, samples, 8, tmp_path / "answers.pt")
    alone = target_answers(llama, samples, 8, None)  # made one by one, nothing cached
    assert all(torch.equal(a, b) for a, b in zip(cached, alone))
    assert len(torch.load(tmp_path / "answers.pt", weights_only=True)) == 6
