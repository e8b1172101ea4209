"""`mmspec generate`: speculative decoding from the command line. Streams the answer, then prints
τ, tokens/s and the speedup over target-only decoding of the same input, measured in the same run.

    mmspec generate                                  zoo VLM + ViSpec drafter on the sample scene
    mmspec generate --drafter text-only              ... with the text-only drafter (the ablation)
    mmspec generate --drafter eagle3                 ... with its EAGLE-3 drafter (vlm-eagle3)
    mmspec generate --image scene.png --prompt "What colour is the circle?"
    mmspec generate --target text                    zoo text pair, diffusion drafter (CPS + ADL
                                                     with a CPU-sized block, prefix KV cache)
    mmspec generate --target text --drafter eagle3   ... with its EAGLE-3 drafter (text-eagle3)
    mmspec generate --target builtin --drafter self  built-in random Llama (noise; engine check)
    mmspec generate --target PATH --drafter model:PATH --prompt "..."
    mmspec generate --target PATH --image cat.jpg --drafter vispec:PATH --prompt "Describe it."
    mmspec generate --target PATH --drafter eagle:PATH --prompt "..."
    mmspec generate --target text --drafter dflash   ... with its DFlash drafter (text-dflash)
    mmspec generate --target PATH --drafter dflash:PATH --prompt "..."
    mmspec generate ... --sample --temperature 0.7 --top-p 0.9

Drafters of `--target vlm` and `--target text`: the zoo's, by name (below; the zoo target as a
path, `--target vlm-target` or `text-target`, takes the drafters of a path). Drafters of
`--target PATH_OR_ID` and `builtin`: `prompt-lookup`, `model:PATH_OR_ID` (a small causal LM with
the same vocabulary; chain, or an EAGLE-2 tree with --tree-top-k > 1), `vispec:PATH_OR_ID` (a
ViSpec drafter for this VLM, saved by mmspec or in the ViSpec authors' layout),
`eagle:PATH_OR_ID` (a SafeAILab EAGLE-1/2 or EAGLE-3 drafter for this target),
`dflash:PATH_OR_ID` (a z-lab DFlash or DFlash2 drafter for this target, no remote code),
`diffusion:PATH_OR_ID` (a diffusion LM with the same vocabulary, e.g. Dream, loaded without its
remote code; CPS + ADL with the prefix KV cache), `self` (the target drafts for itself: every
token is accepted, a check of the engine). A PATH_OR_ID is a folder, a zoo entry name or a
Hugging Face hub id (ORG/NAME), found as transformers' from_pretrained finds it: the local
cache first (offline with HF_HUB_OFFLINE=1). Under --sample, chain drafters (`model:`, `self`,
`builtin`, the text preset's `model`) sample as the target does (its temperature, top-k and
top-p; `self` then has every token accepted too); tree nodes are chosen, not sampled.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from mmspec.hub import ModelNotFound, resolve_model
from mmspec.zoo.cards import read_card
from mmspec.zoo.paths import zoo_kind

ZOO_TARGETS = ("vlm", "text")
# the drafters of each zoo target's preset (`mmspec.zoo.presets`), as --help lists them
ZOO_DRAFTERS = {"vlm": ("vispec", "text-only", "eagle3"),
                "text": ("diffusion", "model", "prompt-lookup", "eagle3", "dflash")}


def _number(kind, low, high=None, low_open=False, what=None):
    """argparse type: a `kind` in [low, high] (`low_open`: (low, high]); the error says which."""
    what = what or (f"an int >= {low}" if kind is int else
                    f"a number {'>' if low_open else '>='} {low}"
                    + ("" if high is None else f" and <= {high}"))

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


def _device(text: str) -> torch.device:
    """argparse type of --device: a device this torch can use."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"must be a torch device such as cpu or cuda:0, got "
                                         f"{text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r} needs a CUDA GPU and a CUDA build of torch; "
                                         f"this torch {torch.__version__} sees none (use cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has "
                                         f"{torch.cuda.device_count()} CUDA device(s)")
    return device


