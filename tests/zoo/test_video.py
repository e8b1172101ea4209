"""The video zoo entry: clips, the shipped Wan DiT, DraftAttention on it, and its training script."""

import json
import shlex

import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file

import mmspec.zoo
from mmspec.interrupt import run_command
from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, remove_draft_attention
from mmspec.zoo.clips import COLOURS, clip_batch, make_clip
from mmspec.zoo.registry import ZOO_VIDEO_TILE
from mmspec.zoo.training import train_video
from mmspec.zoo.video_pipeline import PixelWanPipeline

SIZE = dict(num_frames=4, height=32, width=32)


@pytest.fixture(scope="module")
def entry():
    return mmspec.zoo.load("video-dit")


def test_clips_are_a_function_of_the_seed():
    a, b = make_clip(7), make_clip(7)
    assert torch.equal(a.video, b.video) and a.caption == b.caption
    assert not torch.equal(make_clip(8).video, a.video)
    p = a.params
    assert a.caption == f"a {p.colour} {p.shape} moving {p.direction}"
    assert a.video.shape == (4, 3, 32, 32) and -1 <= a.video.min() and a.video.max() <= 1
    videos, captions = clip_batch([7, 8], frames=6, height=16, width=24)
    assert videos.shape == (2, 3, 6, 16, 24) and captions[0] == a.caption


def test_clip_shape_moves_in_the_caption_direction():
    checked = 0
    for seed in range(60):
        clip = make_clip(seed, frames=2)
        p = clip.params
        dy, dx = {"right": (0, 1), "left": (0, -1), "up": (-1, 0), "down": (1, 0)}[p.direction]
        y, x = p.start[0] + dy * p.speed, p.start[1] + dx * p.speed
        if not (p.radius <= y <= 32 - p.radius and p.radius <= x <= 32 - p.radius):
            continue  # bounces off the wall within the first step
        checked += 1
        colour = torch.tensor(COLOURS[clip.params.colour]).view(3, 1, 1) * 2 - 1
        centres = []
        for frame in clip.video:
            inside = ((frame - colour).abs().sum(0) < 0.05).float()  # [H, W]
            ys, xs = inside.nonzero(as_tuple=True)
            centres.append((ys.float().mean(), xs.float().mean()))
        (y0, x0), (y1, x1) = centres
        assert (y1 - y0) * dy + (x1 - x0) * dx > 0.5 * p.speed, clip.caption
    assert checked >= 30


def test_clip_background_is_a_texture_that_pans():
    """Around the shape, frame 1 is frame 0 moved by the pan: the shift that best aligns the two
    backgrounds (searched over whole pixels) is the pan rounded, and the texture is not flat."""
    checked = 0
    for seed in range(40):
        clip = make_clip(seed, frames=2, height=48, width=48)
        pan = clip.params.pan
        if max(abs(v - round(v)) for v in pan) > 0.2:
            continue  # only near-whole-pixel pans align exactly
        colour = torch.tensor(COLOURS[clip.params.colour]).view(3, 1, 1) * 2 - 1
        free = [((f - colour).abs().sum(0) > 0.3) for f in clip.video]  # not the shape
        f0, f1 = clip.video
        assert f0[:, free[0]].std() > 0.05  # a texture, not a plain grey
        errors = {}
        for dy in range(-4, 5):
            for dx in range(-4, 5):
                moved = torch.roll(f0, (dy, dx), (1, 2))
                ok = free[1] & torch.roll(free[0], (dy, dx), (0, 1))
                ok[: max(dy, 0)], ok[48 + min(dy, 0):] = False, False  # rows rolled around
                ok[:, : max(dx, 0)], ok[:, 48 + min(dx, 0):] = False, False
                errors[(dy, dx)] = (moved - f1)[:, ok].abs().mean()
        assert min(errors, key=errors.get) == (round(pan[0]), round(pan[1])), (seed, pan)
        checked += 1
    assert checked >= 3


