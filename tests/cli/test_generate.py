"""`mmspec generate` streams text and prints the stats; the built-in target says what it is."""

import re

import pytest
import torch

from mmspec.__main__ import main


def test_generate_with_the_builtin_target(capsys):
    torch.manual_seed(0)
    assert main(["generate", "--target", "builtin", "--max-new-tokens", "12", "--drafter", "self", "--tree-top-k", "2",
                 "--num-draft-tokens", "4", "--prompt", "abcabc", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "built-in random Llama" in captured.err and "text is noise" in captured.err
    assert "12 tokens" in captured.err and "tau" in captured.err
    assert len(captured.out.strip("\n")) == 12  # one character per token, streamed


def test_sampling_self_drafter_samples_like_the_target(capsys):
    # under --sample the chain drafter proposed argmax tokens: 1 of 95 accepted. Sampling as the
    # target does (temperature, default top-k 50, top-p), every draft token is accepted
    import re

    assert main(["generate", "--target", "builtin", "--drafter", "self", "--sample",
                 "--temperature", "0.8", "--top-p", "0.9", "--max-new-tokens", "30", "--prompt",
                 "abcabc", "--device", "cpu", "--no-baseline"]) == 0
    accepted, drafted = map(int, re.search(r"accepted (\d+)/(\d+) drafted",
                                           capsys.readouterr().err).groups())
    assert drafted > 10 and accepted == drafted


def test_unknown_drafter_is_refused(capsys):
    with pytest.raises(SystemExit, match="--drafter must be"):
        main(["generate", "--target", "builtin", "--max-new-tokens", "2", "--drafter", "nope",
              "--device", "cpu"])


def test_zoo_text_pair_streams_and_reports_the_speedup(capsys):
    # 2 new tokens: the last round is capped by the budget (no propose), which once crashed ADL
    for n in ("2", "24"):
        assert main(["generate", "--target", "text", "--max-new-tokens", n, "--device", "cpu"]) == 0
        err = capsys.readouterr().err
        assert "text-dlm" in err and "speedup" in err and "identical to target-only greedy" in err


def test_zoo_target_drafter_names_are_checked():
    with pytest.raises(SystemExit, match="must be one of"):
        main(["generate", "--target", "text", "--drafter", "vispec", "--device", "cpu"])


def test_help_and_behaviour_agree_on_the_drafters_of_each_target(capsys):
    """--help said `model:PATH` went with any target; `--target text` refused it."""
    from mmspec.cli.generate import ZOO_DRAFTERS
    from mmspec.zoo.presets import text_preset, vlm_preset

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "Drafters of `--target PATH_OR_ID` and `builtin`: `prompt-lookup`, `model:PATH" in shown
    for target, preset in (("text", text_preset()), ("vlm", vlm_preset())):
        assert tuple(preset.drafters) == ZOO_DRAFTERS[target]
        assert f"--target {target}: {', '.join(ZOO_DRAFTERS[target])}" in shown
        with pytest.raises(SystemExit, match=rf"^--drafter model:.*text-drafter: --target "
                                             rf"{target} takes the zoo's drafters \("
                                             rf"{', '.join(ZOO_DRAFTERS[target])}\); pass the zoo "
                                             rf"target as a path, --target {target}-target"):
            main(["generate", "--target", target, "--drafter", "model:text-drafter",
                  "--device", "cpu"])
    # as the message says: the zoo target as a path takes a path drafter
    assert main(["generate", "--target", "text-target", "--drafter", "model:text-drafter",
                 "--max-new-tokens", "4", "--no-baseline", "--device", "cpu"]) == 0


def test_version(capsys):
    import tomllib
    from pathlib import Path

    import mmspec

    project = tomllib.loads((Path(mmspec.__file__).parents[1] / "pyproject.toml").read_text())
    assert main(["--version"]) == 0
    assert re.fullmatch(r"mmspec (\S+) \(torch \S+, transformers \S+, diffusers \S+\)\n",
                        capsys.readouterr().out).group(1) == project["project"]["version"]


def test_bench_names_are_checked():
    with pytest.raises(SystemExit, match="expected benchmark names"):
        main(["bench", "nope", "--plot"])


def test_draft_shape_flags_the_drafter_would_ignore_are_refused():
    # the zoo presets and ViSpec keep their own draft shapes: the flags used to be dropped

    with pytest.raises(SystemExit, match="--num-draft-tokens: --target text drafts with its own"):
        main(["generate", "--target", "text", "--drafter", "model", "--num-draft-tokens", "12",
              "--device", "cpu"])


def test_zoo_drafters_follow_the_target_to_its_device():
    # `--device cuda` moved only the target; the preset's DLM stayed on the CPU
    from mmspec.cli.generate import _on_device
    from mmspec.zoo.presets import text_preset

    preset = text_preset()
    for name in ("diffusion", "model"):
        drafter = _on_device(preset.drafters[name](), "meta")
        assert next(drafter.model.parameters()).device.type == "meta"
    assert next(preset.target.parameters()).device.type == "cpu"


def test_bench_passes_each_script_only_its_own_options():
    # `mmspec bench all --threads 2` (its docstring's example) died on kernels.py's argparse
    from mmspec.cli.bench import BENCHMARKS, args_for

    argv = ["--threads", "2", "--plot", "--write", "--repeats=3"]
    assert args_for(BENCHMARKS / "kernels.py", argv) == (["--write", "--repeats=3"],
                                                          ["--threads", "2", "--plot"])
    assert args_for(BENCHMARKS / "text.py", argv)[1] == []


def test_zoo_preset_input_errors_are_messages_not_tracebacks(tmp_path):
    with pytest.raises(SystemExit, match="--image: image .*missing.png' does not exist"):
        main(["generate", "--image", str(tmp_path / "missing.png"), "--device", "cpu"])


@pytest.mark.parametrize("target", ["vlm", "PATH"])
def test_an_image_file_that_is_not_an_image_is_named(tmp_path, target):
    # a PIL.UnidentifiedImageError traceback (zoo VLM), FileNotFoundError with --target PATH
    from mmspec.zoo.paths import ZOO_DIR

    notes = tmp_path / "notes.txt"
    notes.write_text("not a picture")
    vlm = [] if target == "vlm" else ["--target", str(ZOO_DIR / "vlm-target")]
    with pytest.raises(SystemExit, match=r"--image: image '.*notes.txt' is not an image file "
                                         r"Pillow can read"):
        main(["generate", *vlm, "--image", str(notes), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"--image: image '.*gone.png' does not exist"):
        main(["generate", *vlm, "--image", str(tmp_path / "gone.png"), "--device", "cpu"])


@pytest.mark.parametrize("target", ["builtin", "text", "vlm", "PATH"])
def test_a_blank_prompt_is_refused_for_every_target(capsys, target):
    # with --target PATH (and builtin) an empty --prompt silently became the default "Hello"
    from mmspec.zoo.paths import ZOO_DIR

    path = str(ZOO_DIR / "text-target") if target == "PATH" else target
    for prompt in ("", "  \n"):
        with pytest.raises(SystemExit) as err:
            main(["generate", "--target", path, "--prompt", prompt, "--device", "cpu"])
        assert err.value.code == 2
        assert f"--prompt must be non-empty text, got {prompt!r}" in capsys.readouterr().err


def test_the_streamed_answer_has_no_special_tokens(capsys):
    # TextStreamer decoded with the special tokens: the answer ended in "</s>"
    assert main(["generate", "--prompt", "What shapes do you see?", "--max-new-tokens", "40",
                 "--no-baseline", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    tokens = int(re.search(r"(\d+) tokens", captured.err).group(1))
    assert tokens < 40  # the answer ended at EOS, which was streamed as text
    assert captured.out.strip().endswith(".") and "</s>" not in captured.out
    assert f"the answer ended with its end-of-text token after {tokens} tokens" in captured.err


def test_make_run_says_where_its_image_is_and_when_the_answer_was_cut(capsys, monkeypatch):
    # `make run` (mmspec generate, defaults) named only "sample.png" and stopped mid-sentence at
    # the token limit without a word
    from mmspec.zoo.paths import ZOO_DIR

    monkeypatch.chdir(ZOO_DIR.parent.parent)  # the repository root, where make runs
    assert main(["generate", "--max-new-tokens", "6", "--no-baseline", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "on assets/zoo/vlm-target/sample.png," in err
    assert ("the answer stopped at the token limit (--max-new-tokens 6), before an end-of-text "
            "token") in err


@pytest.mark.parametrize("argv,message", [
    (["--temperature", "0.5"], "--temperature applies with --sample only"),
    (["--top-k", "5", "--top-p", "0.9"], "--top-k, --top-p apply with --sample only"),
    (["--sample", "--temperature", "0"], "argument --temperature: must be a number > 0.0"),
    (["--sample", "--top-p", "1.5"], r"argument --top-p: must be a number > 0.0 and <= 1.0"),
    (["--sample", "--top-k", "-2"], "argument --top-k: must be an int >= 0, got '-2'"),
    (["--tree-top-k", "0"], "argument --tree-top-k: must be an int >= 1, got '0'"),
    (["--num-draft-tokens", "x"], "argument --num-draft-tokens: must be an int >= 1, got 'x'"),
    (["--threads", "0"], "argument --threads: must be an int >= 1"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an int >= 1"),
    (["--device", "foo"], "argument --device: must be a torch device"),
    (["--device", "cuda:7"], r"argument --device: 'cuda:7' needs a CUDA GPU|this machine has"),
])
def test_bad_flags_are_refused_before_anything_loads(capsys, argv, message):
    with pytest.raises(SystemExit) as err:
        main(["generate", "--target", "builtin", "--drafter", "self", *argv])
    assert err.value.code == 2  # argparse's usage error, not a traceback
    assert re.search(message, capsys.readouterr().err)


def test_a_target_folder_without_a_tokenizer_is_named(tmp_path, monkeypatch, capsys):
    """It was "cannot load it as a causal LM ... install sentencepiece or tiktoken"; --tokenizer
    takes a folder or hub id (here one from the local hub cache)."""
    import shutil

    from mmspec.zoo.paths import ZOO_DIR
    from tests.hub_cache import zoo_hub_cache

    bare = tmp_path / "bare"
    shutil.copytree(ZOO_DIR / "text-target", bare,
                    ignore=shutil.ignore_patterns("tokenizer*", "card.json", "README.md"))
    with pytest.raises(SystemExit, match=r"--target .*bare: the folder has no tokenizer \(none "
                                         r"of tokenizer.json, .*\): pass --tokenizer PATH_OR_ID"):
        main(["generate", "--target", str(bare), "--drafter", "prompt-lookup", "--prompt", "Hi",
              "--device", "cpu"])
    monkeypatch.setenv("HF_HUB_CACHE", str(zoo_hub_cache(tmp_path / "hub", "text-target")))
    assert main(["generate", "--target", str(bare), "--tokenizer", "mmspec/text-target",
                 "--drafter", "prompt-lookup", "--prompt", "def f(x):", "--max-new-tokens", "8",
                 "--device", "cpu"]) == 0
    assert "identical to target-only greedy" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--tokenizer: no model folder mmspec/nope, and the hub "
                                         r"id mmspec/nope is not in the Hugging Face cache"):
        main(["generate", "--target", str(bare), "--tokenizer", "mmspec/nope"])
    with pytest.raises(SystemExit):
        main(["generate", "--target", "text", "--tokenizer", "mmspec/text-target"])
    assert "--tokenizer applies to a --target PATH_OR_ID" in capsys.readouterr().err


def test_hub_ids_resolve_from_the_local_cache_offline(tmp_path, monkeypatch, capsys):
    """--target and a drafter spec take hub ids as transformers' from_pretrained does, from the
    cache with HF_HUB_OFFLINE=1 (tests/conftest.py sets it); a miss names the id and the cache."""
    from tests.hub_cache import zoo_hub_cache

    cache = zoo_hub_cache(tmp_path / "hub", "text-target", "text-drafter", "text-dlm")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for drafter in ("model:mmspec/text-drafter", "diffusion:mmspec/text-dlm"):
        assert main(["generate", "--target", "mmspec/text-target", "--drafter", drafter,
                     "--prompt", "def f(x):", "--max-new-tokens", "8", "--device", "cpu"]) == 0
        assert "identical to target-only greedy" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=rf"--target: no model folder Qwen/Qwen2.5-0.5B-Instruct, "
                                         rf"and the hub id Qwen/Qwen2.5-0.5B-Instruct is not in "
                                         rf"the Hugging Face cache {cache} \(HF_HUB_OFFLINE"):
        main(["generate", "--target", "Qwen/Qwen2.5-0.5B-Instruct"])
    with pytest.raises(SystemExit, match=r"--drafter vispec:org/none: no model folder org/none"):
        main(["generate", "--target", "mmspec/text-target", "--drafter", "vispec:org/none"])
    # a mistyped zoo name: the names are listed
    with pytest.raises(SystemExit, match=r"--target: no model folder text-targte, .*; zoo "
                                         r"entries: text-dflash, text-dlm, text-drafter, text-eagle3, "
                                         r"text-target, video-dit"):
        main(["generate", "--target", "text-targte"])


def test_a_drafter_of_another_tokenizer_is_refused(tmp_path, capsys):
    """Lossless either way, but its drafts would almost never be accepted: say so up front."""
    import shutil

    from mmspec.zoo.paths import ZOO_DIR

    other = tmp_path / "drafter"
    shutil.copytree(ZOO_DIR / "text-drafter", other)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the VLM's 511-token tokenizer
        shutil.copy(ZOO_DIR / "vlm-processor" / name, other / name)
    with pytest.raises(SystemExit, match=r"--drafter model:.*: vocabulary mismatch: \d+ shared "
                                         r"ids map to different tokens"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
              f"model:{other}", "--prompt", "def f(x):", "--device", "cpu"])
    # the same tokenizer passes
    assert main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
                 f"model:{ZOO_DIR / 'text-drafter'}", "--prompt", "def f(x):",
                 "--max-new-tokens", "8", "--no-baseline", "--device", "cpu"]) == 0


def test_a_missing_vispec_drafter_is_a_message(tmp_path):
    from mmspec.zoo.paths import ZOO_DIR

    with pytest.raises(SystemExit, match=r"--drafter vispec:.*nothing: no such model folder"):
        main(["generate", "--target", str(ZOO_DIR / "vlm-target"), "--image",
              str(ZOO_DIR / "vlm-target" / "sample.png"), "--drafter",
              f"vispec:{tmp_path / 'nothing'}", "--device", "cpu"])


def test_the_baseline_stops_at_eos_as_the_speculative_run_does(capsys):
    # with --target PATH the baseline passed eos_token_id=None to target.generate, which turns
    # EOS off there: it ran past the answer's EOS and the CLI printed "DIFFERS" and exited 1
    from mmspec.zoo.paths import ZOO_DIR

    assert main(["generate", "--target", str(ZOO_DIR / "vlm-target"), "--image",
                 str(ZOO_DIR / "vlm-target" / "sample.png"), "--prompt",
                 "What shapes do you see?", "--max-new-tokens", "40", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    tokens = int(re.search(r"(\d+) tokens", err).group(1))
    assert tokens < 40 and "identical to target-only greedy" in err


def test_model_folders_that_do_not_load_are_named(tmp_path):
    from mmspec.zoo.paths import ZOO_DIR

    with pytest.raises(SystemExit, match=r"--target: no such model folder .*nope"):
        main(["generate", "--target", str(tmp_path / "nope"), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"--drafter model:.*nope: no such model folder"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
              f"model:{tmp_path / 'nope'}", "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"--target .*text-target: cannot load it as a "
                                         r"vision-language model \(with --image\)"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--image",
              str(ZOO_DIR / "vlm-target" / "sample.png"), "--device", "cpu"])
    # a diffusion LM as the target ran, then reported "DIFFERS from target-only greedy"
    with pytest.raises(SystemExit, match=r"--target .*text-dlm: its config says is_causal=False"):
        main(["generate", "--target", str(ZOO_DIR / "text-dlm"), "--device", "cpu"])
    # an empty path was the current folder, then a hub lookup's "Repo id must use ..."
    with pytest.raises(SystemExit, match=r"--drafter model:: expected a model folder, zoo entry "
                                         r"name or hub id, got ''"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter", "model:",
              "--device", "cpu"])
    # a LLaVA folder as a diffusion drafter: transformers' one-line list of ~250 config classes
    with pytest.raises(SystemExit) as err:
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
              f"diffusion:{ZOO_DIR / 'vlm-target'}", "--device", "cpu", "--no-baseline"])
    message = str(err.value)
    assert "Unrecognized configuration class" in message and "LlavaConfig" in message
    assert len(message) < 300 and "Should be one of" not in message


def test_a_missing_diffusion_drafter_is_named_before_any_hub_lookup(tmp_path, monkeypatch):
    # a bare name (valid as a hub repo id) went to AutoTokenizer first: ~50 s of retried hub
    # requests, then DiffusionDrafter's "path: ... is not a checkpoint folder"
    from mmspec.zoo.paths import ZOO_DIR

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"--drafter diffusion:Dream-v0-Instruct-7B: no model "
                                         r"folder Dream-v0-Instruct-7B, and the hub id "
                                         r"Dream-v0-Instruct-7B is not in the Hugging Face "
                                         r"cache .*; zoo entries: text-dflash, text-dlm"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
              "diffusion:Dream-v0-Instruct-7B", "--device", "cpu"])


