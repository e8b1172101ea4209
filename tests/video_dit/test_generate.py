import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from mmspec.video_dit import compare, generate
from mmspec.video_dit.video_io import read_video

from .tiny import TINY_CALL, tiny_wan_pipeline

COMMON = ["--steps", "3", "--height", "64", "--width", "64", "--frames", "5", "--dtype",
          "float32", "--tile", "2", "2", "--guidance", "2.0"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_wan")
    tiny_wan_pipeline().save_pretrained(path)
    return path


def test_generate_resume_and_compare(model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n\n# not a prompt\na dog on the beach\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON]
    dense, sparse = tmp_path / "dense", tmp_path / "sparse"
    assert generate.main([*args, "--out", str(dense), "--dense"]) == 0
    assert generate.main([*args, "--out", str(sparse), "--sparsity", "0.5", "--dense-steps", "1"]) == 0
    for d in (dense, sparse):
        assert sorted(p.name for p in d.iterdir()) == [
            "0000.json", "0000.mp4", "0000.png", "0001.json", "0001.mp4", "0001.png"]
    video = read_video(sparse / "0001.mp4")
    assert video.shape == (5, 64, 64, 3) and video.std() > 0
    meta = json.loads((sparse / "0001.json").read_text())
    assert meta["prompt"] == "a dog on the beach" and meta["seed"] == 43
    assert len(meta["step_seconds"]) == 3 and meta["seconds"] > 0
    assert meta["density"]["by_step"]["0"] == 1.0 and meta["density"]["by_step"]["2"] < 1.0
    assert json.loads((dense / "0000.json").read_text())["density"] is None

    # resume: finished prompts are skipped, a missing one is redone
    before = (sparse / "0000.mp4").stat().st_mtime_ns
    (sparse / "0001.json").unlink()
    capsys.readouterr()
    generate.main([*args, "--out", str(sparse), "--sparsity", "0.5", "--dense-steps", "1"])
    assert "resuming: 1 of 2" in capsys.readouterr().out
    assert (sparse / "0000.mp4").stat().st_mtime_ns == before and (sparse / "0001.json").exists()
    # ... but only a run with the same prompts and settings resumes: one that differs stops
    # instead of mixing its videos with the old ones under the old labels
    with pytest.raises(SystemExit, match=r"0000.json was made by another prompt or settings "
                                         r"\(config .*sparsity.: 0.5.* there, .*sparsity.: 0.7"):
        generate.main([*args, "--out", str(sparse), "--sparsity", "0.7", "--dense-steps", "1"])
    with pytest.raises(SystemExit, match=r"fps 16 there, 8 now"):  # frame rates mixed
        generate.main([*args, "--out", str(sparse), "--sparsity", "0.5", "--dense-steps", "1",
                       "--fps", "8"])
    prompts.write_text("a blue cat\na dog on the beach\n")
    with pytest.raises(SystemExit, match=r"prompt 'a red cat' there, 'a blue cat' now"):
        generate.main([*args, "--out", str(sparse), "--sparsity", "0.5", "--dense-steps", "1"])
    prompts.write_text("a red cat\na dog on the beach\n")
    # the model folder spelled another way is the same model: `wan/`, `./wan`, `/abs/wan`
    capsys.readouterr()
    again = ["--model", str(model_dir) + "/", *args[2:]]
    generate.main([*again, "--out", str(sparse), "--sparsity", "0.5", "--dense-steps", "1"])
    assert "resuming: 2 of 2" in capsys.readouterr().out

    assert compare.main([str(dense), str(sparse)]) == 0
    rows = json.loads((sparse / "compare.json").read_text())
    assert [r["video"] for r in rows] == ["0000.mp4", "0001.mp4"]
    assert all(np.isfinite(r["psnr"]) and 0 < r["ssim"] < 1 for r in rows)
    assert "| **mean** |" in (sparse / "compare.md").read_text()
    # one "mean density" mixed the dense warm-up step and layer in: --sparsity 0.5 read ~0.8
    meta = json.loads((sparse / "0001.json").read_text())["density"]
    assert meta["sparse"] < meta["mean"] < 1.0 and rows[1]["sparse_density"] == meta["sparse"]
    head = (sparse / "compare.md").read_text().splitlines()[0]
    assert ("| density of the sparse steps | density of the whole run (dense warm-up included) |"
            in head)
    # the frames side by side: dense | sparse | difference, one row of 3 panels per video
    from PIL import Image

    sheet = np.asarray(Image.open(sparse / "compare.png").convert("RGB"))
    assert sheet.shape == (2 * (18 + 320), 3 * 320, 3)
    middle = read_video(dense / "0001.mp4")[2]
    panel = sheet[338 + 18:, :320]  # video 0001, dense panel (64x64 frames scaled to 320)
    assert np.abs(panel[::5, ::5].astype(int) - middle.astype(int)).mean() < 3
    assert sheet[338 + 18:, 640:].max() > 0  # the sparse video differs somewhere
    # a rerun reads past its own compare.json; a table lands in an existing folder only
    assert compare.main([str(dense), str(sparse)]) == 0
    with pytest.raises(SystemExit):
        compare.main([str(dense), str(sparse), "--out", str(tmp_path / "no" / "t.md")])
    assert "--out: no such directory" in capsys.readouterr().err

    # videos of different runs are not compared: their gap is not DraftAttention's
    other = tmp_path / "other"
    generate.main([*args, "--out", str(other), "--dense", "--seed", "7"])
    with pytest.raises(SystemExit):
        compare.main([str(other), str(sparse)])
    assert re.search(r"0000.mp4: the dense and sparse videos come from different runs \(seed 7 "
                     r"dense, 42 sparse\)", capsys.readouterr().err)


def test_step_seconds_start_at_the_denoising_loop(model_dir, tmp_path):
    # the clock started before the pipeline call: step 0 also held prompt encoding
    import time

    from mmspec.video_dit.generate import generate_one, load_pipeline

    pipe = load_pipeline(str(model_dir), __import__("torch").float32)
    pipe.set_progress_bar_config(disable=True)
    encode = pipe.encode_prompt
    pipe.encode_prompt = lambda *a, **k: (time.sleep(0.5), encode(*a, **k))[1]
    args = generate.parse_args(["--model", str(model_dir), "--prompts", "p", "--out", "o",
                                *COMMON])
    result = generate_one(pipe, "a red cat", 0, args, None, "cpu")
    assert result["setup_seconds"] >= 0.5 and max(result["step_seconds"]) < 0.5
    assert result["seconds"] >= result["setup_seconds"] + sum(result["step_seconds"])
    assert result["decode_seconds"] > 0


def test_compile_gives_the_eager_videos(model_dir, tmp_path, capsys):
    # 64x64 frames are 4x4 latent tokens here: --tile 3 3 pads them (the exact padded-key path)
    import torch

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--tile", "3", "3",
            "--sparsity", "0.5", "--dense-steps", "1"]
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        assert generate.main([*args, "--out", str(tmp_path / "eager")]) == 0
        assert counters["stats"]["unique_graphs"] == 0
        assert generate.main([*args, "--out", str(tmp_path / "compiled"),
                              "--compile", "aot_eager"]) == 0
        assert counters["stats"]["unique_graphs"] >= 1  # the blocks did compile
    finally:
        torch._dynamo.reset()
    eager, compiled = (json.loads((tmp_path / d / "0000.json").read_text())
                       for d in ("eager", "compiled"))
    assert compiled["compile"] == "aot_eager" and eager["compile"] is None
    assert compiled["density"] == eager["density"] and eager["density"]["mean"] < 1.0
    a, b = (read_video(tmp_path / d / "0000.mp4").astype(int) for d in ("eager", "compiled"))
    assert np.abs(a - b).max() <= 1  # H.264 of the same frames, up to float rounding
    with pytest.raises(SystemExit):
        generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o", "--compile", "jit"])
    assert "--compile takes a torch.compile backend (" in capsys.readouterr().err


def test_cpu_offload_keeps_the_videos_and_draft_attention(tmp_path):
    # diffusers' model offload wraps each model's forward in accelerate's hook; DraftAttention's
    # pre-forward hook must still read the step and grid (here the "accelerator" is the CPU)
    import torch

    from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention
    from mmspec.video_dit.generate import place_pipeline

    call = {"prompt": "a red cat", **TINY_CALL}
    config = DraftAttentionConfig(sparsity=0.5, tile=(2, 2), dense_steps=1, dense_layers=0)
    runs = []
    for offload, offload_first in ((False, False), (True, False), (True, True)):
        pipe = tiny_wan_pipeline()
        pipe.set_progress_bar_config(disable=True)
        if not offload_first:
            state = apply_draft_attention(pipe, config)
        place_pipeline(pipe, torch.device("cpu"), cpu_offload=offload, vae_tiling=offload)
        if offload_first:  # the offload hook already wraps the transformer's forward
            state = apply_draft_attention(pipe, config)
        assert hasattr(pipe.transformer, "_hf_hook") == offload
        assert pipe.vae.use_tiling == offload
        frames = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
        runs.append((frames, state.density_by_step()))
    # 64x64 frames are smaller than one VAE tile: tiling changes nothing here
    assert all((frames == runs[0][0]).all() for frames, _ in runs)
    assert all(density == {0: 1.0, 1: 0.5, 2: 0.5} for _, density in runs)


def test_cpu_offload_and_vae_tiling_from_the_command_line(model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--sparsity", "0.5",
            "--dense-steps", "1", "--out", str(tmp_path / "out")]
    assert generate.main([*args, "--cpu-offload", "--vae-tiling"]) == 0
    meta = json.loads((tmp_path / "out" / "0000.json").read_text())
    assert meta["cpu_offload"] is True and meta["settings"]["vae_tiling"] is True
    assert meta["density"]["by_step"]["2"] < 1.0
    # tiled decoding can change pixels: a run without it does not resume that folder
    with pytest.raises(SystemExit, match="vae_tiling True there, False now"):
        generate.main(args)
    # offloading does not change the videos: it resumes
    assert generate.main([*args, "--vae-tiling"]) == 0

    class NoTiling:
        vae = object()

    with pytest.raises(SystemExit, match=r"--vae-tiling: NoTiling's VAE \(object\) has no "
                                         r"tiled decoding"):
        generate.place_pipeline(NoTiling(), "cpu", vae_tiling=True)


def test_pipeline_kwargs_reach_the_call_and_the_settings(model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--dense"]
    out = tmp_path / "run"
    assert generate.main([*args, "--out", str(out),
                          "--pipeline-kwargs", '{"max_sequence_length": 2}']) == 0
    meta = json.loads((out / "0000.json").read_text())
    assert meta["settings"]["pipeline_kwargs"] == {"max_sequence_length": 2}
    assert generate.main([*args, "--out", str(tmp_path / "plain")]) == 0
    # the prompt cut to 2 tokens ("a red") conditions another video: the argument arrived
    truncated, plain = (read_video(d / "0000.mp4").astype(int) for d in (out, tmp_path / "plain"))
    assert np.abs(truncated - plain).max() > 2
    # resuming with other pipeline arguments would mix runs
    with pytest.raises(SystemExit, match="made by another prompt or settings"):
        generate.main([*args, "--out", str(out), "--pipeline-kwargs",
                       '{"max_sequence_length": 6}'])
    for kwargs, message in (('{"num_frames": 9}', "'num_frames' is set by this script; use "
                                                   "--frames"),
                            ('{"generator": 1}', "use --seed"),
                            ('{"return_dict": false}', "'return_dict' is fixed by this script"),
                            ('{"num_videos_per_prompt": 2}', "one video per prompt"),
                            ('{"no_such_argument": 1}',
                             "WanPipeline takes no 'no_such_argument'")):
        with pytest.raises(SystemExit, match=message):
            generate.main([*args, "--out", str(tmp_path / "x"), "--pipeline-kwargs", kwargs])
    for text, message in (("[1]", "must be a JSON object"), ("{bad", "not JSON")):
        with pytest.raises(SystemExit):
            generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o",
                                 "--pipeline-kwargs", text])
        assert message in capsys.readouterr().err