def test_entry_loads_offline_as_a_wan_pipeline(entry, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert isinstance(entry.model, PixelWanPipeline) and not entry.model.training
    assert isinstance(entry.model.transformer, WanTransformer3DModel)
    assert entry.card["kind"] == "video-dit" and entry.card["size_mb"] <= 8
    assert entry.card["results"]["wall_time_s"] > 0


def test_heldout_loss_matches_the_card(entry):
    pipe = entry.model
    spec = train_video.VideoModelSpec(**entry.card["spec"])
    grid = pipe.trained_grids[0]  # the card's heldout_loss is its first grid's
    loss = train_video.heldout_loss(pipe.transformer, pipe.tokenizer, pipe.text_encoder, grid)
    assert loss <= entry.card["results"]["heldout_loss"] + 0.01
    # and it learned something: an untrained model of the same shape is far worse
    torch.manual_seed(0)
    untrained = train_video.build_transformer(spec).eval()
    assert loss < 0.5 * train_video.heldout_loss(untrained, pipe.tokenizer, pipe.text_encoder, grid)


@pytest.mark.parametrize("colour", ["red", "blue", "yellow"])
def test_generated_shape_has_the_caption_colour(entry, colour):
    frames = entry.model(f"a {colour} circle moving right", **SIZE, num_inference_steps=10,
                         generator=torch.Generator().manual_seed(0)).frames[0]  # [F, H, W, 3]
    pixels = torch.from_numpy(frames).reshape(-1, 3)
    background = pixels.median(0).values
    far = (pixels - background).abs().sum(-1)
    shape = pixels[far > 0.5 * far.max()]  # the pixels that stand out from the background
    target = torch.tensor(COLOURS[colour])
    nearest = torch.stack([(shape - torch.tensor(c)).pow(2).sum(-1) for c in COLOURS.values()])
    votes = torch.bincount(nearest.argmin(0), minlength=len(COLOURS))
    assert list(COLOURS)[int(votes.argmax())] == colour, (colour, shape.mean(0), target)


def test_draft_attention_at_sparsity_zero_is_dense(entry):
    pipe = entry.model
    call = dict(prompt="a green square moving up", **SIZE, num_inference_steps=3,
                generator=None, output_type="pt")
    dense = pipe(**{**call, "generator": torch.Generator().manual_seed(1)}).frames
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.0, tile=(4, 4),
                                                             dense_steps=0, dense_layers=0))
    try:
        sparse = pipe(**{**call, "generator": torch.Generator().manual_seed(1)}).frames
    finally:
        remove_draft_attention(pipe)
    assert state.mean_density() == 1.0 and len(state.records) == 3 * len(pipe.transformer.blocks)
    torch.testing.assert_close(sparse, dense, atol=1e-4, rtol=0)


@pytest.mark.parametrize("cache", ["first_block", "pyramid_broadcast"])
def test_step_caches_work_and_stack_with_draft_attention(entry, cache):
    # the pipeline opened no cache_context, so enable_cache failed at the first step
    from diffusers import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig

    pipe = entry.model
    call = dict(prompt="a red circle moving right", **SIZE, num_inference_steps=4,
                output_type="pt")
    plain = pipe(**call, generator=torch.Generator().manual_seed(1)).frames
    if cache == "first_block":
        config = FirstBlockCacheConfig(threshold=10.0)  # reuse at every step after the first
    else:
        config = PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
            current_timestep_callback=lambda: pipe.current_timestep)
    pipe.transformer.enable_cache(config)
    try:
        cached = pipe(**call, generator=torch.Generator().manual_seed(1)).frames
        apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.0, tile=(4, 4),
                                                         dense_steps=1, dense_layers=0))
        try:
            both = pipe(**call, generator=torch.Generator().manual_seed(1)).frames
        finally:
            remove_draft_attention(pipe)
    finally:
        pipe.transformer.disable_cache()
    assert (cached - plain).abs().max() > 1e-3  # the cache did skip work
    torch.testing.assert_close(both, cached, atol=1e-4, rtol=0)
    assert pipe.current_timestep is None


