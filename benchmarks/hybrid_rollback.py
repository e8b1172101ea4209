"""What rolling back a hybrid linear-attention target costs per round (issue 29, item 4).

A Qwen3-Next-shaped target (3 gated-delta-rule linear-attention layers to 1 full-attention layer,
random weights, fp32) decodes greedily with an oracle chain drafter: 4 of the target's own next
tokens per round, of which the first `accept` are right. Every round that rejects a token
restores the snapshotted recurrent states and feeds the committed tokens again
(`mmspec/decoding/recurrent.py`); a round that accepts all 4 needs no replay. Side by side in one
run, per acceptance: the verification forward per round, the snapshot copy and the replay
forward, and the replay's share of a round's target time; the output is compared with
`target.generate`. The snapshot is part of the engine's time.

    python benchmarks/hybrid_rollback.py [--write] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import markdown_table, write_section  # noqa: E402
from mmspec import Draft, generate  # noqa: E402
from mmspec.decoding import recurrent  # noqa: E402

DRAFT = 4


def target():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(vocab_size=4096, hidden_size=512, intermediate_size=1024,
                          num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                          linear_key_head_dim=64, linear_value_head_dim=64,
                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                          shared_expert_intermediate_size=512, decoder_sparse_step=1,
                          max_position_embeddings=4096, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    return model


class Oracle:
    """The target's next DRAFT tokens, every one after the first `accept` wrong."""

    def __init__(self, ref, prompt_len, accept):
        self.ref, self.start, self.accept = ref, prompt_len, accept

    def propose(self, state):
        n = min(DRAFT, state.max_tokens)
        done = int(state.attention_mask.sum()) - self.start
        at = self.start + done
        truth = self.ref[:, at:at + n].clone()
        truth[:, self.accept:] = (truth[:, self.accept:] + 1) % 4096
        return Draft.chain(truth[:, :n])

    def update(self, result):
        pass


def snapshot_time(model, ids) -> float:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    layers = recurrent.recurrent_layers(cache)
    start = time.perf_counter()
    for _ in range(20):
        recurrent.snapshot(layers)
    return (time.perf_counter() - start) / 20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the BENCHMARKS.md section")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = target()
    ids = torch.randint(1, 4096, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        ref = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
        plain = time.perf_counter() - t0
    snap = snapshot_time(model, ids)
    rows = []
    for accept in (0, 1, 2, 3, 4):
        t0 = time.perf_counter()
        out = generate(model, Oracle(ref, ids.shape[1], accept), ids,
                       max_new_tokens=args.new_tokens, do_sample=False)
        wall = time.perf_counter() - t0
        s = out.stats
        verify = (s.target_forward_time - s.replay_time) / s.rounds
        replay = s.replay_time / max(s.replays, 1)
        rows.append([accept, s.rounds, s.replays, f"{verify * 1e3:.1f}",
                     f"{replay * 1e3:.1f}" if s.replays else "-", f"{snap * 1e3:.2f}",
                     f"{s.replay_time / s.target_forward_time:.0%}",
                     f"{plain / wall:.2f}x", "yes" if torch.equal(out.sequences, ref) else "NO"])
        print(rows[-1], flush=True)
    header = ["accepted of 4", "rounds", "replays", "verify fwd ms", "replay fwd ms",
              "snapshot ms", "replay share of target time", "speedup vs generate", "identical"]
    table = markdown_table(header, rows)
    print(table)
    if args.write:
        body = (f"Target: Qwen3-Next-shaped, 8 layers (6 linear attention, 2 full), hidden 512, "
                f"4 experts, random weights, fp32; prompt 64 tokens, {args.new_tokens} new; an "
                f"oracle chain of {DRAFT} tokens with the first *accepted* right. Every round "
                f"that rejects a token replays the committed ones after restoring the "
                f"snapshotted states.\n\n{table}\n\n"
                f"Reading: a replay is one more target forward of the committed tokens, so a "
                f"round that rejects costs about two forwards instead of one; with 4 of 4 "
                f"accepted no round replays. The snapshot (a copy of every layer's conv and "
                f"recurrent state) is the fixed part paid by every round.")
        write_section("hybrid_rollback", "Hybrid linear-attention targets: rollback cost "
                      "(CPU)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
