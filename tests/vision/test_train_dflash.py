"""`mmspec.vision.train --arch dflash` (`mmspec/vision/train_dflash.py`): a DFlash drafter trained
for a causal LM target on the shared trainer lowers its loss, saves in the authors' layout (or
the speculators one) that `DFlashDrafter.from_pretrained` reads and decodes token-identically to
`target.generate`; a resumed run equals an uninterrupted one; flags it does not read are
refused in one line."""

import json

import pytest
import torch
from tests.diffusion.test_dflash import tiny_llama, tiny_qwen3
from tests.vision.tiny_vlms import no_eos, tiny_llava

from mmspec import DFlashDrafter, generate
from mmspec.diffusion.dflash_train import new_drafter
from mmspec.vision import train as train_mod
from mmspec.vision.train import TrainConfig, main, train

VOCAB, MASK = 48, 47
CFG = TrainConfig(steps=200, lr=1e-2, warmup_steps=2, answer_tokens=24, eval_every=0,
                  checkpoint_every=0, anchors=8, gamma=4.0)
TARGETS = {"qwen3": tiny_qwen3, "llama": tiny_llama}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def target(request):
    return no_eos(TARGETS[request.param](0, vocab=VOCAB).requires_grad_(False))


def _prompts(n, seed, length=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.tensor([[1]]), torch.randint(3, MASK, (1, length), generator=g)], 1)
            for _ in range(n)]


def _fresh(target):
    torch.manual_seed(0)
    return new_drafter(target, mask_token_id=MASK, layers=1, block_size=4).float()


def _exact(target, drafter, ids):
    out = generate(target, drafter, ids, max_new_tokens=16, do_sample=False)
    want = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=16)
    assert torch.equal(out.sequences, want)
    return out.stats


def test_a_few_steps_lower_the_loss_and_the_saved_drafter_decodes_exactly(target, tmp_path):
    samples = [{"input_ids": p} for p in _prompts(4, 0)]
    drafter = _fresh(target)
    losses = train(drafter, target, samples, CFG, out_dir=tmp_path / "run")
    assert len(losses) == CFG.steps and sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    loaded = DFlashDrafter.from_pretrained(tmp_path / "run", target)
    assert loaded.config.block_size == 4 and loaded.config.mask_token_id == MASK
    state = drafter.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in loaded.model.state_dict().items())
    stats = _exact(target, loaded, samples[0]["input_ids"])  # a trained prompt: drafts accepted
    assert stats.committed / stats.rounds > 1.5, stats
    _exact(target, loaded, _prompts(1, 9)[0])  # not trained on


def test_blocks_are_drawn_where_the_labels_are_supervised(target, monkeypatch):
    from mmspec.diffusion import dflash_train

    seen = []
    original = dflash_train.anchored_loss
    monkeypatch.setattr(dflash_train, "anchored_loss",
                        lambda d, ids, anchors, gamma, soft: seen.append((ids.shape[1], anchors))
                        or soft_seen.append(soft) or original(d, ids, anchors, gamma, soft))
    soft_seen = []
    samples = [{"input_ids": p} for p in _prompts(2, 0)]  # prompts of 9 tokens
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 4})
    train(_fresh(target), target, samples, cfg)
    assert [t for t, _ in seen] == [9 + 24] * 4  # prompt + answer
    assert all(int(a.min()) >= 8 and int(a.max()) <= 33 - 4 for _, a in seen)
    seen.clear()
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 4, "supervise": "all", "answer_tokens": 0})
    train(_fresh(target), target, samples, cfg)  # the windows alone, every token supervised
    assert [t for t, _ in seen] == [9] * 4 and all(int(a.min()) >= 1 for _, a in seen)
    assert any(int(a.min()) < 8 for _, a in seen)
    assert soft_seen == [False] * 8  # the authors' token labels by default
    train(_fresh(target), target, samples, TrainConfig(**{**cfg.__dict__, "soft_labels": True}))
    assert soft_seen[8:] == [True] * 4
    with pytest.raises(ValueError, match="TrainConfig.soft_labels must be a bool, got 1"):
        TrainConfig(soft_labels=1)


def test_a_bf16_target_trains_fp32_master_weights(tmp_path):
    target = no_eos(tiny_qwen3(0, vocab=VOCAB).to(torch.bfloat16).requires_grad_(False))
    drafter = _fresh(target)
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 20, "eval_every": 20, "eval_new_tokens": 8})
    samples = [{"input_ids": p} for p in _prompts(4, 0)]
    losses = train(drafter, target, samples[1:], cfg, held_out=samples[:1],
                   out_dir=tmp_path / "run")  # the held-out tau drafts in fp32 too
    assert sum(losses[-5:]) < sum(losses[:5]) and drafter.model.fc.weight.dtype == torch.float32
    assert "held_out_tau" in (tmp_path / "run" / "log.jsonl").read_text().splitlines()[-1]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["dtype"] == "float32"
    assert DFlashDrafter.from_pretrained(tmp_path / "run", target).model.fc.weight.dtype == \
        torch.bfloat16  # as the target, at decoding time