def test_draft_attention_at_90_percent_changes_less_than_the_seed(entry):
    pipe = entry.model
    call = dict(prompt="a white triangle moving left", **SIZE, num_inference_steps=6)
    dense = pipe(**call, generator=torch.Generator().manual_seed(2)).frames
    other_seed = pipe(**call, generator=torch.Generator().manual_seed(3)).frames
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.9, tile=ZOO_VIDEO_TILE))
    try:
        sparse = pipe(**call, generator=torch.Generator().manual_seed(2)).frames
    finally:
        remove_draft_attention(pipe)
    assert 0.1 < state.mean_density() < 1.0
    # the 20-step PSNR figures are in BENCHMARKS.md (benchmarks/video.py); here: keeping 10% of
    # the blocks moves the video far less than another noise seed does
    assert np.mean((sparse - dense) ** 2) < 0.25 * np.mean((other_seed - dense) ** 2)


def test_training_runs_and_resumes_to_the_same_weights(tmp_path, monkeypatch, interrupt_on_call,
                                                       capsys):
    def run(out, *extra):
        train_video.main(["--micro", "--steps", "3", "--save-every-s", "0",
                          "--out", str(tmp_path / out), "--assets", str(tmp_path / f"zoo-{out}"),
                          *extra])
        return load_file(str(tmp_path / f"zoo-{out}" / "video-dit" / "model.safetensors"))

    straight = run("a")
    real_loss = interrupt_on_call(train_video, "flow_matching_loss", 3)  # Ctrl-C on its 3rd call
    argv = ["--micro", "--steps", "3", "--save-every-s", "1e9", "--out",
            str(tmp_path / "b"), "--assets", str(tmp_path / "zoo-b")]
    assert run_command(train_video.main, argv) == 130  # no timed save: the interrupt saves
    ckpt = tmp_path / "b" / "video-dit" / "ckpt"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: video-dit saved at step 2 of 3 in {ckpt}; resume: python -m "
        f"mmspec.zoo.training.train_video {shlex.join(argv)} --resume")
    assert torch.load(ckpt / "trainer.pt", weights_only=True)["step"] == 2
    monkeypatch.setattr(train_video, "flow_matching_loss", real_loss)
    with pytest.raises(SystemExit, match="--resume"):
        run("b")
    run("b", "--resume")
    resumed = load_file(str(tmp_path / "zoo-b" / "video-dit" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    card = json.loads((tmp_path / "zoo-b" / "video-dit" / "card.json").read_text())
    assert card["training"]["steps"] == 3 and card["results"]["heldout_loss"] > 0
    assert card["training"]["grids"] == [list(g[:3]) for g in train_video.MICRO_GRIDS]
    assert set(card["results"]["heldout_loss_by_grid"]) == {"2x16x16", "4x8x8"}
    assert straight["transformer.proj_out.weight"].dtype == torch.float16
    entry = mmspec.zoo.load("video-dit", tmp_path / "zoo-b")
    frames = entry.model("a red square moving up", num_frames=2, height=16, width=16,
                         num_inference_steps=2).frames
    assert frames.shape == (1, 2, 16, 16, 3)


def test_init_from_fine_tunes_the_committed_weights(tmp_path, monkeypatch):
    from mmspec.zoo.training import committed

    def run(out, *extra):
        train_video.main(["--micro", "--save-every-s", "0", "--out",
                          str(tmp_path / out), "--assets", str(tmp_path / f"zoo-{out}"), *extra])
        return load_file(str(tmp_path / f"zoo-{out}" / "video-dit" / "model.safetensors"))

    first = run("a", "--steps", "3")
    entry = tmp_path / "zoo-a" / "video-dit"
    monkeypatch.setattr(committed, "git_show", lambda ref, name: (entry / name).read_bytes())
    again = run("b", "--steps", "1", "--lr", "1e-12", "--init-from", "REV:video-dit")
    assert all(torch.equal(first[k], again[k]) for k in first)  # 1 step at lr 1e-12: no change
    card = json.loads((tmp_path / "zoo-b" / "video-dit" / "card.json").read_text())
    assert card["init_from"]["ref"] == "REV:video-dit"
    assert card["init_from"]["card"]["training"]["steps"] == 3


def _micro_run(tmp_path, *extra):
    train_video.main(["--micro", "--save-every-s", "0", "--out",
                      str(tmp_path / "out"), "--assets", str(tmp_path / "zoo"), *extra])


def test_resume_refuses_a_checkpoint_of_other_settings(tmp_path):
    # --resume --seed 1 rebuilt the frozen text encoder from seed 1 and shipped the DiT trained
    # against seed 0's encoder with it
    _micro_run(tmp_path, "--steps", "2")
    entry = tmp_path / "zoo" / "video-dit"
    before = (entry / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit, match=r"another run.s checkpoint \(--seed 0 there, 1 here; "
                                         r"--grids \[\[2, 16, 16, 2\], \[4, 8, 8, 2\]\] there, "
                                         r"\[\[2, 16, 16, 3\]\] here\)"):
        _micro_run(tmp_path, "--steps", "3", "--resume", "--seed", "1", "--grids", "2x16x16:3")
    assert (entry / "model.safetensors").read_bytes() == before
    _micro_run(tmp_path, "--steps", "3", "--resume")  # the same settings, more steps: resumes
    assert json.loads((entry / "card.json").read_text())["training"]["steps"] == 3


def test_a_size_listed_twice_trains_twice_as_often_and_is_one_size_of_the_card(tmp_path):
    _micro_run(tmp_path, "--steps", "3", "--grids", "2x16x16:2", "4x8x8:2", "2x16x16:2")
    card = json.loads((tmp_path / "zoo" / "video-dit" / "card.json").read_text())
    assert card["training"]["grids"] == [[2, 16, 16], [4, 8, 8]]
    assert card["training"]["grids_note"].endswith("--grids 2x16x16:2 4x8x8:2 2x16x16:2 "
                                                   "(FxHxW:batch)")
    assert set(card["results"]["heldout_loss_by_grid"]) == {"2x16x16", "4x8x8"}
    losses = torch.load(tmp_path / "out" / "video-dit" / "ckpt" / "trainer.pt",
                        weights_only=True)["losses"]
    by_grid = card["results"]["final_train_loss_by_grid"]
    assert by_grid["2x16x16"] == round((losses[0] + losses[2]) / 2, 4)  # steps 0 and 2
    assert by_grid["4x8x8"] == round(losses[1], 4)
    assert mmspec.zoo.load("video-dit", tmp_path / "zoo").model.trained_grids == (
        (2, 16, 16), (4, 8, 8))


def test_an_export_killed_while_evaluating_keeps_the_previous_entry(tmp_path, monkeypatch):
    _micro_run(tmp_path, "--steps", "2")
    entry = tmp_path / "zoo" / "video-dit"
    before = {p.name: p.read_bytes() for p in entry.iterdir()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_video, "heldout_loss", killed)
    with pytest.raises(KeyboardInterrupt):
        train_video.main(["--micro", "--steps", "2", "--seed", "1", "--out",
                          str(tmp_path / "out-b"), "--assets", str(tmp_path / "zoo")])
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before
    assert [p.name for p in (tmp_path / "zoo").iterdir()] == ["video-dit"]  # nothing staged


def test_generate_cli_runs_the_zoo_entry(entry, tmp_path):
    from mmspec.video_dit import generate

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a blue circle moving down\n")
    assert generate.main(["--model", str(entry.path), "--prompts", str(prompts), "--out",
                          str(tmp_path / "out"), "--steps", "3", "--frames", "4", "--height", "32",
                          "--width", "32", "--dtype", "float32", "--tile", "4", "4",
                          "--sparsity", "0.9", "--dense-steps", "1"]) == 0
    meta = json.loads((tmp_path / "out" / "0000.json").read_text())
    assert meta["frames"] == 4 and meta["density"]["by_step"]["2"] < 1.0


def test_prompts_are_encoded_on_the_text_encoders_device(entry):
    # the token ids were built on the CPU: under `pipe.to("cuda")` the encoder got CPU ids
    from types import SimpleNamespace

    from mmspec.zoo.video_model import MAX_TEXT_LEN, encode_prompts

    class Encoder(torch.nn.Module):
        device = torch.device("meta")  # any device but the CPU's

        def forward(self, input_ids, attention_mask):
            assert input_ids.device == attention_mask.device == self.device
            return SimpleNamespace(last_hidden_state=torch.zeros(
                *input_ids.shape, 8, device=self.device))

    out = encode_prompts(entry.model.tokenizer, Encoder(), ["a red cat", "a dog"])
    assert out.shape == (2, MAX_TEXT_LEN, 8) and out.device.type == "meta"


def test_pipeline_input_errors_name_the_argument(entry):
    pipe = entry.model
    with pytest.raises(ValueError, match="negative_prompt must be a string or 2 strings"):
        pipe(["a", "b"], negative_prompt=["x"], num_inference_steps=1, **SIZE)
    with pytest.raises(ValueError, match=r"latents must be .* = \[1, 3, 4, 32, 32\], got "
                                         r"\[2, 3, 4, 32, 32\]"):
        pipe("a", latents=torch.zeros(2, 3, 4, 32, 32), num_inference_steps=1, **SIZE)


def test_sizes_off_the_training_grids_warn_once_naming_the_card(entry, caplog):
    # 64x64 at 9 frames (video_dit.generate's own sizes then) made dark noise without a word
    pipe = entry.model
    grids = [tuple(g) for g in entry.card["training"]["grids"]]
    assert pipe.trained_grids == tuple(grids) and len(grids) >= 3

    def call(frames, size):
        pipe("a red circle moving right", num_frames=frames, height=size, width=size,
             num_inference_steps=1, generator=torch.Generator().manual_seed(0))

    with caplog.at_level("WARNING", logger="mmspec.zoo.video_pipeline"):
        for frames, size, _ in grids[:2]:  # the cheap ones; every trained size is silent
            call(frames, size)
        assert not caplog.records
        call(2, 16)
        call(2, 16)
    [record] = caplog.records  # one line, once per size
    trained = ", ".join(f"{f} frames of {h}x{w}" for f, h, w in grids)
    assert record.getMessage() == (
        f"2 frames of 16x16: this video DiT was trained on {trained} only "
        f"({entry.path / 'card.json'}, training.grids); expect noise at other sizes")


def test_training_cycles_through_the_grids_each_with_its_batch():
    grids = train_video.MICRO_GRIDS + ((3, 6, 10, 1),)
    gen = torch.Generator().manual_seed(0)
    shapes = [tuple(train_video.training_batch(step, grids, 0, gen)[0].shape)
              for step in range(4)]
    assert shapes == [(2, 3, 2, 16, 16), (2, 3, 4, 8, 8), (1, 3, 3, 6, 10), (2, 3, 2, 16, 16)]
    first = train_video.training_batch(0, grids, 0, gen)[0]
    assert not torch.equal(first, train_video.training_batch(3, grids, 0, gen)[0])  # new clips


@pytest.mark.parametrize("text", ["4x32:8", "4x32x32", "4x31x32:2", "4x32x32:17", "0x32x32:1"])
def test_grids_option_refuses_malformed_grids(text, capsys):
    with pytest.raises(SystemExit):
        train_video.main(["--micro", "--grids", text])
    assert "argument --grids: " in (err := capsys.readouterr().err) and repr(text) in err


def test_a_card_from_before_multi_grid_training_names_its_spec_grid(entry, tmp_path):
    import shutil

    shutil.copytree(entry.path, tmp_path / "video-dit")
    card = json.loads((tmp_path / "video-dit" / "card.json").read_text())
    del card["training"]["grids"]
    card["spec"].update(frames=2, height=16, width=24)
    (tmp_path / "video-dit" / "card.json").write_text(json.dumps(card))
    assert mmspec.zoo.load("video-dit", tmp_path).model.trained_grids == ((2, 16, 24),)
