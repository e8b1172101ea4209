"""Text: an EAGLE-3 drafter trained with `python -m mmspec.vision.train --arch eagle3` beside the
zoo's EAGLE-2-style `ModelDrafter` rows, on `benchmarks/text.py`'s held-out prompts, side by side.

    target-only greedy      target.generate(do_sample=False)                    the reference
    ModelDrafter chain      mmspec.generate, text-drafter, 5 greedy tokens       (as text.py)
    ModelDrafter tree       mmspec.generate, text-drafter, EAGLE-2 tree: 16 nodes, top-4, depth 4
    EAGLE-3 chain           mmspec.generate, the EAGLE-3 drafter, 5 greedy tokens
    EAGLE-3 tree            mmspec.generate, the EAGLE-3 drafter, the same EAGLE-2 tree

τ and speedup as in `benchmarks/text.py` (a forward hook counts target calls; speedup = target-only
wall time / the method's, summed over prompts); every mmspec output is asserted token-identical
to target-only greedy. The EAGLE-3 drafter is the zoo's `text-eagle3` unless `--eagle3 PATH` names
another (its training command is on its card and in BENCHMARKS.md).

    python benchmarks/eagle3_text.py [--eagle3 PATH] [--prompts 8] [--prompt-tokens 256]
                                     [--new-tokens 96] [--threads 1] [--repeats 1] [--write]
    python benchmarks/eagle3_text.py --make-data PATH [--samples 320] [--length 64]  # windows
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table, write_section
from benchmarks.text import (
    REF,
    CallCounter,
    Method,
    Total,
    best_runs,
    eagle3_methods,
    engine_run,
    heldout_prompts,
    table,
)
from mmspec import zoo
from mmspec.decoding.drafters import ModelDrafter
from mmspec.zoo.paths import ZOO_DIR


def make_data(path: Path, samples: int, length: int = 64, seed: int = 0) -> None:
    """Training prompts for the EAGLE-3 drafter: `samples` random `length`-token windows of
    the train split's token stream (`mmspec.zoo.training.data`), as `.pt` samples for
    `python -m mmspec.vision.train --data`."""
    from mmspec.zoo.training.data import token_stream

    stream = token_stream(zoo.load("text-target").tokenizer, "train")
    starts = torch.randint(0, len(stream) - length, (samples,),
                           generator=torch.Generator().manual_seed(seed))
    torch.save([{"input_ids": stream[s:s + length][None].clone()} for s in starts.tolist()], path)


def build_methods(target, drafter_model, tree_drafter_model, eagle3_path: Path, eos: int):
    def hf_run(ids, n):
        return target.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=eos,
                               pad_token_id=eos), None, None

    def mm_run(make_drafter):
        return engine_run(target, make_drafter, eos)

    return [
        Method(REF, "reference", hf_run, "`target.generate(do_sample=False)`"),
        Method("ModelDrafter chain", "mmspec", mm_run(lambda: ModelDrafter(drafter_model, 5)),
               "text-drafter, 5 tokens, greedy chain"),
        Method("ModelDrafter tree", "mmspec",
               mm_run(lambda: ModelDrafter(tree_drafter_model, num_tokens=16, top_k=4)),
               "text-drafter, EAGLE-2 tree: 16 nodes, top-4, depth 4"),
        *eagle3_methods(target, eagle3_path, eos),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagle3", type=Path, default=ZOO_DIR / "text-eagle3",
                        help="an EAGLE-3 drafter folder for text-target (default: the zoo's "
                             "text-eagle3)")
    parser.add_argument("--make-data", type=Path, metavar="PATH",
                        help="write the drafter's training prompts to PATH (.pt) and stop")
    parser.add_argument("--samples", type=int, default=320, help="with --make-data")
    parser.add_argument("--length", type=int, default=64,
                        help="with --make-data: tokens per window (the benchmark drafts at "
                             "positions 256-352: 256 covers them)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable)")
    parser.add_argument("--repeats", type=int, default=1, help="best of R timed runs per prompt")
    parser.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    args = parser.parse_args()
    if args.make_data is not None:
        make_data(args.make_data, args.samples, args.length)
        return
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    load_start = os.getloadavg()[0]
    entry = zoo.load("text-target")
    target, eos = entry.model, entry.tokenizer.eos_token_id
    drafter_model = zoo.load("text-drafter").model
    tree_drafter_model = zoo.load("text-drafter").model  # its own copy: the tree switches attention
    counter = CallCounter(target)
    prompts = heldout_prompts(entry.tokenizer, args.prompts, args.prompt_tokens, args.new_tokens)
    methods = build_methods(target, drafter_model, tree_drafter_model, args.eagle3, eos)
    for m in methods:  # warm-up (lazy imports, the engine's admission probe), not timed
        with torch.no_grad():
            m.run(prompts[0].ids, min(8, args.new_tokens))
    totals = {m.name: Total() for m in methods}
    for i, prompt in enumerate(prompts):
        best = best_runs(methods, counter, prompt, args.repeats, args.new_tokens)
        for m in methods:
            run, t = best[m.name], totals[m.name]
            same = torch.equal(run.sequences, best[REF].sequences)
            if m.kind == "mmspec":
                t.draft_time += run.stats.draft_time
                t.verify_time += run.stats.target_forward_time
                t.engine_time += run.stats.engine_time
            t.seconds += run.seconds
            t.new_tokens += run.sequences.shape[1] - prompt.ids.shape[1]
            t.rounds += run.calls - 1
            t.prompts += 1
            t.identical += same
        print(f"prompt {i + 1}/{len(prompts)}: " + ", ".join(
            f"{m.name} {best[m.name].seconds:.2f}s" for m in methods), flush=True)
    load_end = os.getloadavg()[0]
    header, rows = table(methods, totals, {m.name for m in methods if m.kind == "mmspec"})
    named = "the zoo's `text-eagle3`" if args.eagle3.parent == ZOO_DIR else f"`{args.eagle3}`"
    body = "\n".join([
        (f"Zoo target `text-target`, AR drafter `text-drafter` (2 layers, 128 wide), and an "
         f"EAGLE-3 drafter trained with `mmspec.vision.train --arch eagle3` ({named}); "
         f"fp32, batch 1, greedy, {args.threads} thread(s). {len(prompts)} held-out prompts of "
         f"{args.prompt_tokens} tokens (as `benchmarks/text.py`), {args.new_tokens} new tokens, "
         f"best of {args.repeats}. Every mmspec output asserted token-identical to target-only "
         f"greedy."),
        "",
        markdown_table(header, rows),
        "",
        markdown_table(["method", "settings"], [[m.name, m.settings] for m in methods]),
        "",
        (f"Load average (1 min) {load_start:.2f} at the start and {load_end:.2f} at the end, on "
         f"{os.cpu_count()} CPUs, methods interleaved per prompt."),
    ])
    print(markdown_table(header, rows))
    if args.write:
        write_section("text-eagle3", "Text: an EAGLE-3 drafter trained with mmspec beside "
                      "ModelDrafter (`benchmarks/eagle3_text.py`)", body)


if __name__ == "__main__":
    main()