def test_the_text_preset_says_where_its_prompt_ends(capsys):
    # the held-out window was never shown: the stream began mid-word ("arting delete", ...)
    from mmspec.zoo.presets import text_preset

    preset = text_preset()
    tail = preset.tokenizer.decode(preset.inputs["input_ids"][0, -16:])
    assert main(["generate", "--target", "text", "--max-new-tokens", "2", "--no-baseline",
                 "--device", "cpu"]) == 0
    assert f"ending {tail!r}" in capsys.readouterr().err
    main(["generate", "--target", "text", "--prompt", "def f(x):", "--max-new-tokens", "2",
          "--no-baseline", "--device", "cpu"])
    assert "held-out" not in capsys.readouterr().err  # a given prompt is the user's own


def test_path_target_mistakes_found_by_a_trial(tmp_path, capsys):
    """A trial run's findings: each was a traceback or a silent choice."""
    import shutil

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from mmspec.zoo.paths import ZOO_DIR

    text = ZOO_DIR / "text-target"
    # prompt-lookup drafts no tree: --tree-top-k was dropped without a word
    with pytest.raises(SystemExit, match="--tree-top-k: prompt-lookup drafts a chain"):
        main(["generate", "--target", str(text), "--tree-top-k", "4", "--prompt", "def f(x):",
              "--device", "cpu"])
    # the default drafter of a PATH target is named
    assert main(["generate", "--target", str(text), "--prompt", "def f(x):",
                 "--max-new-tokens", "4", "--no-baseline", "--device", "cpu"]) == 0
    assert "drafter: prompt-lookup (the default" in capsys.readouterr().err
    # a drafter folder with the target's tokenizer but another vocabulary width: a message, not
    # generate's ValueError in a traceback
    tok = AutoTokenizer.from_pretrained(text)
    wide = tmp_path / "wide"
    LlamaForCausalLM(LlamaConfig(vocab_size=2 * len(tok), hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1)).save_pretrained(wide)
    tok.save_pretrained(wide)
    with pytest.raises(SystemExit, match=r"--drafter model:.*: drafter vocabulary"):
        main(["generate", "--target", str(text), "--drafter", f"model:{wide}", "--prompt",
              "def f(x):", "--max-new-tokens", "4", "--device", "cpu"])
    # a VLM folder without --image: "Unrecognized configuration class LlavaConfig" before
    vlm = tmp_path / "vlm"
    shutil.copytree(ZOO_DIR / "vlm-target", vlm)
    with pytest.raises(SystemExit, match=r"--target .*vlm is a vision-language model "
                                         r"\(LlavaConfig\): pass --image"):
        main(["generate", "--target", str(vlm), "--prompt", "Describe it.", "--device", "cpu"])