def test_save_formats_are_checked_before_training(target):
    samples = [{"input_ids": p} for p in _prompts(1, 0)]
    last = new_drafter(target, mask_token_id=MASK, layers=1, block_size=4,
                       target_layer_ids=[2]).float()  # the tiny targets have 3 layers
    with pytest.raises(ValueError, match=r"format: 'speculators' reads the target's last layer"):
        train(last, target, samples, CFG, save_format="speculators")
    with pytest.raises(ValueError, match="save_format must be 'dflash' or 'speculators', got 'x'"):
        train(_fresh(target), target, samples, CFG, save_format="x")


def test_samples_too_short_for_a_block_are_named(capsys):
    target = no_eos(tiny_qwen3(0, vocab=VOCAB).requires_grad_(False))
    samples = [{"input_ids": p} for p in (_prompts(1, 0)[0], _prompts(1, 1, length=3)[0])]
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 2, "supervise": "all", "answer_tokens": 0})
    train(_fresh(target), target, samples, cfg)  # 4 tokens: anchors from 1 leave 3 rows
    assert "1 of 2 samples hold no DFlash block of 4 rows" in capsys.readouterr().err


def test_resume_equals_an_uninterrupted_run(target, tmp_path, monkeypatch, interrupt_on_call):
    samples = [{"input_ids": p} for p in _prompts(3, 2)]
    cfg = TrainConfig(**{**CFG.__dict__, "steps": 6, "checkpoint_every": 3})
    full = _fresh(target)
    train(full, target, samples, cfg, out_dir=tmp_path / "full")
    original = interrupt_on_call(train_mod, "sample_loss", 5)  # killed in step 5
    with pytest.raises(KeyboardInterrupt, match=r"cut is at step 3 of 6"):
        train(_fresh(target), target, samples, cfg, out_dir=tmp_path / "cut")
    monkeypatch.setattr(train_mod, "sample_loss", original)
    resumed = _fresh(target)
    losses = train(resumed, target, samples, cfg, out_dir=tmp_path / "cut", resume=True)
    assert len(losses) == 3  # steps 4-6 only
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = [[json.loads(line)["loss"] for line in (tmp_path / run / "log.jsonl").read_text()
               .splitlines()] for run in ("full", "cut")]
    assert logged[0] == logged[1]
    other = new_drafter(target, mask_token_id=MASK, layers=1, block_size=5).float()
    with pytest.raises(ValueError, match=r"another DFlash drafter \(dflash_config .*'block_size"
                                         r"': 4.* there, .*'block_size': 5"):
        train(other, target, samples, cfg, out_dir=tmp_path / "cut", resume=True)


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("dflash_cli")
    target = no_eos(tiny_qwen3(0, vocab=VOCAB))
    target.save_pretrained(root / "target")
    target.save_pretrained(root / "bare")  # no tokenizer
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, mask_token=f"w{MASK}")
    tokenizer.chat_template = ("{% for m in messages %}w1 {{ m['content'] }} w2{% endfor %}"
                               "{% if add_generation_prompt %} w3{% endif %}")
    tokenizer.save_pretrained(root / "target")
    (root / "prompts.jsonl").write_text('{"prompt": "w5 w6 w7"}\n\n{"prompt": "w8 w9"}\n')
    torch.save([{"input_ids": p} for p in _prompts(5, 1, length=15)], root / "windows.pt")
    return root, target


def _argv(root, out, *extra):
    return ["--arch", "dflash", "--target", str(root / "target"), "--data",
            str(root / "windows.pt"), "--out", str(out), "--lr", "3e-3", "--steps", "2",
            "--draft-layers", "1", "--block-size", "4", "--anchors", "4", *extra]


def test_the_command_line_trains_and_exports_both_layouts(cli_files, tmp_path, capsys):
    root, target = cli_files
    main(_argv(root, tmp_path / "run", "--supervise", "all", "--answer-tokens", "0",
               "--held-out", "0.2", "--eval-every", "2", "--eval-new-tokens", "8"))
    assert "train dflash" in capsys.readouterr().err  # the progress bar
    assert not (tmp_path / "run" / "answers.pt").exists()
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["mask_token_id"] == MASK  # the tokenizer's mask token
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "held_out_tau" in r] == [2]
    ids = _prompts(1, 5)[0]
    _exact(target, DFlashDrafter.from_pretrained(tmp_path / "run", target), ids)
    main(_argv(root, tmp_path / "spec", "--answer-tokens", "8", "--held-out", "0",
               "--eval-every", "0", "--format", "speculators", "--target-layer-ids", "0", "1",
               "--kv-heads", "1", "--intermediate-size", "16", "--mask-token-id", "3",
               "--batched-answers"))
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["mask_token_id"] == 3
    assert config["aux_hidden_state_layer_ids"] == [1, 2]
    loaded = DFlashDrafter.from_pretrained(tmp_path / "spec", target)
    layer = loaded.model.layers[0]
    assert (layer.mlp.up_proj.out_features, layer.self_attn.k_proj.out_features) == (16, 8)
    _exact(target, loaded, ids)


