"""The VLM zoo: entries load offline, the target sees colours, its held-out loss matches its card,
ViSpec is lossless on it, scenes are deterministic, and the training script resumes."""

import json
import shlex
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM, LlavaForConditionalGeneration, LlavaProcessor

import mmspec
import mmspec.zoo
from mmspec.interrupt import run_command
from mmspec.vision import ViSpecDrafter
from mmspec.zoo.paths import ZOO_DIR
from mmspec.zoo.training import train_vlm
from tests.zoo.eagle3_entry import load_bound_eagle3
from mmspec.zoo.scenes import (
    HELDOUT_START,
    NO_SHAPE,
    PATCH_COLOURS,
    SHAPES,
    colour_question,
    describe,
    make_scene,
    patch_labels,
    question_answer,
    render,
)
from mmspec.zoo.training.experiments import EXPERIMENTS
from mmspec.zoo.training.vlm_data import image_word_loss, scene_batch, train_seeds, word_ids
from mmspec.zoo.training.vlm_specs import SPECS, DrafterSpec, VLMSpec
from mmspec.zoo.vlm_processor import load_processor

VLM = ("vlm-assistant", "vlm-eagle3", "vlm-target", "vlm-text-drafter", "vlm-vispec")
FRESH = range(HELDOUT_START + 20_000, HELDOUT_START + 20_006)  # in no card's slice


@pytest.fixture(scope="module")
def target():
    return mmspec.zoo.load("vlm-target")


def test_vlm_entries_are_listed_and_load_offline(monkeypatch, target):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert set(VLM) <= set(mmspec.zoo.available())
    assert isinstance(target.model, LlavaForConditionalGeneration)
    assert isinstance(target.tokenizer, LlavaProcessor)
    assert set(target.drafters) == {"vlm-vispec", "vlm-text-drafter", "vlm-eagle3",
                                    "vlm-assistant"}
    assert "sample_prompt" in target.card and (ZOO_DIR / "vlm-target" / "sample.png").is_file()
    assert isinstance(mmspec.zoo.load("vlm-assistant").model, LlamaForCausalLM)
    alone = mmspec.zoo.load("vlm-vispec")  # loads the card's target itself
    assert isinstance(alone.model, ViSpecDrafter) and not alone.model.config.text_only
    bound = mmspec.zoo.load("vlm-text-drafter", target=target.model)
    assert bound.model.config.text_only and bound.model.adapter.target is target.model


def test_the_eagle3_entry_is_an_eagle_drafter_on_the_targets_embedding(target):
    bound = load_bound_eagle3("vlm-eagle3", target.model)
    assert isinstance(bound.tokenizer, LlavaProcessor) and bound.card["target"] == "vlm-target"


def test_only_drafters_take_a_target(target):
    with pytest.raises(ValueError, match="target: only ViSpec, EAGLE-3 and DFlash drafters"):
        mmspec.zoo.load("vlm-assistant", target=target.model)


def test_vlm_zoo_fits_its_budget():
    total = sum(f.stat().st_size for name in (*VLM, "vlm-processor")
                for f in (ZOO_DIR / name).iterdir())
    assert total <= 20e6, f"VLM zoo takes {total / 1e6:.1f} MB, budget 20 MB"


def _answer(target, seed: int, question: str, new: int = 24) -> str:
    inputs = mmspec.zoo.vlm_inputs(target.tokenizer, render(seed), question)
    out = target.model.generate(**inputs, do_sample=False, max_new_tokens=new)
    return target.tokenizer.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                             skip_special_tokens=True).strip()


def test_the_target_names_the_background_colour_of_fresh_held_out_images(target):
    """The image path works: a blind model gets 1 in 4 right."""
    right = sum(make_scene(seed).background in _answer(target, seed, "What colour is the background?")
                for seed in FRESH)
    assert right >= len(FRESH) - 2, f"{right}/{len(FRESH)} backgrounds right"


ONE_SHAPE = [s for s in range(HELDOUT_START + 20_000, HELDOUT_START + 20_100)
             if len(make_scene(s).shapes) == 1][:6]  # fresh: in no card's slice


def test_the_target_names_the_colour_of_the_shape_in_fresh_one_shape_images(target):
    assert len(ONE_SHAPE) == 6
    answers = []
    for seed in ONE_SHAPE:
        question, reference = colour_question(make_scene(seed))
        answers.append((_answer(target, seed, question), reference))
    right = sum(got == reference for got, reference in answers)
    assert right >= len(ONE_SHAPE) - 1, f"{right}/{len(ONE_SHAPE)} colour answers right: {answers}"


MULTI = [s for s in range(HELDOUT_START + 30_000, HELDOUT_START + 30_100)
         if len(make_scene(s).shapes) > 1][:40]  # fresh too; 22 of them ask a kind seen once


