"""Candidate text DLM drafters against the shipped `text-dlm`, side by side (CPS + ADL).

    python benchmarks/dlm_compare.py --candidate out/zoo-try [--candidate out/zoo-try2 ...]

For deciding whether a retrained diffusion drafter should replace the shipped one: the same
held-out prompts as `benchmarks/text.py`, target-only greedy as the reference, then every drafter
with and without the prefix KV cache, interleaved per prompt, best of `--repeats`. Every output is
asserted token-identical to target-only greedy. Prints a markdown table; `--write` puts it in
BENCHMARKS.md (section `dlm_compare`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table, write_section
from benchmarks.text import heldout_prompts
from mmspec import zoo
from mmspec.decoding import generate
from mmspec.diffusion import DiffusionDrafter, DiffusionDrafterConfig
from mmspec.diffusion.adl import ADLConfig


def best_of(repeats: int, fn):
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        if best is None or seconds < best[0]:
            best = (seconds, out)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", type=Path, required=True, action="append",
                        help="a zoo folder holding a text-dlm/ entry (repeatable)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--adl", type=int, nargs=2, metavar=("K_MIN", "K_MAX"), default=None,
                        help="ADL's block range (default: the paper's 20 30; the zoo preset's "
                             "CPU range is mmspec.zoo.registry.ZOO_DLM_K)")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--section", default="dlm_compare", help="BENCHMARKS.md section name")
    parser.add_argument("--title", default="A retrained text DLM against the shipped one")
    args = parser.parse_args()
    for folder in args.candidate:
        if not (folder / "text-dlm" / "config.json").is_file():
            parser.error(f"--candidate {folder}: expected a folder with text-dlm/config.json "
                         f"in it")
    torch.set_num_threads(args.threads)
    adl = ADLConfig() if args.adl is None else ADLConfig(*args.adl)  # checks the range
    entry = zoo.load("text-target")
    target, tok = entry.model, entry.tokenizer
    eos = tok.eos_token_id
    dlms = {"shipped": zoo.load("text-dlm")}
    dlms.update({f"candidate {i + 1}": zoo.load("text-dlm", folder)
                 for i, folder in enumerate(args.candidate)})
    prompts = heldout_prompts(tok, args.prompts, 256, args.new_tokens)
    kinds = [(name, cache) for name in dlms for cache in (False, True)]
    totals = {kind: [0, 0, 0.0] for kind in kinds}  # tokens committed, rounds, seconds
    reference_s = 0.0
    with torch.no_grad():
        for prompt in prompts:
            seconds, ref = best_of(args.repeats, lambda: target.generate(
                prompt.ids, max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=eos,
                pad_token_id=eos))
            reference_s += seconds
            for name, cache in kinds:
                dlm = dlms[name]

                def run():
                    drafter = DiffusionDrafter(
                        dlm.model, dlm.mask_token_id, target, eos_token_id=eos,
                        config=DiffusionDrafterConfig(shift=dlm.shift, prefix_cache=cache,
                                                      adl=adl))
                    return generate(target, drafter, prompt.ids, max_new_tokens=args.new_tokens,
                                    do_sample=False, eos_token_id=eos)

                seconds, out = best_of(args.repeats, run)
                if not torch.equal(out.sequences, ref):
                    raise AssertionError(f"{name} (prefix_cache={cache}) differs from target-only "
                                         f"greedy on {prompt.file}")
                total = totals[name, cache]
                total[0] += out.stats.committed
                total[1] += out.stats.row_rounds
                total[2] += seconds
    rows = [[name, "yes" if cache else "no", f"{acc / rounds:.2f}", f"{reference_s / secs:.2f}x"]
            for (name, cache), (acc, rounds, secs) in totals.items()]
    body = (
        "".join(f"Candidate {i + 1} ({folder}): `{dlms[f'candidate {i + 1}'].card['command']}`"
                f"\n\n" for i, folder in enumerate(args.candidate))
        + f"{len(prompts)} held-out prompts of 256 tokens (as `benchmarks/text.py`), "
        f"{args.new_tokens} new tokens, CPS defaults, ADL k in [{adl.k_min}, {adl.k_max}]; τ "
        f"with the bonus token; speedup = "
        f"target-only wall time / the method's, summed over prompts. All outputs token-identical "
        f"to target-only greedy. Load average {os.getloadavg()[0]:.2f} at the end.\n\n"
        + markdown_table(["DLM drafter", "prefix KV cache", "τ", "speedup vs target-only"], rows)
        + "\n")
    print(body)
    if args.write:
        write_section(args.section, f"{args.title} (`benchmarks/dlm_compare.py`)", body)


if __name__ == "__main__":
    main()
