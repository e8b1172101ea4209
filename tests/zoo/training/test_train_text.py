"""The training script: a killed run resumes to the same weights, and the card carries the figures."""

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file

import mmspec.zoo
from mmspec.interrupt import run_command
from mmspec.zoo.tokenizer import load_tokenizer
from mmspec.zoo.training import train_text
from mmspec.zoo.training.specs import SPECS, TextModelSpec

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
            steps=6, seq_len=32, batch_size=2, warmup=2)


@pytest.fixture
def tiny_zoo(monkeypatch, tmp_path, heldout_stream):
    """The script pointed at tmp_path, a 20k-token stream and tiny specs."""
    monkeypatch.setattr(train_text, "ZOO_DIR", tmp_path / "zoo")
    monkeypatch.setattr(train_text, "token_stream",
                        lambda tok, split, cache_dir: heldout_stream[:20000])
    monkeypatch.setitem(SPECS, "tiny-ar", TextModelSpec("tiny-ar", "causal", **TINY))
    monkeypatch.setitem(SPECS, "tiny-dlm", TextModelSpec("tiny-dlm", "diffusion", **TINY,
                                                         init_from="tiny-ar"))
    return tmp_path


def _run(tmp_path, name, out):
    train_text.main([name, "--out", str(tmp_path / out), "--save-every-s", "0"])
    return load_file(str(tmp_path / "zoo" / name / "model.safetensors"))