@pytest.mark.xfail(strict=True, reason="the shipped vlm-target names colours where the scene has "
                                       "one shape or only shapes of the asked kind, but not which "
                                       "of several kinds is asked: 11/40 here, 3/22 where the "
                                       "asked kind is unique (card: heldout_colour_accuracy "
                                       "0.375); remove this mark once a retrained target passes")
def test_the_target_names_colours_in_fresh_multi_shape_images(target):
    assert len(MULTI) == 40
    right = 0
    for seed in MULTI:
        question, reference = colour_question(make_scene(seed))
        right += _answer(target, seed, question) == reference
    assert right >= 0.9 * len(MULTI), f"{right}/{len(MULTI)} colour answers right"


def test_held_out_loss_matches_the_card(target):
    loss = train_vlm.heldout_loss(target.model, target.tokenizer, True, train_vlm.HELDOUT_SCENES)
    assert loss <= target.card["results"]["heldout_loss"] + 0.02


@pytest.mark.parametrize("name", ["vlm-vispec", "vlm-text-drafter", "vlm-eagle3"])
def test_vispec_greedy_equals_the_target_alone(target, name):
    drafter = mmspec.zoo.load(name, target=target.model).model
    inputs = mmspec.zoo.vlm_inputs(target.tokenizer, render(FRESH[0]), "Describe the image.")
    ref = target.model.generate(**inputs, do_sample=False, max_new_tokens=48)
    out = mmspec.generate(target.model, drafter, max_new_tokens=48, **inputs)
    assert torch.equal(out.sequences, ref)
    assert out.stats.mean_accepted > 1.5  # trained drafts get accepted, not merely verified


@pytest.mark.parametrize("name", ["vlm-vispec", "vlm-text-drafter"])
def test_held_out_tau_matches_the_card(target, name):
    # as export_drafter measures it: the saved tree, the card's held-out slice
    from mmspec.vision.train import held_out_tau
    from mmspec.zoo.cards import read_card
    from mmspec.zoo.training.vlm_data import heldout_seeds

    card = read_card(ZOO_DIR / name)
    drafter = ViSpecDrafter.from_pretrained(ZOO_DIR / name, target.model).eval()
    held = train_vlm.drafter_samples(target.tokenizer, heldout_seeds(card["config"]["held_out"]))
    tau = held_out_tau(drafter, target.model, held, card["config"]["eval_new_tokens"])
    assert abs(tau - card["results"]["heldout_tau"]) < 0.01


def test_scenes_are_deterministic_per_seed():
    assert render(3).tobytes() == render(3).tobytes()
    assert describe(make_scene(3)) == describe(make_scene(3))
    assert render(3).tobytes() != render(4).tobytes()
    assert all(s < HELDOUT_START for s in train_seeds(0, 64) + train_seeds(999, 64))
    assert render(np.int64(3)).tobytes() == render(3).tobytes()
    # random.Random took them: None drew a new scene per call, -3 seeded the scene of 3
    for seed in (None, "3", 1.5, 3.0, True):
        with pytest.raises(TypeError, match=r"seed: expected an int .*pure function"):
            render(seed)
    with pytest.raises(ValueError, match="seed: expected an int >= 0, got -3"):
        render(-3)


def test_vlm_inputs_take_a_pil_image_a_path_or_a_tensor_alike(target, tmp_path):
    # a path or a tensor failed with "'str' object has no attribute 'convert'"
    image = render(FRESH[0])
    image.save(tmp_path / "scene.png")
    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1)  # uint8 [3, H, W]

    def pixels(image):
        return mmspec.zoo.vlm_inputs(target.tokenizer, image, "Describe it.")["pixel_values"]

    reference = pixels(image)
    for same in (tmp_path / "scene.png", str(tmp_path / "scene.png"), tensor, tensor / 255):
        assert torch.equal(pixels(same), reference)
    assert not torch.equal(pixels(render(FRESH[1])), reference)
    (tmp_path / "notes.txt").write_text("not a picture")
    for bad, error, message in [
            (None, TypeError, "image: expected a PIL image, a path to an image file or a "
                              r"\[3, H, W\] tensor, got NoneType"),
            (tensor[None], ValueError, r"got shape \[1, 3, 64, 64\]"),
            (tensor.float(), ValueError, r"float tensor must hold values in \[0, 1\], got "
                                         r"\[\d+.0, 255.0\]"),
            (tensor.int(), ValueError, "expected a uint8 or float tensor, got torch.int32"),
            (tmp_path / "gone.png", FileNotFoundError, "image '.*gone.png' does not exist"),
            (tmp_path / "notes.txt", ValueError, "image '.*notes.txt' is not an image file")]:
        with pytest.raises(error, match=message):
            pixels(bad)


def test_the_vlm_preset_names_an_image_file_it_cannot_read(tmp_path):
    from mmspec.zoo.presets import vlm_preset

    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(ValueError, match="image '.*notes.txt' is not an image file Pillow"):
        vlm_preset(tmp_path / "notes.txt")  # was PIL.UnidentifiedImageError


