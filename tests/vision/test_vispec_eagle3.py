"""The ViSpec variant with EAGLE-3's pieces: several target layers' features fused by `fuse`
(`ViSpecConfig.feature_layers`) and the training-time test (`train.tree_passes`). The passes equal
the drafter's own tree forward, the engine hands over the named layers, and a trained, saved and
reloaded drafter decodes exactly as `target.generate`."""

import json

import pytest
import torch
from tiny_vlms import llava_prompt, qwen_prompt, reference

from mmspec import generate
from mmspec.decoding.draft import DraftState
from mmspec.vision import ViSpecDrafter
from mmspec.vision import drafter as drafter_module
from mmspec.vision.config import ViSpecConfig
from mmspec.vision.train import TrainConfig, main, sample_loss, target_answers, train, tree_passes

LAYERS = (0, 1, 2)  # the tiny targets have 2 layers: hidden_states 0 (embeddings) .. 2 (normed)
CFG = TrainConfig(steps=40, lr=3e-3, warmup_steps=4, noise=0.0, answer_tokens=24, eval_every=0,
                  checkpoint_every=0, rollout_steps=2, training_time_test=True)


def _prompt(model):
    return llava_prompt(images=2, seed=7) if model == "llava" else qwen_prompt(
        grids=((1, 4, 4), (1, 8, 4)), seed=7)


def _fresh(target, layers=LAYERS, seed=0):
    torch.manual_seed(seed)
    drafter = ViSpecDrafter.from_target(target, feature_layers=layers)
    with torch.no_grad():  # a sharper head than the init's: drafts that differ by position
        for p in drafter.head.parameters():
            p.mul_(3.0)
    return drafter


def _sequence(target, ids, extras, new=10):
    """The target's greedy continuation of ids, and extras grown to its length."""
    full = reference(target, ids, extras, new)
    grown = {k: torch.cat([v, v.new_zeros(1, full.shape[1] - v.shape[1])], 1)
             if k == "mm_token_type_ids" else v for k, v in extras.items()}
    return full, grown


@pytest.mark.parametrize("model", ["llava", "qwen"])
def test_tree_passes_are_the_drafters_tree_forward(request, model, monkeypatch):
    """Pass i at the entry of pair j is the tree node at depth i below the root of slot j + 1
    along the gold tokens, as `propose` and its tree step compute it at decoding time (M-RoPE
    positions included)."""
    target = request.getfixturevalue(model)
    drafter = _fresh(target)
    full, extras = _sequence(target, *_prompt(model))
    steps = 3
    with torch.no_grad():
        hs = target(input_ids=full, output_hidden_states=True, **extras).hidden_states
        raw = torch.cat([hs[i] for i in LAYERS], -1)  # [1, T, 3d]
        positions = drafter.adapter.prompt_positions(full, torch.ones_like(full), extras)
        entries = drafter.sequence_entries(full, torch.ones_like(full, dtype=torch.bool),
                                           drafter.target_features(raw[:, :-1]),
                                           positions[..., :-1], extras)
        passes = tree_passes(drafter, entries, full, steps)
    roots = []
    original = drafter_module.dynamic_tree
    monkeypatch.setattr(drafter_module, "dynamic_tree",
                        lambda step, logits, feature, *a: roots.append((step, feature))
                        or original(step, logits, feature, *a))
    prompt_len = _prompt(model)[0].shape[1]
    for j in (prompt_len - 1, prompt_len + 2):  # the root is the token of slot j + 1
        cut = {k: v[:, : j + 1] if k == "mm_token_type_ids" else v for k, v in extras.items()}
        state = DraftState(full[:, : j + 2], torch.ones_like(full[:, : j + 2]), 8, round=0,
                           target_hidden=raw[:, : j + 1], extras=cut,
                           position_ids=positions[..., j + 1: j + 2])
        entry = int((entries.pair_index[0] == j).nonzero())
        with torch.no_grad():
            drafter.propose(state)
            step, h = roots[-1]
            h = h[:, None]  # [1, 1, d]
            torch.testing.assert_close(h[0, 0], passes[0][0, entry])
            step = drafter._tree_step()  # a fresh step: no tree nodes yet
            for depth in range(steps - 1):
                token = full[:, j + 2 + depth].reshape(1, 1)
                _, h = step(token, h, depth, torch.ones(1, 1, depth, dtype=torch.bool))
                torch.testing.assert_close(h[0, 0], passes[depth + 1][0, entry], atol=1e-3,
                                           rtol=1e-4)  # another summation order
        drafter.end()


@pytest.mark.parametrize("model", ["llava", "qwen"])
def test_generate_hands_over_the_named_layers_and_stays_exact(request, model, monkeypatch):
    target = request.getfixturevalue(model)
    drafter = _fresh(target)
    assert drafter.target_hidden_layers == LAYERS
    ids, extras = _prompt(model)
    seen = []
    propose = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda state: seen.append(state.target_hidden)
                        or propose(state))
    out = generate(target, drafter, ids, max_new_tokens=16, **extras)
    assert torch.equal(out.sequences, reference(target, ids, extras, 16))
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True, **extras).hidden_states
    want = torch.cat([hs[i] for i in LAYERS], -1)  # the prompt's features at round 0
    torch.testing.assert_close(seen[0], want, atol=1e-5, rtol=1e-4)