def _parser() -> argparse.ArgumentParser:
    zoo = "; ".join(f"--target {t}: {', '.join(names)}" for t, names in ZOO_DRAFTERS.items())
    p = argparse.ArgumentParser(prog="mmspec generate",
                                description=f"{__doc__}\nZoo drafters: {zoo}.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="vlm",
                   help="vlm | text (zoo presets, default vlm) | builtin | PATH_OR_ID: a model "
                        "folder, a zoo entry name (text-target) or a Hugging Face hub id")
    p.add_argument("--drafter", default=None, help="see above (default: the target's own)")
    p.add_argument("--tokenizer", metavar="PATH_OR_ID", default=None,
                   help="where the tokenizer (with --image: the processor) of a --target PATH "
                        "is, when its folder has none (default: the --target folder)")
    p.add_argument("--image", help="an image file, for a vision-language target")
    p.add_argument("--prompt", default=None, help="default: the zoo target's sample input")
    positive = _number(int, 1)
    p.add_argument("--max-new-tokens", type=positive, default=96)
    p.add_argument("--num-draft-tokens", type=positive, default=None,
                   help="draft tokens (tree: node budget; default 5) of a prompt-lookup, model:, "
                        "self or builtin drafter")
    p.add_argument("--tree-top-k", type=positive, default=None,
                   help="> 1 drafts an EAGLE-2 tree (model:, self, builtin drafters; default 1)")
    p.add_argument("--tree-depth", type=positive, default=None)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=_number(float, 0.0, low_open=True), default=None,
                   help="with --sample (default: the target's generation config, else 1.0)")
    p.add_argument("--top-k", type=_number(int, 0), default=None,
                   help="with --sample, 0 for none (default: the target's generation config, "
                        "else 50)")
    p.add_argument("--top-p", type=_number(float, 0.0, 1.0, low_open=True), default=None,
                   help="with --sample (default: the target's generation config, else 1.0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the target-only run (and so the speedup)")
    p.add_argument("--threads", type=positive, default=None,
                   help="torch CPU threads (default: 1 for the zoo's tiny models, whose ops are too "
                        "small to split; torch's default otherwise)")
    p.add_argument("--device", type=_device,
                   default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def _log(msg: str) -> None:
    print(f"[mmspec] {msg}", file=sys.stderr, flush=True)


def _open_image(path: str):
    """--image as an RGB PIL image; a missing or unreadable file is a message naming it."""
    from mmspec.zoo.vlm_processor import open_image

    try:
        return open_image(path)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"--image: {err}") from None


def _zoo_preset(args):
    from mmspec.zoo import presets

    if args.image is not None and args.target != "vlm":
        raise SystemExit("--image needs a vision-language --target (vlm or a VLM path)")
    if args.target == "vlm":
        if args.image is not None:
            _open_image(args.image)  # named before the models load, not in a traceback after
        return presets.vlm_preset(args.image, args.prompt)
    return presets.text_preset(args.prompt)