MICRO = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
             vision_hidden=32, vision_layers=1, batch_size=2, steps=4, warmup=1)


def _run(tmp_path, out, *extra):
    train_vlm.main(["vlm-micro", "--out", str(tmp_path / out), "--zoo", str(tmp_path / "zoo"),
                    "--save-every-s", "0", *extra])
    return load_file(str(tmp_path / "zoo" / "vlm-micro" / "model.safetensors"))


def test_the_training_script_resumes_to_the_same_weights(tmp_path, monkeypatch,
                                                         interrupt_on_call, capsys):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    straight = _run(tmp_path, "a")

    real_loss = interrupt_on_call(train_vlm, "answer_loss", 3)  # Ctrl-C at step 3
    argv = ["vlm-micro", "--out", str(tmp_path / "b"), "--zoo", str(tmp_path / "zoo"),
            "--save-every-s", "1e9"]
    assert run_command(train_vlm.main, argv) == 130  # no timed save: the interrupt saves
    ckpt = tmp_path / "b" / "vlm-micro" / "ckpt"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: vlm-micro saved at step 2 of 4 in {ckpt}; resume: python -m "
        f"mmspec.zoo.training.train_vlm {shlex.join(argv)} --resume")
    assert torch.load(ckpt / "trainer.pt", weights_only=True)["step"] == 2
    monkeypatch.setattr(train_vlm, "answer_loss", real_loss)
    resumed = _run(tmp_path, "b", "--resume")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    card = json.loads((tmp_path / "zoo" / "vlm-micro" / "card.json").read_text())
    assert card["kind"] == "vlm" and card["results"]["heldout_loss"] > 0
    assert card["results"]["wall_time_s"] > 0 and card["sample_prompt"]
    assert all(v.dtype == torch.float16 for v in straight.values())


def _micro(monkeypatch, **changes):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **{**MICRO, **changes}))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)


def _entry_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_checkpoint_of_another_seed_or_past_steps_is_not_resumed(tmp_path, monkeypatch):
    # both were resumed: a 4-step checkpoint shipped under a card saying 2 steps; seed 0's
    # batches trained on under a card saying seed 7
    _micro(monkeypatch)
    _run(tmp_path, "a")
    entry = _entry_bytes(tmp_path / "zoo" / "vlm-micro")
    with pytest.raises(SystemExit, match=r"--steps 2: .*ckpt is already at step 4; .*pass "
                                         r"--steps 4 or more"):
        _run(tmp_path, "a", "--resume", "--steps", "2")
    with pytest.raises(SystemExit, match=r"ckpt is another run.s checkpoint \(--seed 0 there, "
                                         r"7 here\): .*resume with its settings"):
        _run(tmp_path, "a", "--resume", "--seed", "7")
    assert _entry_bytes(tmp_path / "zoo" / "vlm-micro") == entry
    assert torch.load(tmp_path / "a" / "vlm-micro" / "ckpt" / "trainer.pt",
                      weights_only=True)["step"] == 4
    _run(tmp_path, "a", "--resume")  # its own settings: resumed (and exported again)


def test_an_export_killed_while_evaluating_keeps_the_previous_entry(tmp_path, monkeypatch):
    # the weights were written into the entry before the evaluation, the card after it: a kill
    # in between shipped the new weights under the old card
    _micro(monkeypatch)
    _run(tmp_path, "a")
    folder = tmp_path / "zoo" / "vlm-micro"
    card = json.loads((folder / "card.json").read_text())
    (folder / "card.json").write_text(json.dumps({**card, "attempts": ["an earlier recipe"]}))
    before = _entry_bytes(folder)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    real = train_vlm.heldout_loss
    monkeypatch.setattr(train_vlm, "heldout_loss", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "b", "--seed", "1")
    assert _entry_bytes(folder) == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["vlm-micro"]  # nothing staged
    monkeypatch.setattr(train_vlm, "heldout_loss", real)
    _run(tmp_path, "c", "--seed", "1")
    new = json.loads((folder / "card.json").read_text())
    assert new["results"]["seed"] == 1 and new["attempts"] == ["an earlier recipe"]
    assert _entry_bytes(folder)["model.safetensors"] != before["model.safetensors"]
    assert (folder / "sample.png").is_file()


def _processor_with_extra_token(folder):
    processor = load_processor(train_vlm.PROCESSOR_DIR)
    processor.tokenizer.add_tokens(["<extra>"])
    processor.save_pretrained(str(folder))
    return processor


