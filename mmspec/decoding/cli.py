"""`mmspec generate`: speculative decoding from the command line; streams the text, prints the stats.

    mmspec generate --prompt "Hello"                              built-in random target (noise)
    mmspec generate --target PATH --drafter model:PATH --prompt "..."
    mmspec generate --target PATH --image cat.jpg --prompt "Describe the image."
    mmspec generate ... --sample --temperature 0.7 --top-p 0.9

Drafters: `prompt-lookup` (default), `model:PATH` (a small model with the same vocabulary; chain,
or an EAGLE-2 tree with --tree-top-k > 1), `self` (the target drafts for itself: every token is
accepted, a check of the engine), `builtin` (a 1-layer random model, for the built-in target).
"""

from __future__ import annotations

import argparse
import sys

import torch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmspec generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="Hugging Face model id or path (default: built-in random model)")
    p.add_argument("--drafter", default="prompt-lookup",
                   help="prompt-lookup | model:PATH | self | builtin (default: prompt-lookup)")
    p.add_argument("--image", help="an image file, for a vision-language target")
    p.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog. The quick")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-draft-tokens", type=int, default=5, help="draft tokens (tree: node budget)")
    p.add_argument("--tree-top-k", type=int, default=1, help="> 1 drafts an EAGLE-2 tree")
    p.add_argument("--tree-depth", type=int, default=None)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def _load_target(args):
    """-> (model, tokenizer, inputs dict); `inputs` holds input_ids and any image tensors."""
    if args.target is None:
        from .builtin import CharTokenizer, builtin_model

        print("[mmspec] target: built-in random Llama (4 layers, character vocabulary), made on the fly; "
              "its text is noise. Pass --target PATH for a real model.", file=sys.stderr)
        if args.image:
            raise SystemExit("--image needs a vision-language --target")
        tok = CharTokenizer()
        return builtin_model(), tok, {"input_ids": torch.tensor([tok.encode(args.prompt)])}
    import transformers

    if args.image:
        from PIL import Image

        processor = transformers.AutoProcessor.from_pretrained(args.target)
        model = transformers.AutoModelForImageTextToText.from_pretrained(args.target, dtype="auto")
        messages = [{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": args.prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(images=Image.open(args.image).convert("RGB"), text=text,
                           return_tensors="pt")
        return model, processor.tokenizer, dict(inputs)
    tok = transformers.AutoTokenizer.from_pretrained(args.target)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype="auto")
    return model, tok, dict(tok(args.prompt, return_tensors="pt"))


def _make_drafter(args, target):
    from . import ModelDrafter, PromptLookupDrafter

    kind = args.drafter
    if kind == "prompt-lookup":
        return PromptLookupDrafter(num_tokens=args.num_draft_tokens)
    if kind == "self":
        model = target
    elif kind == "builtin":
        from .builtin import builtin_model

        model = builtin_model(layers=1, hidden=128, seed=args.seed + 1)
    elif kind.startswith("model:"):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(kind[len("model:"):], dtype="auto")
    else:
        raise SystemExit(f"--drafter must be prompt-lookup, model:PATH, self or builtin, got {kind!r}")
    return ModelDrafter(model.to(args.device), num_tokens=args.num_draft_tokens,
                        top_k=args.tree_top_k, depth=args.tree_depth)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from transformers import TextStreamer

    from . import generate

    torch.manual_seed(args.seed)
    target, tokenizer, inputs = _load_target(args)
    target = target.to(args.device).eval()
    inputs = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    drafter = _make_drafter(args, target)
    streamer = TextStreamer(tokenizer, skip_prompt=True)
    out = generate(target, drafter, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   streamer=streamer, **inputs)
    print(f"\n[mmspec] {out.stats}", file=sys.stderr)
    return 0