def test_image_to_video_from_a_jsonl(tmp_path, model_dir):
    from PIL import Image

    from .tiny import tiny_wan_i2v_pipeline

    i2v = tmp_path / "i2v"
    tiny_wan_i2v_pipeline().save_pretrained(i2v)
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / name)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"prompt": "a red cat", "image": "a.png"}\n# skipped\n'
                    '{"prompt": "a red cat", "image": "b.png"}\n')
    args = ["--model", str(i2v), "--prompts", str(jobs), *COMMON, "--sparsity", "0.5",
            "--dense-steps", "1"]
    out = tmp_path / "out"
    assert generate.main([*args, "--out", str(out)]) == 0
    metas = [json.loads((out / f"000{i}.json").read_text()) for i in (0, 1)]
    assert [Path(m["image"]).name for m in metas] == ["a.png", "b.png"]
    assert metas[1]["density"]["by_step"]["2"] < 1.0
    # another image under the same prompt number is another run, not a resume
    jobs.write_text('{"prompt": "a red cat", "image": "b.png"}\n')
    with pytest.raises(SystemExit, match="made by another prompt or settings"):
        generate.main([*args, "--out", str(out)])
    assert generate.main([*args, "--out", str(tmp_path / "other")]) == 0
    # same prompt and seed, other image: the image reached the pipeline
    a, b = (read_video(d / "0000.mp4").astype(int) for d in (out, tmp_path / "other"))
    assert np.abs(a - b).max() > 2
    # a line without an image is named before any video is made, not after the ones before it
    jobs.write_text('{"prompt": "a red cat", "image": "a.png"}\n{"prompt": "a dog"}\n')
    with pytest.raises(SystemExit, match=r"needs an image per prompt, and prompt 1 \('a dog'\) "
                                         r"has none"):
        generate.main([*args, "--out", str(tmp_path / "missing")])
    assert not list((tmp_path / "missing").glob("*.mp4"))
    # a text-to-video pipeline cannot take the image
    prompts = tmp_path / "t2v.jsonl"
    prompts.write_text('{"prompt": "a red cat", "image": "a.png"}\n')
    with pytest.raises(SystemExit, match="has an image but WanPipeline takes none"):
        generate.main(["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--dense",
                       "--out", str(tmp_path / "t2v")])
    for line, message in (('{"image": "a.png"}', 'non-empty "prompt"'),
                          ('{"prompt": "x", "images": "a.png"}', "unknown keys"),
                          ('{"prompt": "x", "image": "nope.png"}', "no such image"),
                          ("{bad", "is not JSON")):
        prompts.write_text(line + "\n")
        with pytest.raises(ValueError, match=message):
            generate.read_jobs(prompts)