def test_the_processor_goes_to_zoo_staged_and_another_one_is_not_overwritten(tmp_path,
                                                                              monkeypatch):
    # `tokenizer --zoo DIR` wrote the shipped assets/zoo/vlm-processor
    shipped = load_processor(train_vlm.PROCESSOR_DIR)
    monkeypatch.setattr(train_vlm, "train_processor", lambda texts: shipped)
    monkeypatch.setattr(train_vlm, "TOKENIZER_SEEDS", range(2))
    shipped_files = _entry_bytes(train_vlm.PROCESSOR_DIR)
    zoo = tmp_path / "zoo"
    assert train_vlm.processor_dir(zoo) == train_vlm.PROCESSOR_DIR  # none there yet
    train_vlm.main(["tokenizer", "--zoo", str(zoo)])
    out = zoo / "vlm-processor"
    assert train_vlm.processor_dir(zoo) == out
    assert load_processor(out).tokenizer.get_vocab() == shipped.tokenizer.get_vocab()
    assert json.loads((out / "card.json").read_text())["vocab_size"] == len(shipped.tokenizer)
    assert sorted(p.name for p in zoo.iterdir()) == ["vlm-processor"]  # no staging left
    assert _entry_bytes(train_vlm.PROCESSOR_DIR) == shipped_files

    _processor_with_extra_token(out)
    before = (out / "tokenizer.json").read_bytes()
    with pytest.raises(SystemExit, match=r"vlm-processor holds another processor \(512 tokens; "
                                         r"these scenes give 511"):
        train_vlm.main(["tokenizer", "--zoo", str(zoo)])
    assert (out / "tokenizer.json").read_bytes() == before


def test_training_reads_the_zoo_processor_and_refuses_another_vocabulary(tmp_path, monkeypatch):
    # the processor came from assets/zoo/vlm-processor whatever --zoo said, and a checkpoint of
    # another vocabulary failed deep in load_state_dict
    _micro(monkeypatch)
    _processor_with_extra_token(tmp_path / "zoo" / "vlm-processor")
    _run(tmp_path, "a")
    config = json.loads((tmp_path / "zoo" / "vlm-micro" / "config.json").read_text())
    assert config["text_config"]["vocab_size"] == 512
    with pytest.raises(ValueError, match=r"--processor .*assets/zoo/vlm-processor: a vocabulary "
                                         r"of 511 tokens, but .*ckpt embeds 512"):
        _run(tmp_path, "a", "--resume", "--processor", str(train_vlm.PROCESSOR_DIR))


def test_patch_labels_mark_the_patches_that_show_each_shape():
    seed = next(s for s in range(1000) if len(make_scene(s).shapes) == 1)
    scene = make_scene(seed)
    shape = scene.shapes[0]
    colours, kinds = patch_labels(scene, 8)
    assert len(colours) == len(kinds) == 64
    on = [i for i, k in enumerate(kinds) if k != NO_SHAPE]
    assert on and all(kinds[i] == SHAPES.index(shape.kind) for i in on)
    assert all(colours[i] == PATCH_COLOURS.index(shape.colour) for i in on)
    assert all(colours[i] == PATCH_COLOURS.index(scene.background)
               for i in range(64) if kinds[i] == NO_SHAPE)
    row, col = shape.cell  # the shape's patches lie in (or next to) its grid cell: 8/3 patches wide
    assert all(abs(i // 8 * 3 / 8 + 3 / 16 - (row + 0.5)) < 1 and
               abs(i % 8 * 3 / 8 + 3 / 16 - (col + 0.5)) < 1 for i in on)
    with pytest.raises(ValueError, match="patch: expected a divisor"):
        patch_labels(scene, 7)


def test_the_vision_pretraining_stage_trains_the_tower_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, vision_pretrain_steps=3))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    seen = {}
    real = train_vlm.pretrain_vision

    def spy(model, *args):
        before = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()}
        out = real(model, *args)
        after = model.model.vision_tower.state_dict()
        seen["changed"] = any(not torch.equal(before[k], after[k]) for k in before)
        return out

    monkeypatch.setattr(train_vlm, "pretrain_vision", spy)
    _run(tmp_path, "a")
    assert seen["changed"] and (tmp_path / "a" / "vlm-micro" / "vision.pt").is_file()
    card = json.loads((tmp_path / "zoo" / "vlm-micro" / "card.json").read_text())
    stage = card["results"]["vision_pretrain"]
    assert 0 <= stage["patch_colour"] <= 1 and 0 <= stage["shape_patch_kind"] <= 1


def test_a_frozen_tower_ships_exactly_as_pre_trained(tmp_path, monkeypatch):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, vision_pretrain_steps=3,
                                                    freeze_vision=True))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    at_stage_end = {}
    real = train_vlm.pretrain_vision

    def spy(model, *args):
        out = real(model, *args)
        at_stage_end.update({k: v.clone() for k, v in model.state_dict().items()})
        return out

    monkeypatch.setattr(train_vlm, "pretrain_vision", spy)
    shipped = _run(tmp_path, "a")
    # saved as the LLaVA checkpoint layout: "vision_tower.*" is the module's "model.vision_tower.*"
    tower = [k for k in shipped if k.startswith("vision_tower.")]
    projector = [k for k in shipped if k.startswith("multi_modal_projector.")]
    assert tower and projector
    for k in tower:  # the fp16 export of the pre-trained tower, bit for bit
        assert torch.equal(shipped[k], at_stage_end[f"model.{k}"].half()), k
    # the projector still learns after the stage
    assert not all(torch.equal(shipped[k], at_stage_end[f"model.{k}"].half()) for k in projector)