def test_a_killed_run_resumes_to_the_same_weights(tiny_zoo, monkeypatch, interrupt_on_call,
                                                  capsys):
    straight = _run(tiny_zoo, "tiny-ar", "a")

    real_loss = interrupt_on_call(train_text, "training_loss", 4)  # Ctrl-C at step 4
    # no timed save comes first: the interrupt itself saves the 3 steps done
    out = tiny_zoo / "b"
    assert run_command(train_text.main, ["tiny-ar", "--out", str(out), "--save-every-s",
                                         "1e9"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: tiny-ar saved at step 3 of 6 in {out / 'tiny-ar' / 'ckpt'}; rerun the "
        f"same command to resume")
    assert torch.load(out / "tiny-ar" / "ckpt" / "trainer.pt", weights_only=True)["step"] == 3
    monkeypatch.setattr(train_text, "training_loss", real_loss)
    resumed = _run(tiny_zoo, "tiny-ar", "b")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_checkpoint_of_another_run_is_not_resumed(tiny_zoo):
    # a rerun with other settings (the README's distillation, after a plain run finished) used
    # to resume the old checkpoint, train nothing and label the old weights with the new flags
    _run(tiny_zoo, "tiny-ar", "a")
    with pytest.raises(SystemExit, match=r"another run.s checkpoint \(--seed 0 there, 7 here; "
                                         r"--lr None there, 0.001 here\)"):
        train_text.main(["tiny-ar", "--out", str(tiny_zoo / "a"), "--lr", "1e-3",
                         "--seed", "7"])


def test_token_streams_are_cached_under_out(tiny_zoo, monkeypatch, heldout_stream):
    # the streams went to out/zoo/data whatever --out said (a run elsewhere wrote into the repo)
    dirs = []
    monkeypatch.setattr(train_text, "token_stream", lambda tok, split, cache_dir: (
        dirs.append(cache_dir) or heldout_stream[:20000]))
    _run(tiny_zoo, "tiny-ar", "a")
    shipped = load_tokenizer(train_text.TOKENIZER_DIR)
    monkeypatch.setattr(train_text, "train_tokenizer", lambda texts: shipped)
    train_text.main(["tokenizer", "--out", str(tiny_zoo / "b")])
    assert dirs[:-1] and set(dirs[:-1]) == {tiny_zoo / "a" / "data"}
    assert dirs[-1] == tiny_zoo / "b" / "data"


def test_cards_carry_measured_figures_and_the_dlm_starts_from_the_ar_model(tiny_zoo):
    ar = _run(tiny_zoo, "tiny-ar", "a")
    _run(tiny_zoo, "tiny-dlm", "a")
    card = json.loads((tiny_zoo / "zoo" / "tiny-dlm" / "card.json").read_text())
    results = card["results"]
    assert card["kind"] == "diffusion-lm" and card["conventions"]["shift"] is True
    assert results["wall_time_s"] > 0 and results["final_train_loss"] > 0
    assert results["heldout_masked_block16_loss"] > 0
    assert card["command"] == "python -m mmspec.zoo.training.train_text tiny-dlm --out " \
        f"{tiny_zoo / 'a'} --save-every-s 0"
    ar_card = json.loads((tiny_zoo / "zoo" / "tiny-ar" / "card.json").read_text())
    assert ar_card["results"]["heldout_loss"] > 0 and ar_card["dtype"] == "float16"
    assert ar["model.embed_tokens.weight"].dtype == torch.float16
    # and the DLM starts from the AR weights the AR run exported, not from a fresh init
    start = train_text.build_model(SPECS["tiny-dlm"], load_tokenizer(train_text.TOKENIZER_DIR),
                                   tiny_zoo / "zoo").state_dict()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.0.mlp.down_proj.weight"):
        assert torch.equal(start[name], ar[name].float()), name


def _committed(monkeypatch, directory):
    """`--init-from REV:DIR` reads `git show REV:DIR/<file>`; here DIR's files on disk."""
    from mmspec.zoo.training import committed

    monkeypatch.setattr(committed, "git_show", lambda ref, name: (directory / name).read_bytes())


def test_init_from_starts_from_the_committed_weights_and_the_card_says_so(tiny_zoo, monkeypatch):
    first = _run(tiny_zoo, "tiny-ar", "a")
    committed = tiny_zoo / "committed"
    (tiny_zoo / "zoo" / "tiny-ar").rename(committed)
    _committed(monkeypatch, committed)
    train_text.main(["tiny-ar", "--init-from", "REV:tiny-ar", "--steps", "1", "--lr", "1e-12",
                     "--out", str(tiny_zoo / "b")])
    again = load_file(str(tiny_zoo / "zoo" / "tiny-ar" / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)  # 1 step at lr 1e-12: no change
    card = json.loads((tiny_zoo / "zoo" / "tiny-ar" / "card.json").read_text())
    assert card["init_from"]["ref"] == "REV:tiny-ar"
    assert card["init_from"]["card"]["command"].endswith("tiny-ar --out " +
                                                         f"{tiny_zoo / 'a'} --save-every-s 0")
    assert card["config"]["steps"] == 1 and card["config"]["lr"] == 1e-12
    with pytest.raises(ValueError, match="--init-from REV:tiny-ar"):  # a different size
        monkeypatch.setitem(SPECS, "tiny-ar", TextModelSpec("tiny-ar", "causal",
                                                            **{**TINY, "hidden_size": 48}))
        train_text.main(["tiny-ar", "--init-from", "REV:tiny-ar", "--out", str(tiny_zoo / "c")])


def test_distill_trains_on_the_targets_continuations(tiny_zoo, monkeypatch):
    _run(tiny_zoo, "tiny-ar", "a")
    monkeypatch.setattr(train_text, "DISTILL_TARGET", "tiny-ar")
    monkeypatch.setattr(train_text, "DISTILL_HELDOUT", 4)
    seen = []
    real = train_text.continuation_loss

    def spy(objective, model, tokens, prefix_len, *rest):
        seen.append(tokens.clone())
        return real(objective, model, tokens, prefix_len, *rest)

    monkeypatch.setattr(train_text, "continuation_loss", spy)
    train_text.main(["tiny-dlm", "--distill", "6", "--distill-prefix", "24", "--distill-new",
                     "8", "--out", str(tiny_zoo / "d"), "--save-every-s", "0"])
    cached = list((tiny_zoo / "d" / "distill").glob("continuations-*x24+8-s0.pt"))
    assert len(cached) == 2  # train (6) and held out (4)
    train = max((torch.load(p) for p in cached), key=len).long()
    assert train.shape == (6, 32)
    assert len(seen) == TINY["steps"] and all(
        any(torch.equal(row, t) for t in train) for batch in seen for row in batch)
    card = json.loads((tiny_zoo / "zoo" / "tiny-dlm" / "card.json").read_text())
    assert "6 windows of 24 train-split tokens" in card["distill"]["data"]
    assert card["results"]["heldout_target_block8_loss"] > 0  # 8 new tokens: a block of 8


def test_a_bad_init_from_ref_names_itself(capsys):
    from mmspec.zoo.training.committed import git_show

    with pytest.raises(ValueError, match="init_from 'HEAD:assets/zoo/no-such-entry': git cannot"):
        git_show("HEAD:assets/zoo/no-such-entry", "card.json")
    with pytest.raises(ValueError, match="must be '<git rev>:<entry dir>'"):
        git_show("assets/zoo/text-dlm", "card.json")
    with pytest.raises(SystemExit):
        train_text.main(["text-dlm", "--lr", "0"])
    assert "--lr must be > 0, got 0.0" in capsys.readouterr().err


def test_zero_steps_are_refused_before_anything_is_written(tiny_zoo, capsys):
    # --steps 0 reached the export, which wrote the weights and then divided by zero
    with pytest.raises(SystemExit):
        train_text.main(["tiny-ar", "--steps", "0", "--out", str(tiny_zoo / "a")])
    assert "--steps: must be an int >= 1, got 0" in capsys.readouterr().err
    assert not (tiny_zoo / "zoo").exists()


def _entry_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_checkpoint_past_steps_is_refused(tiny_zoo):
    # a rerun with a smaller --steps saved the 6-step checkpoint as step 3 and shipped its weights
    # under a card saying 3 steps; a later 6-step run then trained steps 3..5 a second time
    _run(tiny_zoo, "tiny-ar", "a")
    entry = _entry_bytes(tiny_zoo / "zoo" / "tiny-ar")
    with pytest.raises(SystemExit, match=r"--steps 3: .*ckpt is already at step 6; .*pass "
                                         r"--steps 6 or more"):
        train_text.main(["tiny-ar", "--out", str(tiny_zoo / "a"), "--steps", "3"])
    assert torch.load(tiny_zoo / "a" / "tiny-ar" / "ckpt" / "trainer.pt",
                      weights_only=True)["step"] == 6
    assert _entry_bytes(tiny_zoo / "zoo" / "tiny-ar") == entry
    train_text.main(["tiny-ar", "--out", str(tiny_zoo / "a"), "--steps", "6"])  # same: exports


def test_an_export_killed_while_evaluating_keeps_the_previous_entry(tiny_zoo, monkeypatch):
    # the weights used to be written into the entry before the evaluation, the card after it:
    # a kill in between shipped the new weights under the old card
    _run(tiny_zoo, "tiny-ar", "a")
    folder = tiny_zoo / "zoo" / "tiny-ar"
    card = json.loads((folder / "card.json").read_text())
    (folder / "card.json").write_text(json.dumps({**card, "attempts": ["an earlier recipe"]}))
    before = _entry_bytes(folder)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    real_evaluate = train_text.evaluate
    monkeypatch.setattr(train_text, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        train_text.main(["tiny-ar", "--out", str(tiny_zoo / "b"), "--seed", "1"])
    assert _entry_bytes(folder) == before
    assert sorted(p.name for p in (tiny_zoo / "zoo").iterdir()) == ["tiny-ar"]  # nothing staged
    assert mmspec.zoo.available(tiny_zoo / "zoo") == ["tiny-ar"]

    monkeypatch.setattr(train_text, "evaluate", real_evaluate)
    train_text.main(["tiny-ar", "--out", str(tiny_zoo / "b"), "--seed", "1"])
    new = json.loads((folder / "card.json").read_text())
    assert new["results"]["seed"] == 1 and new["attempts"] == ["an earlier recipe"]
    assert _entry_bytes(folder)["model.safetensors"] != before["model.safetensors"]
    assert sorted(p.name for p in (tiny_zoo / "zoo").iterdir()) == ["tiny-ar"]


def test_staged_export_swaps_whole_folders_and_recovers_a_kill_between_renames(tmp_path):
    entry = tmp_path / "x"
    with train_text.staged_export(entry) as stage:
        (stage / "a").write_text("1")
        assert not entry.exists()
    assert _entry_bytes(entry) == {"a": b"1"}
    with pytest.raises(RuntimeError):
        with train_text.staged_export(entry) as stage:
            (stage / "a").write_text("2")
            raise RuntimeError
    assert _entry_bytes(entry) == {"a": b"1"} and sorted(tmp_path.iterdir()) == [entry]
    with train_text.staged_export(entry) as stage:
        (stage / "b").write_text("3")
    assert _entry_bytes(entry) == {"b": b"3"}  # no file of the previous export survives
    # killed after moving the old export aside, before moving the new one in
    work = tmp_path / ".x.export"
    (work / "new").mkdir(parents=True)
    entry.rename(work / "old")
    with train_text.staged_export(entry) as stage:
        assert _entry_bytes(entry) == {"b": b"3"}  # the previous export is back meanwhile
        (stage / "c").write_text("4")
    assert _entry_bytes(entry) == {"c": b"4"} and sorted(tmp_path.iterdir()) == [entry]


def test_the_card_states_the_distillation_objective_it_trained(tiny_zoo, monkeypatch):
    # the card said "half the rows keep a random clean prefix" for any DLM run; a --distill run
    # keeps the whole prefix clean in every row, and share 1.0 makes every row a t=1 block
    _run(tiny_zoo, "tiny-ar", "a")
    monkeypatch.setattr(train_text, "DISTILL_TARGET", "tiny-ar")
    monkeypatch.setattr(train_text, "DISTILL_HELDOUT", 4)
    train_text.main(["tiny-dlm", "--distill", "4", "--distill-prefix", "24", "--distill-new", "8",
                     "--distill-block-share", "1.0", "--out", str(tiny_zoo / "a")])
    objective = json.loads((tiny_zoo / "zoo" / "tiny-dlm" / "card.json").read_text())["objective"]
    assert "whole 24-token corpus prefix clean in every row" in objective
    assert "every row: a block of masks from a random start" in objective and "t=1" in objective
    assert "half the rows" not in objective and "U(0,1]" not in objective

    def args(**kw):
        return argparse.Namespace(**{"distill": 4, "distill_prefix": 24, "distill_new": 8,
                                     "distill_block_share": 0.0, **kw})

    dlm, ar = SPECS["tiny-dlm"], SPECS["tiny-ar"]
    assert "a share 0.25 of the rows: a block" in train_text._objective(
        dlm, args(distill_block_share=0.25))
    assert "every row: t~U(0,1]" in train_text._objective(dlm, args())
    assert "8 target tokens only" in train_text._objective(ar, args())
    assert "half the rows" in train_text._objective(dlm, args(distill=0))


def test_assets_puts_the_entry_in_another_folder_and_reads_init_from_there(tiny_zoo):
    # the README's "dlm_compare.py --candidate DIR" needs a retrained DLM outside assets/zoo
    candidate = tiny_zoo / "candidate"
    train_text.main(["tiny-ar", "--out", str(tiny_zoo / "a"), "--assets", str(candidate)])
    assert (candidate / "tiny-ar" / "model.safetensors").is_file()
    assert not (tiny_zoo / "zoo").exists()  # the shipped folder is not touched
    train_text.main(["tiny-dlm", "--out", str(tiny_zoo / "a"), "--assets", str(candidate)])
    assert json.loads((candidate / "tiny-dlm" / "card.json").read_text())["kind"] == "diffusion-lm"
    with pytest.raises(FileNotFoundError, match=r"zoo/tiny-ar/model.safetensors not found; "
                                                r"train tiny-ar first \(into the same --assets"):
        train_text.main(["tiny-dlm", "--out", str(tiny_zoo / "b")])  # default: the shipped zoo


def test_the_tokenizer_goes_to_assets_staged_and_another_one_is_not_overwritten(tiny_zoo,
                                                                                monkeypatch):
    shipped = load_tokenizer(train_text.TOKENIZER_DIR)
    monkeypatch.setattr(train_text, "train_tokenizer", lambda texts: shipped)
    assets = tiny_zoo / "zoo"
    assert train_text.tokenizer_dir(assets) == train_text.TOKENIZER_DIR  # none there yet
    train_text.main(["tokenizer"])
    out = assets / "text-tokenizer"
    assert train_text.tokenizer_dir(assets) == out
    assert load_tokenizer(out).get_vocab() == shipped.get_vocab()
    assert json.loads((out / "card.json").read_text())["vocab_size"] == len(shipped)
    assert sorted(p.name for p in assets.iterdir()) == ["text-tokenizer"]  # no staging left
    train_text.main(["tokenizer"])  # the same tokenizer again: rewritten

    other = load_tokenizer(out)
    other.add_tokens(["<extra>"])
    other.save_pretrained(str(out))
    before = (out / "tokenizer.json").read_bytes()
    with pytest.raises(SystemExit, match=r"text-tokenizer holds another tokenizer \(4097 tokens; "
                                         r"this corpus gives 4096"):
        train_text.main(["tokenizer"])
    assert (out / "tokenizer.json").read_bytes() == before


def test_a_checkpoint_of_the_old_one_file_format_is_refused_in_one_line(tiny_zoo):
    # checkpoints are accelerate state folders now: an earlier mmspec's ckpt.pt cannot resume
    old = tiny_zoo / "a" / "tiny-ar" / "ckpt.pt"
    old.parent.mkdir(parents=True)
    torch.save({"model": {}, "optimizer": {}, "step": 2, "elapsed": 1.0, "losses": [1.0, 1.0]},
               old)
    with pytest.raises(SystemExit, match=r"ckpt.pt is a checkpoint of an earlier mmspec .*"
                                         r"cannot be resumed; finish it with the mmspec that "
                                         r"wrote it, or delete it to start over$"):
        train_text.main(["tiny-ar", "--out", str(tiny_zoo / "a")])