def test_bad_cli_input(tmp_path, model_dir, capsys):
    with pytest.raises(SystemExit):
        generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o", "--sparsity", "1.0"])
    with pytest.raises(SystemExit):
        generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o", "--dense",
                             "--sparsity", "0.5"])
    for flags, message in ((["--dense-steps", "2.5"], "--dense-steps must be a fraction in "
                            r"\[0, 1\) or a whole number of steps, got 2.5"),
                           (["--tile", "0", "16"], "--tile two ints >= 1"),
                           (["--query-tile", "8", "24"], r"--query-tile must be whole tiles, a "
                            r"multiple of --tile 8 16 in each dimension, got 8 24"),
                           (["--query-tile", "0", "16"], r"--query-tile must be two ints >= 1, "
                                                         r"got 0 16"),
                           # 0 steps wrote pure noise as a finished video; fps 0 a broken mp4
                           (["--steps", "0"], "argument --steps: must be an int >= 1, got 0"),
                           (["--fps", "0"], "argument --fps: must be an int >= 1, got 0"),
                           (["--frames", "0"], "argument --frames: must be an int >= 1"),
                           (["--height", "-8"], "argument --height: must be an int >= 1")):
        with pytest.raises(SystemExit):
            generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o", *flags])
        assert re.search(message, capsys.readouterr().err)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ValueError, match="holds no prompt"):
        generate.read_jobs(empty)
    with pytest.raises(FileNotFoundError, match="--prompts"):
        generate.read_jobs(tmp_path / "missing.txt")