def test_freezing_a_tower_that_was_never_pre_trained_is_refused():
    with pytest.raises(ValueError, match="freeze_vision: expected vision_pretrain_steps > 0"):
        VLMSpec("vlm-micro", **MICRO, freeze_vision=True)
    # a fine-tune of committed weights keeps the tower those weights were trained with
    assert VLMSpec("vlm-micro", **MICRO, freeze_vision=True, init_from="HEAD:x").freeze_vision
    with pytest.raises(ValueError, match="colour_share: expected a share in \\[0, 1\\], got 1.5"):
        VLMSpec("vlm-micro", **MICRO, colour_share=1.5)
    with pytest.raises(ValueError, match="image_word_loss: .* 0 for a text-only model"):
        VLMSpec("vlm-micro", **{**MICRO, "vision_layers": 0}, image_word_loss=1.0)


def test_colour_share_sets_scenes_aside_for_colour_questions():
    scenes = [make_scene(seed) for seed in range(600)]
    assert all(question_answer(s, 0.6, 1.0)[0].startswith("What colour is the") for s in scenes)
    # 0 draws exactly as before the knob existed (earlier runs' data is unchanged)
    assert [question_answer(s, 0.6, 0.0) for s in scenes] == [question_answer(s) for s in scenes]
    half = [question_answer(s, 0.6, 0.5) for s in scenes]
    colour = sum(q.startswith("What colour is the") and "background" not in q for q, _ in half)
    described = sum(a == describe(s) for s, (_, a) in zip(scenes, half))
    # 0.5 set aside + the rest's own colour questions (0.4 x 2/6 of it); 0.6 of the rest described
    assert abs(colour / 600 - (0.5 + 0.5 * 0.4 * 2 / 6)) < 0.06, colour
    assert abs(described / 600 - 0.3) < 0.06, described
    with pytest.raises(ValueError, match="colour_share: expected a share in \\[0, 1\\], got -0.1"):
        question_answer(scenes[0], 0.6, -0.1)


def test_image_word_loss_is_low_when_image_tokens_read_as_their_patch_words():
    tokenizer = load_processor(train_vlm.PROCESSOR_DIR).tokenizer
    colour_ids, kind_ids = word_ids(tokenizer, PATCH_COLOURS), word_ids(tokenizer, SHAPES)
    assert len(set(colour_ids.tolist()) | set(kind_ids.tolist())) == len(PATCH_COLOURS) + len(SHAPES)
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(48, len(tokenizer), bias=False)
    batch = scene_batch(load_processor(train_vlm.PROCESSOR_DIR), [1, 2, 3], patch=8)
    colours, kinds = batch["patch_colours"], batch["patch_kinds"]
    assert colours.shape == kinds.shape == (3, 64)
    assert (kinds != NO_SHAPE).any() and (kinds == NO_SHAPE).any()
    words = lm_head.weight.detach()  # a token's output row: the direction that names it
    shape_word = torch.where((kinds != NO_SHAPE)[..., None],
                             words[kind_ids[kinds.clamp(max=len(SHAPES) - 1)]], 0)
    named = 20 * (words[colour_ids[colours]] + shape_word)
    right = image_word_loss(lm_head, named, batch, colour_ids, kind_ids)
    wrong = image_word_loss(lm_head, named.roll(1, dims=1), batch, colour_ids, kind_ids)
    blank = image_word_loss(lm_head, torch.zeros_like(named), batch, colour_ids, kind_ids)
    assert right < 0.5 * blank < wrong  # blank: 2 x log(vocab) on shape patches
    assert blank.item() == pytest.approx(
        math.log(len(tokenizer)) * (1 + (kinds != NO_SHAPE).any().item()), rel=1e-5)
    with pytest.raises(ValueError, match=r"image_features: expected \[B, P, H\] with \[B, P\] = "
                                         r"\[3, 64\].*got \[3, 16, 48\]"):
        image_word_loss(lm_head, named[:, :16], batch, colour_ids, kind_ids)
    with pytest.raises(ValueError, match="words: expected 'circles and squares' to be one token"):
        word_ids(tokenizer, ["circles and squares"])