def test_the_loss_weighs_each_pass_as_eagle3(llava):
    ids, extras = llava_prompt(images=1, seed=0)
    sample = {"input_ids": ids, **extras}
    answer = target_answers(llava, [sample], 16, None)[0]
    cfg = TrainConfig(ce_weight=0.1, rollout_steps=2, noise=0.0, training_time_test=True)
    loss, parts = sample_loss(_fresh(llava), llava, sample, answer, cfg)
    assert set(parts) == {f"{t}{r}" for t in ("feature", "tv", "rank", "ce") for r in range(3)}
    assert parts["tv1"] != parts["tv0"] and parts["tv2"] != parts["tv1"]
    weights = {"feature": 1.0, "tv": 10.0, "rank": 0.1, "ce": 0.1}
    want = sum(0.8 ** int(k[-1]) * weights[k[:-1]] * v for k, v in parts.items())
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)


def test_a_trained_multi_layer_drafter_saves_loads_and_decodes_exactly(llava, tmp_path):
    prompts = [llava_prompt(images=n, seed=s) for n, s in [(1, 7), (2, 7), (1, 8)]]
    samples = [{"input_ids": ids, **extras} for ids, extras in prompts]
    drafter = _fresh(llava)
    with torch.no_grad():
        before = sum(float(sample_loss(drafter, llava, s, a, CFG)[0]) for s, a in zip(
            samples, target_answers(llava, samples, CFG.answer_tokens, None)))
    train(drafter, llava, samples, CFG)
    with torch.no_grad():
        after = sum(float(sample_loss(drafter, llava, s, a, CFG)[0]) for s, a in zip(
            samples, target_answers(llava, samples, CFG.answer_tokens, None)))
    assert after < 0.8 * before, (before, after)
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "vispec_config.json").read_text())["feature_layers"] == [0, 1, 2]
    loaded = ViSpecDrafter.from_pretrained(tmp_path, llava, dtype=torch.float32)
    assert torch.equal(loaded.head.fuse.weight, drafter.head.fuse.weight)
    ids, extras = prompts[1]
    out = generate(llava, loaded, ids, max_new_tokens=24, **extras)
    assert torch.equal(out.sequences, reference(llava, ids, extras, 24))
    assert out.stats.accepted > 0


@pytest.mark.parametrize("layers, message", [
    ((0, 0, 1), "distinct"), ((0, -1, 2), ">= 0"), ([True, 1, 2], "distinct")])
def test_bad_feature_layers_are_refused(layers, message):
    with pytest.raises(ValueError, match=f"feature_layers.*{message}"):
        ViSpecConfig(hidden_size=8, num_heads=2, head_dim=4, intermediate_size=8, vocab_size=8,
                     feature_layers=layers)


def test_a_layer_the_target_lacks_is_refused(llava):
    with pytest.raises(ValueError, match=r"feature_layers: .* 2 layers has hidden_states ids "
                                         r"0\.\.2, got \[0, 1, 3\]"):
        ViSpecDrafter.from_target(llava, feature_layers=(0, 1, 3))


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory, llava):
    root = tmp_path_factory.mktemp("cli")
    llava.save_pretrained(root / "target")
    samples = [{"input_ids": ids, **extras}
               for ids, extras in (llava_prompt(images=1, seed=s) for s in range(3))]
    torch.save(samples, root / "data.pt")
    return root


def test_the_command_line_trains_the_variant(cli_files, tmp_path, capsys):
    out = tmp_path / "run"
    main(["--target", str(cli_files / "target"), "--data", str(cli_files / "data.pt"),
          "--out", str(out), "--steps", "2", "--answer-tokens", "8", "--eval-every", "0",
          "--held-out", "0", "--feature-layers", "0", "1", "2", "--training-time-test",
          "--rollout-steps", "2"])
    config = json.loads((out / "checkpoint" / "vispec_config.json").read_text())
    assert config["feature_layers"] == [0, 1, 2]


@pytest.mark.parametrize("argv, message", [
    (["--arch", "eagle3", "--multi-layer"], "--multi-layer is for --arch vispec"),
    (["--arch", "eagle3", "--training-time-test"], "--training-time-test is for --arch vispec"),
    (["--feature-layers", "0", "1", "9"], "--feature-layers: .* got \\[0, 1, 9\\]"),
    (["--multi-layer", "--feature-layers", "0", "1", "2"], "give it or --feature-layers"),
    (["--multi-layer"], "a target of 2 layers has too few"),  # EAGLE-3's layers need 3 or more
])
def test_command_line_mistakes(cli_files, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        main(["--target", str(cli_files / "target"), "--data", str(cli_files / "data.pt"),
              "--out", str(tmp_path / "run"), "--steps", "2", "--answer-tokens", "8", *argv])
    assert __import__("re").search(message, capsys.readouterr().err)