def test_prompt_files_a_user_might_give(tmp_path):
    bom = tmp_path / "bom.txt"  # saved with a byte-order mark: its first '#' line was a prompt
    bom.write_bytes("# my prompts\na red cat\n".encode("utf-8-sig"))
    assert generate.read_jobs(bom) == [{"prompt": "a red cat", "image": None}]
    upper = tmp_path / "jobs.JSONL"  # read as text: each JSON line became a literal prompt
    upper.write_text('{"prompt": "a red cat"}\n')
    assert generate.read_jobs(upper) == [{"prompt": "a red cat", "image": None}]
    for name, text, message in (
            ("jobs.json", '{"prompt": "a cat"}\n', "looks like JSON; name it .jsonl"),
            ("jobs.txt", '{"prompt": "a cat"}\n', "looks like JSON; name it .jsonl"),
            ("num.jsonl", '{"prompt": "a cat", "image": 5}\n', r'"image" must be a path '
                                                                 r'string, got 5'),
            ("blank.jsonl", '{"prompt": "   "}\n', 'non-empty "prompt" string')):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            generate.read_jobs(tmp_path / name)
    with pytest.raises(ValueError, match="is a folder; give a text or .jsonl file"):
        generate.read_jobs(tmp_path)
    braces = tmp_path / "styles.txt"  # prompts that start with a brace are still prompts
    braces.write_text("{cinematic} a dog\n{anime} a cat\n")
    assert [j["prompt"] for j in generate.read_jobs(braces)] == ["{cinematic} a dog",
                                                                  "{anime} a cat"]