def test_the_image_word_loss_trains_the_projector_on_the_image_tokens_of_the_batch(
        tmp_path, monkeypatch):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, colour_share=0.5,
                                                    image_word_loss=1.0))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    seen = []
    real = train_vlm.image_word_loss

    def spy(lm_head, features, batch, *ids):
        seen.append((tuple(features.shape), features.requires_grad, tuple(batch["patch_kinds"].shape)))
        return real(lm_head, features, batch, *ids)

    monkeypatch.setattr(train_vlm, "image_word_loss", spy)
    _run(tmp_path, "a")
    assert seen == [((2, 64, 32), True, (2, 64))] * MICRO["steps"]
    card = json.loads((tmp_path / "zoo" / "vlm-micro" / "card.json").read_text())
    assert card["config"]["image_word_loss"] == 1.0 and card["config"]["colour_share"] == 0.5
    assert 0 <= card["results"]["heldout_one_shape_colour_accuracy"] <= 1


def test_the_drafters_answer_cache_follows_the_target_weights(tmp_path):
    """Retraining the target must not let a drafter train on the old target's cached answers."""
    spec = SPECS["vlm-vispec"]
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, value in ((old, 0.0), (new, 1.0)):
        folder.mkdir()
        save_file({"w": torch.full((4,), value)}, folder / "model.safetensors")
    assert train_vlm.answers_cache_path(tmp_path, spec, old) == train_vlm.answers_cache_path(
        tmp_path, spec, old)
    assert train_vlm.answers_cache_path(tmp_path, spec, old) != train_vlm.answers_cache_path(
        tmp_path, spec, new)


def test_a_cut_short_vision_pretraining_stage_resumes_to_the_same_weights(tmp_path, monkeypatch,
                                                                          capsys):
    # the stage runs on the scaffold's loop (TrainLoop), as every trainer: a Ctrl-C saves it and
    # says how to resume, a rerun without --resume is refused, --resume picks up where it was cut
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, vision_pretrain_steps=4,
                                                    freeze_vision=True))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    straight = _run(tmp_path, "a")

    real_seeds = train_vlm.train_seeds

    def dies_at_stage_step_2(step, batch_size, seed=0):
        if seed == 1 and step == 2:  # the stage draws its scenes with seed=1
            raise KeyboardInterrupt
        return real_seeds(step, batch_size, seed)

    monkeypatch.setattr(train_vlm, "train_seeds", dies_at_stage_step_2)
    argv = ["vlm-micro", "--out", str(tmp_path / "b"), "--zoo", str(tmp_path / "zoo"),
            "--save-every-s", "1e9"]  # no timed save: the interrupt saves
    assert run_command(train_vlm.main, argv) == 130
    stage = tmp_path / "b" / "vlm-micro"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: vlm-micro vision tower saved at step 2 of 4 in {stage / 'vision-ckpt'}; "
        f"resume: python -m mmspec.zoo.training.train_vlm {shlex.join(argv)} --resume")
    assert not (stage / "vision.pt").exists()
    assert torch.load(stage / "vision-ckpt" / "trainer.pt", weights_only=True)["step"] == 2
    with pytest.raises(SystemExit, match="vision-ckpt exists: pass --resume to continue it"):
        _run(tmp_path, "b")
    stage_steps = []

    def records(step, batch_size, seed=0):
        if seed == 1:
            stage_steps.append(step)
        return real_seeds(step, batch_size, seed)

    monkeypatch.setattr(train_vlm, "train_seeds", records)
    resumed = _run(tmp_path, "b", "--resume")
    assert stage_steps == [2, 3]  # picked up where it was cut, not from scratch
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert (stage / "vision.pt").is_file() and not (stage / "vision-ckpt").exists()


def test_a_spec_patch_size_sets_the_image_tokens_of_model_and_processor(tmp_path, monkeypatch):
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, patch_size=16))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    _run(tmp_path, "a")
    entry = tmp_path / "zoo" / "vlm-micro"
    config = json.loads((entry / "config.json").read_text())
    assert config["vision_config"]["patch_size"] == 16 and config["image_seq_length"] == 16
    processor = LlavaProcessor.from_pretrained(str(entry))
    inputs = mmspec.zoo.vlm_inputs(processor, render(FRESH[0]), "Describe the image.")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert int((inputs["input_ids"] == image_id).sum()) == 16
    model = LlavaForConditionalGeneration.from_pretrained(str(entry))
    model.generate(**inputs, max_new_tokens=2, do_sample=False)  # image features fit the prompt
    with pytest.raises(ValueError, match="patch_size: expected a divisor of the image size 64"):
        VLMSpec("vlm-micro", **MICRO, patch_size=6)