def _load_path_target(args):
    """-> (model, tokenizer, inputs dict); `inputs` holds input_ids and any image tensors."""
    if args.target == "builtin":
        from mmspec.decoding.builtin import CharTokenizer, builtin_model

        _log("target: built-in random Llama (4 layers, character vocabulary), made on the fly; "
             "its text is noise. Pass --target vlm, text or a PATH for a real model.")
        if args.image is not None:
            raise SystemExit("--image needs a vision-language --target")
        tok = CharTokenizer()
        prompt = ("The quick brown fox jumps over the lazy dog. The quick" if args.prompt is None
                  else args.prompt)
        return builtin_model(), tok, {"input_ids": torch.tensor([tok.encode(prompt)])}
    import transformers

    default = "Hello" if args.image is None else "Describe the image."
    prompt = default if args.prompt is None else args.prompt
    _refuse_zoo_drafter_as_target(args.target)
    tok_flag, tok_path = _tokenizer_source(args)
    if args.image is not None:
        from mmspec.zoo.vlm_processor import vlm_inputs

        image = _open_image(args.image)
        with load_errors("--target", args.target, "a vision-language model (with --image)"):
            processor = transformers.AutoProcessor.from_pretrained(tok_path)
            model = transformers.AutoModelForImageTextToText.from_pretrained(args.target,
                                                                             dtype="auto")
        if getattr(processor, "chat_template", None) is None:  # failed with a traceback
            _log(f"--target {args.target}: its processor has no chat template; the prompt goes "
                 f"in as '<image token>\\n{prompt}'")
        return model, processor.tokenizer, vlm_inputs(processor, image, prompt)
    with load_errors(tok_flag, tok_path, "a tokenizer"):
        tok = transformers.AutoTokenizer.from_pretrained(tok_path)
    inputs = dict(tok(prompt, return_tensors="pt"))
    if inputs["input_ids"].numel() == 0:  # transformers 5 builds an empty tokenizer from nothing
        raise SystemExit(f"--prompt: the tokenizer of {tok_flag} {tok_path} encodes {prompt!r} "
                         f"to no tokens ({len(tok)} in its vocabulary: does the folder hold the "
                         f"tokenizer files?)")
    with load_errors("--target", args.target, "a causal LM"):
        config = transformers.AutoConfig.from_pretrained(args.target)
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    # a VLM that AutoModelForCausalLM cannot load (LLaVA, Qwen2.5-VL; Gemma 3 it can)
    if (getattr(config, "vision_config", None) is not None
            and type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING):
        raise SystemExit(f"--target {args.target} is a vision-language model "
                         f"({type(config).__name__}): pass --image")
    if getattr(config, "is_causal", True) is False:  # ran, then "DIFFERS from target-only"
        raise SystemExit(f"--target {args.target}: its config says is_causal=False, a diffusion "
                         f"LM; it drafts (--drafter diffusion:{args.target}) for a causal target")
    with load_errors("--target", args.target, "a causal LM"):
        model = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype="auto")
    return model, tok, inputs


# files of which a saved tokenizer has at least one (transformers' fast, slow and tiktoken ones)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.tiktoken")


def _tokenizer_source(args) -> tuple[str, str]:
    """(flag, folder) of the target's tokenizer: --tokenizer, else the --target folder, which
    must hold one (without, transformers' error blamed sentencepiece and tiktoken)."""
    if args.tokenizer is not None:
        return "--tokenizer", args.tokenizer
    if not any((Path(args.target) / name).is_file() for name in TOKENIZER_FILES):
        raise SystemExit(f"--target {args.target}: the folder has no tokenizer (none of "
                         f"{', '.join(TOKENIZER_FILES[:3])}, ...): pass --tokenizer PATH_OR_ID, "
                         f"the folder or hub id of the model's tokenizer")
    return "--target", args.target


def model_folder(flag: str, path: str) -> str:
    """The local folder of a model flag's folder, zoo name or hub id (`mmspec.hub.resolve_model`:
    local first, then the Hugging Face cache); a miss is one line naming the flag, not
    transformers' 'Repo id must use alphanumeric chars' of a hub lookup."""
    if not path:  # Path("") is the current folder, which is a folder
        raise SystemExit(f"{flag}: expected a model folder, zoo entry name or hub id, got ''")
    try:
        return str(resolve_model(path))
    except ModelNotFound as err:
        raise SystemExit(f"{flag}: {err}") from None


# zoo entries that are no target, and what to do with them instead
_NOT_TARGETS = {"vispec": "a ViSpec drafter: pass it as --drafter vispec:PATH with --target "
                          "{target}",
                "eagle3": "an EAGLE-3 drafter: pass it as --drafter eagle:PATH with --target "
                          "{target}",
                "video-dit": "a video DiT: python -m mmspec.video_dit.generate --model PATH "
                             "makes videos with it"}


def _refuse_zoo_drafter_as_target(path: str) -> None:
    """A zoo drafter or video entry as --target failed deep in transformers (a tokenizer message
    cut off after "one of: "): named here, with where it goes instead."""
    kind = zoo_kind(path)
    if kind in _NOT_TARGETS:
        target = read_card(path).get("target", "its target")
        raise SystemExit(f"--target {path} is {_NOT_TARGETS[kind].format(target=target)}")


@contextmanager
def load_errors(flag: str, path: str, what: str):
    try:
        yield
    except (OSError, ValueError, KeyError) as err:  # no config/weights, an unknown class
        # whole, on one line (its first line was "...from one of: "), but not the list of
        # every config class transformers knows
        text = " ".join(str(err).split()).split(" Should be one of")[0].split(
            " Model type should be one of")[0]
        raise SystemExit(f"{flag} {path}: cannot load it as {what}: "
                         f"{text or type(err).__name__}") from None