def test_a_vlm_without_a_chat_template_takes_a_plain_prompt(tmp_path, capsys):
    # a base checkpoint's processor has no chat template: apply_chat_template's traceback
    import shutil

    from mmspec.zoo.paths import ZOO_DIR

    target = tmp_path / "base-vlm"
    shutil.copytree(ZOO_DIR / "vlm-target", target)
    (target / "chat_template.jinja").unlink()
    assert main(["generate", "--target", str(target), "--image",
                 str(target / "sample.png"), "--max-new-tokens", "4", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "has no chat template; the prompt goes in as '<image token>" in err
    assert "identical to target-only greedy" in err


def test_the_drafter_is_built_once_for_the_warm_up_and_the_timed_run(capsys):
    # a vispec:/diffusion: drafter was loaded from disk twice, its log line printed twice
    from mmspec.zoo.paths import ZOO_DIR

    assert main(["generate", "--target", str(ZOO_DIR / "text-target"), "--prompt", "Once",
                 "--max-new-tokens", "8", "--device", "cpu"]) == 0
    err = capsys.readouterr().err  # the default drafter logs itself when it is made
    assert err.count("drafter: prompt-lookup (the default") == 1
    assert "identical to target-only greedy" in err


def test_eagle_and_official_vispec_checkpoints_run_lossless(tmp_path, capsys):
    """eagle:PATH (SafeAILab layout) on the zoo text target, vispec:PATH in the ViSpec authors'
    layout on the zoo VLM: random weights, so only losslessness is asserted."""
    from tests.eagle.test_drafter import _config, eagle1_state
    from tests.eagle.test_drafter import write as write_eagle
    from tests.vision.test_vispec_official import official_config, official_state
    from tests.vision.test_vispec_official import write as write_vispec

    from mmspec.zoo.paths import ZOO_DIR

    eagle = write_eagle(tmp_path / "eagle", _config(False, d=320, vocab_size=4096),
                        eagle1_state(d=320))
    assert main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
                 f"eagle:{eagle}", "--prompt", "def f(x):", "--max-new-tokens", "6",
                 "--device", "cpu"]) == 0
    assert "identical to target-only greedy" in capsys.readouterr().err
    vispec = write_vispec(tmp_path / "vispec",
                          official_config(False, kv_heads=3, num_attention_heads=3,
                                          hidden_size=192, intermediate_size=384, vocab_size=511),
                          official_state(1, qkv_bias=False, kv_heads=3, d=192, heads=3))
    assert main(["generate", "--target", str(ZOO_DIR / "vlm-target"), "--image",
                 str(ZOO_DIR / "vlm-target" / "sample.png"), "--drafter", f"vispec:{vispec}",
                 "--max-new-tokens", "6", "--device", "cpu"]) == 0
    assert "identical to target-only greedy" in capsys.readouterr().err