def test_a_drafter_spec_trains_for_its_own_target_entry(tmp_path, monkeypatch):
    """A drafter spec names its target: it learns that entry's answers and its card says so, so
    that `zoo.load` binds it to that target (the patch-4 experiment's drafters); its adaptor size
    reaches the drafter."""
    monkeypatch.setitem(SPECS, "vlm-micro", VLMSpec("vlm-micro", **MICRO, patch_size=16))
    monkeypatch.setitem(SPECS, "vlm-micro-drafter", DrafterSpec(
        "vlm-micro-drafter", text_only=False, steps=2, samples=2, held_out=1, warmup_steps=1,
        answer_tokens=8, eval_new_tokens=4, target="vlm-micro", num_queries=3))
    monkeypatch.setattr(train_vlm, "HELDOUT_SCENES", 2)
    monkeypatch.setattr(train_vlm, "COLOUR_SCENES", 1)
    monkeypatch.setattr(train_vlm, "ONE_SHAPE_SCENES", 1)
    _run(tmp_path, "a")
    zoo_dir = tmp_path / "zoo"
    train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / "a"), "--zoo", str(zoo_dir),
                    "--eval-every", "0"])
    card = json.loads((zoo_dir / "vlm-micro-drafter" / "card.json").read_text())
    assert card["target"] == "vlm-micro" and card["summary"].endswith("for vlm-micro.")
    # --samples: a quick run answers fewer scenes, and its card says how many
    train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / "q"), "--zoo", str(zoo_dir),
                    "--eval-every", "0", "--samples", "1"])
    quick = json.loads((zoo_dir / "vlm-micro-drafter" / "card.json").read_text())
    assert quick["config"]["samples"] == 1 and "1 training scenes" in quick["data"]["prompts"]
    assert list((tmp_path / "q").glob("vlm-drafter-answers-1x8-*.pt"))
    with pytest.raises(SystemExit, match=r"another run.s checkpoint \(--samples 1 there, None "
                                         r"here\)"):  # a resume without it would mix two runs
        train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / "q"), "--zoo",
                        str(zoo_dir), "--eval-every", "0", "--resume"])
    with pytest.raises(SystemExit, match=r"checkpoint exists: pass --resume"):  # one line
        train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / "q"), "--zoo",
                        str(zoo_dir), "--eval-every", "0", "--samples", "1"])
    assert "vlm-micro's own greedy answers" in card["data"]["prompts"]
    answers = list((tmp_path / "a").glob("vlm-drafter-answers-2x8-*.pt"))
    assert len(answers) == 1 and answers[0].name == train_vlm.answers_cache_path(
        tmp_path / "a", SPECS["vlm-micro-drafter"], zoo_dir / "vlm-micro").name
    drafter = mmspec.zoo.load("vlm-micro-drafter", zoo_dir)
    assert isinstance(drafter.model, ViSpecDrafter)
    assert drafter.model.adapter.target.config.image_seq_length == 16
    assert drafter.model.config.num_queries == 3  # the spec's adaptor size reaches the drafter


def test_a_drafter_checkpoint_of_another_seed_or_past_steps_is_not_resumed(tmp_path,
                                                                          monkeypatch):
    # both were resumed by mmspec.vision.train: a 5-step checkpoint saved and shipped as step 2
    _micro(monkeypatch, patch_size=16)
    monkeypatch.setitem(SPECS, "vlm-micro-drafter", DrafterSpec(
        "vlm-micro-drafter", text_only=False, steps=2, samples=2, held_out=1, warmup_steps=1,
        answer_tokens=8, eval_new_tokens=4, target="vlm-micro"))
    _run(tmp_path, "a")
    out = tmp_path / "a" / "vlm-micro-drafter"
    (out / "checkpoint").mkdir(parents=True)
    torch.save({"step": 5}, out / "checkpoint" / "trainer.pt")
    (out / "run.json").write_text(json.dumps({"seed": 0}))

    def drafter(*extra):
        train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / "a"), "--zoo",
                        str(tmp_path / "zoo"), "--resume", *extra])

    with pytest.raises(SystemExit, match=r"vlm-micro-drafter is another run.s checkpoint "
                                         r"\(--seed 0 there, 3 here\)"):
        drafter("--steps", "5", "--seed", "3")
    with pytest.raises(SystemExit, match=r"--steps 2: .*checkpoint is already at step 5; "
                                         r"resuming it would label weights trained 5 steps as 2"):
        drafter()
    assert not (tmp_path / "zoo" / "vlm-micro-drafter").exists()
    assert not list((tmp_path / "a").glob("vlm-drafter-answers-*"))  # refused before answering


def test_a_drafter_export_killed_while_measuring_tau_keeps_the_previous_entry(tmp_path,
                                                                             monkeypatch):
    _micro(monkeypatch, patch_size=16)
    monkeypatch.setitem(SPECS, "vlm-micro-drafter", DrafterSpec(
        "vlm-micro-drafter", text_only=False, steps=2, samples=2, held_out=1, warmup_steps=1,
        answer_tokens=8, eval_new_tokens=4, target="vlm-micro"))
    _run(tmp_path, "a")
    zoo = tmp_path / "zoo"

    def drafter(out, *extra):
        train_vlm.main(["vlm-micro-drafter", "--out", str(tmp_path / out), "--zoo", str(zoo),
                        "--eval-every", "0", *extra])

    drafter("a")
    folder = zoo / "vlm-micro-drafter"
    before = _entry_bytes(folder)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_vlm, "held_out_tau", killed)
    with pytest.raises(KeyboardInterrupt):
        drafter("b", "--seed", "1")
    assert _entry_bytes(folder) == before
    assert sorted(p.name for p in zoo.iterdir()) == ["vlm-micro", "vlm-micro-drafter"]