def _folder_tokenizer(path: str):
    """The tokenizer saved in a model folder, or None (none there, or one needing remote code)."""
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(path)
    except Exception:  # noqa: BLE001 (nothing to compare with: the check is skipped)
        return None
    return tok if len(tok) > 1 else None  # transformers 5 makes an empty one from nothing


def _same_vocabulary(kind: str, path: str, target_tokenizer) -> None:
    """Refuse a drafter folder whose tokenizer maps ids to other tokens than the target's (its
    drafts would be lossless but almost never accepted). A folder without a tokenizer that loads
    offline is not checked."""
    from mmspec.diffusion.vocab import drafter_only_ids

    if target_tokenizer is None or not hasattr(target_tokenizer, "get_vocab"):
        return
    tok = _folder_tokenizer(path)
    if tok is None:
        return
    try:
        drafter_only_ids(tok, target_tokenizer, len(tok) + len(target_tokenizer))
    except ValueError as err:
        raise SystemExit(f"--drafter {kind}: {err}") from None


def _path_drafter(args, target, target_tokenizer=None):
    from mmspec.decoding import ModelDrafter, PromptLookupDrafter

    kind = args.drafter or ("builtin" if args.target == "builtin" else "prompt-lookup")
    if args.drafter is None:
        _log(f"drafter: {kind} (the default for --target {args.target}; see --drafter)")
    if kind.startswith(("vispec:", "eagle:", "diffusion:", "dflash:")):
        _refuse_draft_shape(args, f"--drafter {kind.split(':')[0]}:PATH")
    num_tokens = 5 if args.num_draft_tokens is None else args.num_draft_tokens
    if kind == "prompt-lookup":
        given = [flag for flag, value in (("--tree-top-k", args.tree_top_k),
                                          ("--tree-depth", args.tree_depth)) if value is not None]
        if given:  # dropped without a word before
            raise SystemExit(f"{', '.join(given)}: prompt-lookup drafts a chain of copied "
                             f"tokens (--num-draft-tokens sets its length); trees are for "
                             f"model:PATH, self and builtin drafters")
        return PromptLookupDrafter(num_tokens=num_tokens)
    if kind.startswith(("vispec:", "eagle:")):
        from mmspec.eagle import EagleDrafter
        from mmspec.vision import ViSpecDrafter

        name, path = kind.split(":", 1)
        loader = ViSpecDrafter if name == "vispec" else EagleDrafter
        try:
            drafter = loader.from_pretrained(path, target)
        except (FileNotFoundError, ValueError, TypeError) as err:
            raise SystemExit(f"--drafter {kind}: {err}") from None
        return drafter.to(args.device)
    if kind.startswith("dflash:"):
        from mmspec.diffusion import DFlashDrafter

        try:
            return DFlashDrafter.from_pretrained(kind[len("dflash:"):], target)
        except (FileNotFoundError, ValueError) as err:
            raise SystemExit(f"--drafter {kind}: {err}") from None
    if kind.startswith("diffusion:"):
        import dataclasses

        from mmspec.diffusion import DiffusionDrafter

        path = kind[len("diffusion:"):]
        tok = _folder_tokenizer(path) if hasattr(target_tokenizer, "get_vocab") else None
        pair = {} if tok is None else {"tokenizer": tok, "target_tokenizer": target_tokenizer}
        try:  # with both tokenizers, ids are compared and DLM-only specials suppressed
            drafter = DiffusionDrafter.from_pretrained(path, target, **pair)
        except (FileNotFoundError, ValueError, NotImplementedError) as err:
            # transformers lists every config class it knows on one line: its first sentence
            first = str(err).strip().splitlines()[0].split(". Should be one of")[0]
            raise SystemExit(f"--drafter {kind}: {first}") from None
        # the prefix KV cache: approximate for a bidirectional DLM, lossless all the same
        drafter.config = dataclasses.replace(drafter.config, prefix_cache=True)
        return drafter.to(args.device)
    if kind == "self":
        model = target
    elif kind == "builtin":
        from mmspec.decoding.builtin import builtin_model

        model = builtin_model(layers=1, hidden=128, seed=args.seed + 1)
    elif kind.startswith("model:"):
        import transformers

        path = kind[len("model:"):]
        _same_vocabulary(kind, path, target_tokenizer)
        with load_errors("--drafter", kind, "a causal LM"):
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    else:
        raise SystemExit(f"--drafter must be prompt-lookup, model:PATH, vispec:PATH, "
                         f"eagle:PATH, dflash:PATH, diffusion:PATH, self or builtin for --target "
                         f"{args.target}, got {kind!r}")
    top_k = 1 if args.tree_top_k is None else args.tree_top_k
    if args.sample and top_k > 1:
        _log("--sample with a tree: its nodes are chosen, not sampled "
             "(still exact, fewer accepted)")
    # under --sample a chain samples as the target does (temperature, top-k, top-p): a drafter
    # proposing argmax tokens gets only p(argmax) of them accepted
    return ModelDrafter(model.to(args.device), num_tokens=num_tokens, top_k=top_k,
                        depth=args.tree_depth, sample=top_k == 1)