def test_a_drafter_folder_as_the_target_is_named_in_full(tmp_path):
    import shutil

    from mmspec.zoo.paths import ZOO_DIR

    # a zoo name is taken wherever a model path is, and a drafter entry says where it goes
    with pytest.raises(SystemExit, match=r"^--target .*vlm-vispec is a ViSpec drafter: pass it "
                                         r"as --drafter vispec:PATH with --target vlm-target$"):
        main(["generate", "--target", "vlm-vispec", "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"^--target .*vlm-eagle3 is an EAGLE-3 drafter: pass it "
                                         r"as --drafter eagle:PATH with --target vlm-target$"):
        main(["generate", "--target", "vlm-eagle3", "--device", "cpu"])
    # without its card: transformers' multi-line message was cut after "... from one of: ";
    # the folder has no tokenizer, and that is what is said first
    bare = tmp_path / "drafter"
    shutil.copytree(ZOO_DIR / "vlm-vispec", bare, ignore=shutil.ignore_patterns("card.json"))
    with pytest.raises(SystemExit) as err:
        main(["generate", "--target", str(bare), "--device", "cpu"])
    assert "\n" not in str(err.value) and "the folder has no tokenizer" in str(err.value)



def test_dflash_checkpoints_run_lossless_and_misfits_are_one_line(tmp_path, capsys):
    """dflash:PATH in the z-lab layout on the zoo text target (random weights: only losslessness
    is asserted); one made for a 3-layer target is named with both layer counts."""
    from transformers import AutoModelForCausalLM

    from tests.diffusion.dflash_reference import dflash_raw_config, random_state, write_checkpoint

    from mmspec.zoo.paths import ZOO_DIR

    target = AutoModelForCausalLM.from_pretrained(ZOO_DIR / "text-target")
    raw = dflash_raw_config(target, layer_ids=[1, 4], mask=4095)
    raw |= {"head_dim": 64, "num_attention_heads": 5, "num_key_value_heads": 1}
    path = write_checkpoint(tmp_path / "dflash", raw, random_state(raw, scale=0.05))
    assert main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
                 f"dflash:{path}", "--prompt", "def f(x):", "--max-new-tokens", "8",
                 "--device", "cpu"]) == 0
    assert "identical to target-only greedy" in capsys.readouterr().err
    raw["num_target_layers"] = 3
    write_checkpoint(tmp_path / "other", raw, random_state(raw, scale=0.05))
    with pytest.raises(SystemExit, match=r"--drafter dflash:.*of a 3-layer target, but the "
                                         r"target Qwen2ForCausalLM has 6 layers"):
        main(["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
              f"dflash:{tmp_path / 'other'}", "--prompt", "x", "--device", "cpu"])
