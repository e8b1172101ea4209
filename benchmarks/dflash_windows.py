"""Candidate DFlash drafters for the zoo text target, side by side on held-out windows that are
not `benchmarks/text.py`'s prompts (so choosing a drafter here does not tune it to those).

    python benchmarks/dflash_windows.py assets/zoo/text-dflash out/try1/final out/try2/final

For each drafter folder: tau (tokens per target forward, bonus included, greedy, every output
token-identical to the target's) of its argmax chain, of DiffuSpec's path search at the table's
settings (beam 3) and of a wider search (beam 6, tau 0.95, lam 0.3), over `--windows` 256-token
windows of the corpus's held-out stream, `--new-tokens` each. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table
from mmspec import generate, zoo
from mmspec.diffusion import CPSConfig, DFlashDrafter
from mmspec.zoo.training.data import eval_windows, token_stream

SEARCHES = {"chain": None, "path search (beam 3)": CPSConfig(beam_width=3),
            "path search (beam 6, tau 0.95, lam 0.3)": CPSConfig(beam_width=6, tau=0.95, lam=0.3)}


def window_tau(target, drafter, windows, new_tokens: int, eos: int) -> float:
    """Tokens per target forward over `windows`, each output checked against target-only."""
    committed = rounds = 0
    for w in windows:
        out = generate(target, drafter, w[None], max_new_tokens=new_tokens, do_sample=False,
                       eos_token_id=eos)
        ref = target.generate(w[None], max_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
        if not torch.equal(out.sequences, ref):
            raise AssertionError(f"{drafter}: output differs from target-only greedy")
        committed, rounds = committed + out.stats.committed, rounds + out.stats.rounds
    return committed / max(rounds, 1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafters", nargs="+", type=Path, help="DFlash drafter folders")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = zoo.load("text-target")
    target, eos = text.model, text.tokenizer.eos_token_id
    windows = list(eval_windows(token_stream(text.tokenizer, "heldout"), 256, args.windows))
    rows = []
    for path in args.drafters:
        row = [str(path)]
        for search in SEARCHES.values():
            drafter = DFlashDrafter.from_pretrained(path, target, path_search=search).eval()
            row.append(f"{window_tau(target, drafter, windows, args.new_tokens, eos):.2f}")
        rows.append(row)
        print(" | ".join(row), flush=True)
    print(markdown_table(["drafter", *SEARCHES], rows))


if __name__ == "__main__":
    main()