def _on_device(drafter, device):
    """Move a drafter (the zoo presets build theirs on the CPU) to `device` (`Drafter.to`; one
    sharing the target's weights finds them there already); returns it."""
    from mmspec.decoding.draft import as_drafter

    as_drafter(drafter).to(device)
    return drafter


def _refuse_draft_shape(args, who: str) -> None:
    """The zoo presets and the ViSpec / diffusion drafters keep their own draft shapes."""
    given = [flag for flag, value in (("--num-draft-tokens", args.num_draft_tokens),
                                      ("--tree-top-k", args.tree_top_k),
                                      ("--tree-depth", args.tree_depth)) if value is not None]
    if given:
        raise SystemExit(f"{', '.join(given)}: {who} drafts with its own settings (zoo presets: "
                         f"mmspec.zoo.presets; ViSpec: its saved tree; the ViSpec authors' and "
                         f"EAGLE drafters: their own defaults; DiffuSpec: ADL; DFlash: its "
                         f"block); these flags apply to prompt-lookup, model:PATH, self and "
                         f"builtin drafters")


def _setup(args):
    """-> (target, tokenizer, inputs, make_drafter, eos_token_id, description)."""
    if args.target in ZOO_TARGETS:
        preset = _zoo_preset(args)
        name = args.drafter or preset.default_drafter
        if name not in preset.drafters and (":" in name or name == "self"):
            raise SystemExit(f"--drafter {name}: --target {args.target} takes the zoo's drafters "
                             f"({', '.join(preset.drafters)}); pass the zoo target as a path, "
                             f"--target {args.target}-target, for this one")
        if name not in preset.drafters:
            raise SystemExit(f"--drafter for --target {args.target} must be one of "
                             f"{sorted(preset.drafters)}, got {name!r}")
        _refuse_draft_shape(args, f"--target {args.target}")
        _log(f"{preset.description}; drafter: {name}")
        if args.target == "text" and args.prompt is None:  # the stream goes on mid-line
            ids = preset.inputs["input_ids"][0]
            _log(f"prompt: a held-out stdlib window of {ids.numel()} tokens, ending "
                 f"{preset.tokenizer.decode(ids[-16:])!r}")
        return (preset.target, preset.tokenizer, preset.inputs, preset.drafters[name],
                preset.eos_token_id)
    target, tokenizer, inputs = _load_path_target(args)
    return target, tokenizer, inputs, lambda: _path_drafter(args, target, tokenizer), None