def test_run_time_mistakes_are_named(model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON]
    # 8 x 16 tiles on frames of 4 x 4 latent tokens: a bare ValueError from inside the call
    with pytest.raises(SystemExit, match=r"--tile 8 16: tile \(8, 16\) is larger than the "
                                         r"frame.*latent tokens of --height"):
        generate.main([*args, "--tile", "8", "16", "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit, match=r"--query-tile 8 8: query_tile \(8, 8\) is larger "
                                         r"than the frame"):
        generate.main([*args, "--query-tile", "8", "8", "--out", str(tmp_path / "a")])
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match="--out .*file is a file; give a folder"):
        generate.main([*args, "--out", str(tmp_path / "file")])
    out = tmp_path / "torn"
    out.mkdir()
    (out / "0000.json").write_text('{"prompt": ')  # edited by hand, or cut off
    with pytest.raises(SystemExit, match="0000.json is not a JSON this script wrote"):
        generate.main([*args, "--out", str(out)])
    with pytest.raises(SystemExit, match="--dense-layers=9 leaves no sparse layer"):
        generate.main([*args, "--dense-layers", "9", "--out", str(tmp_path / "b")])


def test_a_size_the_pipeline_refuses_is_one_line(model_dir, tmp_path):
    # WanPipeline wants sizes in multiples of 16: its ValueError, not a traceback
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cat\n")
    with pytest.raises(SystemExit, match=r"prompt 0: the WanPipeline call failed: .*divisible "
                                         r"by 16"):
        generate.main(["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--dense",
                       "--height", "72", "--out", str(tmp_path / "o")])