def test_precomputed_answers_are_the_ones_training_reads(target, tmp_path, monkeypatch):
    # train_vlm fills mmspec.vision.train's answer cache in batches; a key that differs from
    # the trainer's would make it recompute every answer one by one
    from mmspec.vision.train import target_answers
    from mmspec.zoo.training.train_vlm import drafter_samples, precompute_answers

    samples = drafter_samples(target.tokenizer, [7, 8])
    cache = tmp_path / "answers.pt"
    precompute_answers(target.model, samples, 8, cache)

    def no_generate(*args, **kwargs):
        raise AssertionError("target_answers recomputed a precomputed answer")

    monkeypatch.setattr(target.model, "generate", no_generate)
    answers = target_answers(target.model, samples, 8, cache)
    assert len(answers) == 2 and all(0 < len(a) <= 8 for a in answers)


@pytest.mark.parametrize("eos", [[2, 17], None])
def test_precomputed_answers_stop_where_the_target_alone_stops(target, tmp_path, monkeypatch,
                                                               eos):
    # `row == eos` with a list of EOS ids (as many real checkpoints have), or none, is a Python
    # bool: `.nonzero()` raised AttributeError
    from mmspec.vision.train import target_answers
    from mmspec.zoo.training.train_vlm import drafter_samples, precompute_answers

    monkeypatch.setattr(target.model.generation_config, "eos_token_id", eos)
    samples = drafter_samples(target.tokenizer, range(7, 15))  # 2 prompt lengths: 2 batches
    cache = tmp_path / "answers.pt"
    precompute_answers(target.model, samples, 12, cache)
    batched = target_answers(target.model, samples, 12, cache)
    alone = target_answers(target.model, samples, 12, None)
    assert all(torch.equal(a, b) for a, b in zip(batched, alone))
    lengths = {len(a) for a in alone}
    assert lengths == ({12} if eos is None else {5, 10})  # 17 ends every answer here


def test_interrupted_precomputed_answers_are_kept_and_resumed(target, tmp_path, monkeypatch):
    from mmspec.zoo.training.train_vlm import drafter_samples, precompute_answers

    samples = drafter_samples(target.tokenizer, range(7, 15))  # batches of 6 and 2 prompts
    precompute_answers(target.model, samples, 8, tmp_path / "straight.pt")
    cache, real, on_disk = tmp_path / "answers.pt", target.model.generate, []

    def killed_at_the_2nd(*args, **kwargs):  # a kill: what is on disk is what was saved
        if on_disk:
            on_disk.append(len(torch.load(cache, weights_only=True)))
            raise KeyboardInterrupt
        on_disk.append(None)
        return real(*args, **kwargs)

    monkeypatch.setattr(target.model, "generate", killed_at_the_2nd)
    with pytest.raises(KeyboardInterrupt):
        precompute_answers(target.model, samples, 8, cache, save_every_s=0)
    assert on_disk[-1] == 6  # the first batch was saved before the second began
    calls = []
    monkeypatch.setattr(target.model, "generate",
                        lambda **kwargs: calls.append(kwargs["input_ids"]) or real(**kwargs))
    precompute_answers(target.model, samples, 8, cache)
    assert [len(ids) for ids in calls] == [2]  # only the missing batch
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(cache, weights_only=True)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_a_drafter_spec_names_its_features():
    # any other word fed the target's three layers in silently (only "last" was checked)
    assert EXPERIMENTS["vlm-vispec-e3"].features == "eagle3"
    assert SPECS["vlm-vispec"].features == "last"
    with pytest.raises(ValueError, match=r"DrafterSpec x: features must be 'last' or 'eagle3', "
                                         r"got 'eagle-3'"):
        DrafterSpec("x", text_only=False, steps=1, features="eagle-3")


def test_the_registry_ships_the_recipes_with_weights_and_the_trainer_takes_the_experiments_too():
    shipped = set(mmspec.zoo.available())
    assert set(SPECS) <= shipped and not set(EXPERIMENTS) & shipped
    assert train_vlm.recipes() == {**SPECS, **EXPERIMENTS} and not set(SPECS) & set(EXPERIMENTS)
    with pytest.raises(SystemExit) as done:  # an experiment is a name the command line takes
        train_vlm.main(["vlm-vispec-e3", "--help"])
    assert done.value.code == 0  # argparse's exit for an unknown name is 2