def test_the_command_line_reads_text_prompts_through_the_chat_template(cli_files, tmp_path,
                                                                       capsys):
    root, target = cli_files
    argv = _argv(root, tmp_path / "run", "--held-out", "0", "--eval-every", "0", "--suffix", "",
                 "--answer-tokens", "12")
    main([str(root / "prompts.jsonl") if a.endswith("windows.pt") else a for a in argv])
    answers = torch.load(tmp_path / "run" / "answers.pt", weights_only=True)
    prompts = [[1, 5, 6, 7, 2, 3], [1, 8, 9, 2, 3]]  # "w1 {prompt} w2 w3", ids as named
    want = [target.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p):]
            for p in prompts]
    assert sorted(map(list, answers.values())) == sorted(map(list, want))
    DFlashDrafter.from_pretrained(tmp_path / "run", target)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "w5", "image": "cat.png"}\n')
    with pytest.raises(SystemExit):
        main([str(tmp_path / "bad.jsonl") if a.endswith("windows.pt") else a
              for a in _argv(root, tmp_path / "bad", "--held-out", "0")])
    assert (f'--data {tmp_path / "bad.jsonl"} line 1: expected {{"prompt": text}} (a text-only '
            f"target: no \"image\"), got ['image', 'prompt']") in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--heads", "2"], "--heads: not for --arch dflash"),
    (["--rollout-steps", "2", "--noise", "0"], "--rollout-steps, --noise: not for --arch dflash"),
    (["--draft-vocab-size", "30"], "--draft-vocab-size: not for --arch dflash"),
    (["--target-layer-ids", "0", "3"], r"--target-layer-ids must lie in \[0, 3\) .* got \[0, 3\]"),
    (["--format", "speculators", "--target-layer-ids", "2"],
     r"--format speculators: 'speculators' reads the target's last layer \(2\)"),
    (["--mask-token-id", "48"], r"--mask-token-id must be an id of .* \[0, 48\), got 48"),
    (["--kv-heads", "3"], "--kv-heads must divide the target's 4 attention heads, got 3"),
    (["--block-size", "1"], "--block-size must be >= 2, got 1"),
    (["--gamma", "0"], "--gamma must be a finite number > 0, got 0.0"),
    (["--block-size", "16", "--supervise", "all", "--answer-tokens", "0"],
     r"none of the 5 holds a DFlash block of 16 rows .* longest supervised span is 15 tokens"),
])
def test_command_line_refusals(cli_files, tmp_path, capsys, extra, message):
    root, _ = cli_files
    with pytest.raises(SystemExit):
        main(_argv(root, tmp_path / "run", "--held-out", "0", "--answer-tokens", "4", *extra))
    err = capsys.readouterr().err
    assert __import__("re").search(message, err), err


def _tiny_gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Gemma3Config(
        text_config={"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 8, "sliding_window": 16},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 4, "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=4, image_token_index=299, boi_token_index=297, eoi_token_index=298)
    return Gemma3ForConditionalGeneration(cfg)


def test_the_learning_rate_defaults_per_arch(cli_files, tmp_path, monkeypatch):
    root, _ = cli_files
    seen = []
    monkeypatch.setattr(train_mod, "train", lambda d, t, s, cfg, **kw: seen.append(cfg.lr))
    argv = [a for a in _argv(root, tmp_path / "run", "--held-out", "0", "--answer-tokens", "4")
            if a not in ("--lr", "3e-3")]
    main(argv)
    main([*argv, "--lr", "1e-3"])
    main(["--arch", "eagle3", *argv[2:10], "--answer-tokens", "4", "--held-out", "0",
          "--feature-layers", "0", "1", "2"])
    assert seen == [6e-4, 1e-3, 3e-6]  # SpecForge's DFlash recipe; ViSpec's for the others


def test_command_line_refusals_of_the_target_and_the_other_archs(cli_files, tmp_path, capsys):
    root, _ = cli_files
    argv = _argv(root, tmp_path / "run", "--held-out", "0", "--answer-tokens", "4")
    bare = [str(root / "bare") if a == str(root / "target") else a for a in argv]
    with pytest.raises(SystemExit):
        main(bare)
    assert "--mask-token-id: the target" in capsys.readouterr().err
    for name, vlm in (("llava", tiny_llava()), ("gemma3", _tiny_gemma3())):
        # AutoModelForCausalLM refuses LLaVA's config and loads Gemma 3 with its vision tower
        vlm.save_pretrained(tmp_path / name)
        with pytest.raises(SystemExit):
            main([str(tmp_path / name) if a == str(root / "target") else a for a in argv])
        err = capsys.readouterr().err
        assert "--arch dflash trains drafters for text-only causal LM targets" in err, err
    for arch in ("eagle3", "vispec"):
        with pytest.raises(SystemExit):
            main([*argv[2:], "--arch", arch])
        want = f"--block-size, --draft-layers, --anchors: for --arch dflash, not --arch {arch}"
        assert want in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--target", str(root / "target"), "--data", str(root / "windows.pt"), "--out",
              str(tmp_path / "e3"), "--arch", "eagle3", "--soft-labels"])
    assert "--soft-labels: for --arch dflash, not --arch eagle3" in capsys.readouterr().err