def test_fewer_frames_than_asked_are_named(model_dir, tmp_path, capsys):
    # Wan makes 4k + 1 frames: --frames 4 gives 1, which the user was not told
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cat\n")
    assert generate.main(["--model", str(model_dir), "--prompts", str(prompts), *COMMON,
                          "--dense", "--frames", "4", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr()
    made = json.loads((tmp_path / "o" / "0000.json").read_text())["frames"]
    assert made != 4 and f"WanPipeline made {made} frames for --frames 4" in out.out + out.err


def test_an_image_to_video_pipeline_without_images():
    from .tiny import tiny_wan_i2v_pipeline

    args = generate.parse_args(["--model", "m", "--prompts", "p.txt", "--out", "o", *COMMON])
    with pytest.raises(SystemExit, match=r"WanImageToVideoPipeline needs an image per prompt: "
                                         r"give a .jsonl file"):
        generate.generate_one(tiny_wan_i2v_pipeline(), "a cat", 0, args, None, "cpu")


def test_negative_prompt_and_true_cfg_reach_only_pipelines_that_use_them():
    # HunyuanVideo ignores a negative prompt unless true_cfg_scale > 1: it was dropped silently
    class HunyuanLike:
        def __call__(self, prompt, negative_prompt=None, true_cfg_scale=1.0, **kwargs):
            raise AssertionError("must not be called")

    base = ["--model", "m", "--prompts", "p", "--out", "o"]
    args = generate.parse_args([*base, "--negative-prompt", "blurry"])
    with pytest.raises(SystemExit, match="--negative-prompt: HunyuanLike uses it only with "
                                         "--true-cfg-scale > 1"):
        generate.generate_one(HunyuanLike(), "a cat", 0, args, None, "cpu")
    args = generate.parse_args([*base, "--true-cfg-scale", "4"])
    with pytest.raises(SystemExit, match="--true-cfg-scale: WanPipeline has no true CFG"):
        generate.generate_one(tiny_wan_pipeline(), "a cat", 0, args, None, "cpu")
    # ... and a true CFG scale without a negative prompt was ignored by HunyuanVideo, silently
    with pytest.raises(SystemExit, match=r"--true-cfg-scale: HunyuanLike uses it only with "
                                         r"--negative-prompt"):
        generate.generate_one(HunyuanLike(), "a cat", 0, args, None, "cpu")


def test_hunyuan_video15_its_guider_and_no_step_callback():
    # HunyuanVideo15Pipeline takes no guidance_scale (its guider component does) and no
    # callback_on_step_end: --guidance failed deep in the call, and so did every run
    from .tiny import tiny_hunyuan15_pipeline

    pipe = tiny_hunyuan15_pipeline()
    pipe.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    pipe.set_progress_bar_config(disable=True)
    args = generate.parse_args(["--model", "m", "--prompts", "p", "--out", "o", "--steps", "3",
                                "--height", "128", "--width", "256", "--frames", "5",
                                "--guidance", "3", "--negative-prompt", "a dog"])
    assert pipe.guider.guidance_scale == 6.0
    result = generate.generate_one(pipe, "a red cat", 0, args, None, "cpu")
    assert pipe.guider.guidance_scale == 3.0
    assert result["frames"].shape == (5, 128, 256, 3)
    assert len(result["step_seconds"]) == 3 and result["decode_seconds"] > 0  # scheduler.step
    assert "step" not in vars(pipe.scheduler)  # the timing wrapper is gone again

    class NoSize:  # e.g. an image-to-video pipeline that sizes the video from its image
        def __call__(self, prompt, num_inference_steps=50, num_frames=49, output_type="pil",
                     generator=None, negative_prompt=None, guidance_scale=5.0):
            raise AssertionError("must not be called")

    with pytest.raises(SystemExit, match="--height: NoSize takes no height"):
        generate.generate_one(NoSize(), "a cat", 0, args, None, "cpu")


def test_two_processes_split_the_prompts(model_dir, tmp_path):
    """Under a launcher (torchrun here; `accelerate launch` on GPUs) each prompt is made once."""
    import os
    import subprocess
    import sys

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na dog on the beach\na blue car\n")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "mmspec.video_dit.generate", "--model", str(model_dir), "--prompts", str(prompts),
         "--out", str(out), *COMMON, "--sparsity", "0.5", "--dense-steps", "1"],
        capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    made = {json.loads((out / f"{i:04d}.json").read_text())["prompt"]:
            json.loads((out / f"{i:04d}.json").read_text())["process"] for i in range(3)}
    assert made == {"a red cat": 0, "a dog on the beach": 0, "a blue car": 1}


def test_context_parallel_must_divide_the_processes(model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    with pytest.raises(SystemExit, match=r"^--context-parallel 2 must divide the number of "
                                         r"processes, got 1 \(torchrun --nproc-per-node 2"):
        generate.main(["--model", str(model_dir), "--prompts", str(prompts), "--out",
                       str(tmp_path / "out"), "--context-parallel", "2"])


def test_a_missing_prompts_file_or_model_is_a_message(tmp_path):
    # both were tracebacks; the model's read diffusers' "not fully cached locally ... Hub"
    prompts = tmp_path / "prompts.txt"
    with pytest.raises(SystemExit, match=r"^--prompts: no such file .*prompts.txt$"):
        generate.main(["--model", "unused", "--prompts", str(prompts), "--out", str(tmp_path)])
    prompts.write_text("a red cat\n")
    with pytest.raises(SystemExit, match=r"^--model: no such model folder .*nope \(nor a Hugging "
                                         r"Face hub id"):
        generate.main(["--model", str(tmp_path / "nope"), "--prompts", str(prompts), "--out",
                       str(tmp_path / "out"), "--dense"])
    with pytest.raises(SystemExit, match=r"^--model: no model folder org/nope, and the hub id "
                                         r"org/nope is not in the Hugging Face cache"):
        generate.main(["--model", "org/nope", "--prompts", str(prompts), "--out",
                       str(tmp_path / "out"), "--dense"])


def test_a_hub_id_loads_from_the_local_cache_offline(model_dir, tmp_path, monkeypatch, capsys):
    """... and, its output not being a terminal, a line a video says how far it got (tqdm's
    bar is off there, and nothing was said until the end)."""
    from tests.hub_cache import add_to_cache

    add_to_cache(tmp_path / "hub", "org/tiny-wan", model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # HF_HUB_OFFLINE=1: conftest.py
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na blue dog\n")
    assert generate.main(["--model", "org/tiny-wan", "--prompts", str(prompts), *COMMON,
                          "--out", str(tmp_path / "out"), "--dense"]) == 0
    assert len(list((tmp_path / "out").glob("*.mp4"))) == 2
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines[:2]] == ["video 0000.mp4 done (1 of 2",
                                                          "video 0001.mp4 done (2 of 2"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)  # tqdm's bar instead
    prompts.write_text("a red cat\n")
    assert generate.main(["--model", "org/tiny-wan", "--prompts", str(prompts), *COMMON,
                          "--out", str(tmp_path / "tty"), "--dense"]) == 0
    assert "video 0000.mp4 done" not in capsys.readouterr().out


@pytest.mark.parametrize("where", ["diffusers", "zoo"])
def test_bfloat16_loads_keep_the_float32_modules_like_from_pretrained(where, model_dir):
    # the zoo path cast with `.to(dtype)`: diffusers warned and the norms, time embedder and
    # modulation table ran in bf16; the diffusers path must really apply the dtype it is given
    import warnings

    import torch

    from mmspec.video_dit.generate import load_pipeline
    from mmspec.zoo.registry import ZOO_DIR

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(kept in float32|torch_dtype).*")
        pipe = load_pipeline(str(model_dir if where == "diffusers" else ZOO_DIR / "video-dit"),
                             torch.bfloat16)
    fp32 = load_pipeline(str(model_dir if where == "diffusers" else ZOO_DIR / "video-dit"),
                         torch.float32).transformer
    state, source = dict(pipe.transformer.named_parameters()), dict(fp32.named_parameters())
    state.update(pipe.transformer.named_buffers())  # the rope tables
    source.update(fp32.named_buffers())
    keep = {"time_embedder", "norm2", "scale_shift_table", "rope"}  # Wan's fp32 modules
    kept = [name for name in state if keep & set(name.split("."))]
    assert {"scale_shift_table", "blocks.0.scale_shift_table", "rope.freqs_cos"} <= set(kept)
    for name in kept:  # float32, with the float32 values (not rounded through bf16)
        assert state[name].dtype == torch.float32 and torch.equal(state[name], source[name]), name
    assert all(t.dtype == torch.bfloat16 for name, t in state.items()
               if name.startswith(("patch_embedding", "proj_out")))
    assert pipe.transformer.dtype == torch.bfloat16


def test_query_tiles_run_record_and_resume(model_dir, tmp_path, capsys):
    # 4 x 4 latent tokens a frame: 2 x 2 query tiles over 1 x 2 tiles
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    out = tmp_path / "q"
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--sparsity", "0.5",
            "--dense-steps", "1", "--tile", "1", "2", "--out", str(out)]
    assert generate.main([*args, "--query-tile", "2", "2"]) == 0
    meta = json.loads((out / "0000.json").read_text())
    assert meta["config"]["query_tile"] == [2, 2] and meta["config"]["tile"] == [1, 2]
    assert meta["density"]["by_step"]["2"] < 1.0
    assert generate.main([*args, "--query-tile", "2", "2"]) == 0
    assert "resuming: 1 of 1" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="query_tile"):  # another run in the same folder
        generate.main(args)
    # without --query-tile the JSON has no such key, as before it existed: older folders resume
    plain = tmp_path / "plain"
    assert generate.main([*args[:-1], str(plain)]) == 0
    assert "query_tile" not in json.loads((plain / "0000.json").read_text())["config"]


