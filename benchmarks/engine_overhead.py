"""The speculative engine's own cost per round, as a % of one target forward. Bar: <= 10%.

Per round, `generate` times the drafter's calls (`propose`, `update`), the target's verification
forward, and the rest: state, tree and mask building, verification, the KV path commit and the
bookkeeping. That rest is the engine's overhead (`SpecStats.engine_time`). It is measured side by
side with the target forwards of the same rounds, so the ratio needs no second run.

The target is a small random Llama (8 layers, hidden 512, vocabulary 32000, about 60M parameters)
on CPU with a 256-token prompt. The drafters propose fixed-shape random drafts, so acceptance
is low and every round runs the full draft-verify-commit path; their own time is excluded anyway.

    python benchmarks/engine_overhead.py [--write] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table, write_section
from mmspec import Draft, generate

BAR = 10.0  # issue 4: engine overhead <= 10% of a target forward


def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
                      max_position_embeddings=2048, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


class FixedShapeDrafter:
    """Random tokens in a fixed tree: a chain of `n`, or `width` siblings per level, `n` nodes."""

    def __init__(self, n: int, width: int = 1, vocab: int = 32000):
        self.n, self.vocab = n, vocab
        self.parents = torch.tensor([i - width if i >= width else -1 for i in range(n)])
        if width == 1:
            self.parents = torch.arange(-1, n - 1)
        self.g = torch.Generator().manual_seed(0)

    def propose(self, state):
        n = min(self.n, state.max_tokens)
        b = state.input_ids.shape[0]
        tokens = torch.randint(0, self.vocab, (b, n), generator=self.g)
        return Draft(tokens, self.parents[:n])

    def update(self, result):
        pass


def measure(target, drafter, batch: int, prompt_len: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 32000, (batch, prompt_len), generator=g)
    generate(target, drafter, ids, max_new_tokens=4, eos_token_id=[])  # warm-up
    s = generate(target, drafter, ids, max_new_tokens=new_tokens, eos_token_id=[]).stats
    forward = s.target_forward_time / s.rounds
    engine = s.engine_time / s.rounds
    return {"rounds": s.rounds, "forward_ms": 1e3 * forward, "engine_ms": 1e3 * engine,
            "pct": 100 * engine / forward}


def build_parser() -> argparse.ArgumentParser:
    """The command line (`mmspec bench` reads its options here)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="write the section of BENCHMARKS.md")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = small_llama()
    cases = [
        ("chain of 5 (SDPA path)", FixedShapeDrafter(5), 1),
        ("tree of 16, 4 wide (block-sparse path)", FixedShapeDrafter(16, width=4), 1),
        ("tree of 16, 4 wide, batch 4", FixedShapeDrafter(16, width=4), 4),
    ]
    rows, results = [], []
    for name, drafter, batch in cases:
        r = measure(target, drafter, batch, 256, args.new_tokens)
        results.append(r)
        ok = "yes" if r["pct"] <= BAR else "NO"
        rows.append([name, batch, r["rounds"], f"{r['forward_ms']:.1f}", f"{r['engine_ms']:.2f}",
                     f"{r['pct']:.1f}%", ok])
        print(f"{name:42s} B={batch} forward {r['forward_ms']:7.1f} ms  engine {r['engine_ms']:6.2f} ms"
              f"  = {r['pct']:5.1f}% of a forward  (bar {BAR:.0f}%: {ok})")
    chain, tree = results[0], results[1]  # both batch 1
    slower = tree["forward_ms"] / chain["forward_ms"]
    tree_vs_chain = 100 * tree["engine_ms"] / chain["forward_ms"]
    print(f"tree forward / chain forward: {slower:.2f}x; tree engine / chain forward: "
          f"{tree_vs_chain:.1f}%")
    body = (
        "Engine overhead per round (everything but the drafter's calls and the target's "
        "verification forward: state, tree and mask building, verification, KV path commit, "
        "bookkeeping) as a % of one target verification forward, measured in the same rounds. "
        f"Target: random Llama, 8 layers, hidden 512, vocab 32000 (~60M parameters), fp32, "
        f"256-token prompt, {args.new_tokens} new tokens, {args.threads} thread(s). "
        f"Bar: <= {BAR:.0f}%.\n\n"
        + markdown_table(["draft", "batch", "rounds", "target forward (ms)", "engine (ms)",
                          "engine / forward", f"<= {BAR:.0f}%"], rows)
        + "\n\nThe CPU is shared with other jobs, so absolute times vary from run to run; the ratio "
        "is taken within one run. A tree round's forward runs 16 draft tokens through the shared "
        f"block-sparse layer and costs {slower:.2f}x a chain round's, which runs 5 through SDPA "
        "(batch 1, this run); against the chain's forward the tree rounds' engine cost is "
        f"{tree_vs_chain:.1f}%, {'under' if tree_vs_chain <= BAR else 'over'} the bar."
    )
    if args.write:
        write_section("engine_overhead", "Speculative engine overhead per round (issue 4)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