def _how_it_ended(answer: torch.Tensor, max_new_tokens: int, eos) -> str:
    """One line: whether the answer `[n]` ended at an end-of-text token or was cut at the limit
    (`make run` stopped mid-sentence without saying so)."""
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    if len(answer) and int(answer[-1]) in eos_ids:
        return f"the answer ended with its end-of-text token after {len(answer)} tokens"
    return (f"the answer stopped at the token limit (--max-new-tokens {max_new_tokens}), before "
            f"an end-of-text token")


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # folders, zoo entry names and hub ids wherever a path goes, found before anything loads
    if args.target not in (*ZOO_TARGETS, "builtin"):
        args.target = model_folder("--target", args.target)
    if args.drafter and ":" in args.drafter:
        kind, _, path = args.drafter.partition(":")
        args.drafter = f"{kind}:{model_folder(f'--drafter {args.drafter}', path)}"
    if args.tokenizer is not None:
        if args.target in (*ZOO_TARGETS, "builtin"):
            parser.error(f"--tokenizer applies to a --target PATH_OR_ID; --target "
                         f"{args.target} brings its own")
        args.tokenizer = model_folder("--tokenizer", args.tokenizer)
    given = [f"--{n.replace('_', '-')}" for n in ("temperature", "top_k", "top_p")
             if getattr(args, n) is not None]
    if given and not args.sample:  # greedy would ignore them without a word
        verb = "apply" if len(given) > 1 else "applies"
        parser.error(f"{', '.join(given)} {verb} with --sample only (without it decoding is "
                     f"greedy)")
    if args.prompt is not None and not args.prompt.strip():  # never replaced by a default
        parser.error(f"--prompt must be non-empty text, got {args.prompt!r} (leave it out for "
                     f"the target's default prompt)")
    threads = args.threads or (1 if args.target in ZOO_TARGETS else None)
    if threads is not None:
        torch.set_num_threads(threads)
    import transformers
    from transformers import TextStreamer

    from mmspec.decoding import generate
    from mmspec.decoding.vocab import VocabularyMismatch

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    target, tokenizer, inputs, make_drafter, eos = _setup(args)
    target = target.to(args.device).eval()
    inputs = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    sampling = dict(do_sample=args.sample, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p)

    drafters = []  # built once: the warm-up and the timed run share it (it resets per call)

    def speculative(n, streamer=None):
        if not drafters:  # a vispec:/diffusion: drafter was loaded from disk twice
            drafters.append(_on_device(make_drafter(), args.device))
        drafter = drafters[0]
        torch.manual_seed(args.seed)  # after building: both calls sample from one state
        try:
            return generate(target, drafter, max_new_tokens=n, eos_token_id=eos,
                            streamer=streamer, **sampling, **inputs)
        except VocabularyMismatch as err:  # checked before any work
            raise SystemExit(f"--drafter {args.drafter}: {err}") from None

    def target_only(n):
        torch.manual_seed(args.seed)
        with torch.no_grad():
            # eos_token_id=None passed to transformers turns EOS off: leave it to the
            # generation config as `mmspec.generate` does
            stop = {} if eos is None else {"eos_token_id": eos}
            return target.generate(**inputs, max_new_tokens=n, **stop,
                                   **{k: v for k, v in sampling.items() if v is not None})

    if not args.no_baseline:  # first calls pay lazy imports and allocator growth: not timed
        speculative(2)
        target_only(2)
    # special tokens (EOS, pad, <image>) are not text: transformers' TextStreamer prints them
    out = speculative(args.max_new_tokens,
                      TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    stats = out.stats
    _log(str(stats))
    _log(_how_it_ended(out.sequences[0, inputs["input_ids"].shape[1]:], args.max_new_tokens,
                       target.generation_config.eos_token_id if eos is None else eos))
    if args.no_baseline:
        return 0
    start = time.perf_counter()
    reference = target_only(args.max_new_tokens)
    seconds = time.perf_counter() - start
    new = reference.shape[1] - inputs["input_ids"].shape[1]
    baseline_tps = new / seconds
    line = (f"τ {stats.mean_accepted:.2f} tokens per target forward "
            f"({stats.mean_accepted_no_bonus:.2f} without the bonus token); "
            f"{stats.tokens_per_s:.1f} tokens/s against {baseline_tps:.1f} target-only: "
            f"speedup {stats.tokens_per_s / baseline_tps:.2f}x")
    if not args.sample:
        same = torch.equal(out.sequences, reference)
        line += "; identical to target-only greedy" if same else "; DIFFERS from target-only greedy"
        _log(line)
        return 0 if same else 1
    _log(line + " (sampling: the two runs draw different texts from the same distribution)")
    return 0