def test_ctrl_c_says_how_many_videos_are_done_and_the_rerun_finishes(model_dir, tmp_path,
                                                                     capsys, interrupt_on_call,
                                                                     monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na dog\na bird\n")
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--steps", "1",
            "--dense", "--out", str(tmp_path / "out")]
    real = interrupt_on_call(generate, "generate_one", 2)  # Ctrl-C during the second video
    assert generate.run_command(generate.main, args) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted: 1 of 3 videos in {tmp_path / 'out'}; rerun the same command to resume")
    monkeypatch.setattr(generate, "generate_one", real)
    assert generate.main(args) == 0
    out = capsys.readouterr().out
    assert "resuming: 1 of 3" in out
    assert out.splitlines()[-1].startswith(f"3 of 3 videos in {tmp_path / 'out'} (NNNN.mp4")
    assert len(list((tmp_path / "out").glob("*.json"))) == 3


def test_a_kill_during_an_mp4_write_leaves_no_marker_without_its_files(model_dir, tmp_path,
                                                                      capsys, monkeypatch):
    """A video's JSON marks it finished and is written after its mp4 and png: interrupted while
    the second video's mp4 is being written (its frames half encoded), every JSON there has its
    mp4 and png, the second has none, and the rerun makes it."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na dog\na bird\n")
    out = tmp_path / "out"
    args = ["--model", str(model_dir), "--prompts", str(prompts), *COMMON, "--steps", "1",
            "--dense", "--out", str(out)]
    real, calls = generate.write_mp4, []

    def killed_on_the_second(path, frames, fps=16):
        calls.append(path)
        if len(calls) == 2:  # a kill mid-encode: the partial file is there, the mp4 is not
            Path(str(path) + ".partial").write_bytes(b"\x00\x00\x00\x18ftypisom")
            raise KeyboardInterrupt
        real(path, frames, fps=fps)

    monkeypatch.setattr(generate, "write_mp4", killed_on_the_second)
    assert generate.run_command(generate.main, args) == 130
    markers = sorted(out.glob("*.json"))
    assert [m.stem for m in markers] == ["0000"]
    for marker in markers:
        assert len(read_video(marker.with_suffix(".mp4"))) == 5
        assert marker.with_suffix(".png").stat().st_size > 0
    assert not (out / "0001.mp4").exists()
    monkeypatch.setattr(generate, "write_mp4", real)
    assert generate.main(args) == 0
    assert "resuming: 1 of 3" in capsys.readouterr().out
    for i in range(3):
        assert len(read_video(out / f"{i:04d}.mp4")) == 5 and (out / f"{i:04d}.png").exists()
        assert json.loads((out / f"{i:04d}.json").read_text())["frames"] == 5


def test_model_takes_a_zoo_name_and_names_a_text_model_given_instead(tmp_path):
    from mmspec.zoo.paths import ZOO_DIR

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    args = ["--prompts", str(prompts), "--out", str(tmp_path / "out"), "--dense"]
    assert generate.parse_args(["--model", "video-dit", *args]).model == str(ZOO_DIR / "video-dit")
    # a text model's zoo folder ended in "AttributeError: ... no attribute 'transformer'"
    with pytest.raises(SystemExit, match=r"^--model .*text-target: a zoo 'causal-lm' entry, not a "
                                         r"video model; give a diffusers pipeline folder or a "
                                         r"video zoo entry \(video-dit\)$"):
        generate.main(["--model", "text-target", *args])


def test_no_progress_bars_outside_a_terminal(model_dir, tmp_path, capfd):
    # a prompts bar with the pipeline's steps bar nested under it wrote escapes into logs
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n")
    assert generate.main(["--model", str(model_dir), "--prompts", str(prompts), *COMMON,
                          "--dense", "--out", str(tmp_path / "out")]) == 0
    captured = capfd.readouterr()
    assert "\r" not in captured.err and "\x1b" not in captured.err
    assert "it/s" not in captured.err + captured.out  # no bar, not even a finished one


def test_the_zoo_video_dit_runs_at_the_zoo_tile_by_default(tmp_path):
    # the paper's 8x16 tiles left 2 tiles a frame on the zoo DiT (21.5 dB at 90%) while the
    # README, the demo and BENCHMARKS.md's plot use 4x4: the zoo entry now gets the zoo's tile
    from mmspec.zoo.registry import ZOO_VIDEO_TILE

    def tile(*model):
        return tuple(generate.parse_args(["--model", *model, "--prompts", "p", "--out", "o"]).tile)

    assert tile("video-dit") == ZOO_VIDEO_TILE == (2, 4)
    assert tile(str(tmp_path)) == generate.PAPER_TILE == (8, 16)  # any other pipeline folder
    assert tile("video-dit", "--tile", "2", "2") == (2, 2)
