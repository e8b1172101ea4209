"""Ship an EAGLE-3 drafter trained with `python -m mmspec.vision.train --arch eagle3` as a zoo
entry (kind `eagle3`): fp16, without the embedding (the target's, as SafeAILab's EAGLE-3
checkpoints leave it out), with a model card measured here.

    python -m mmspec.zoo.training.eagle3 out/e3/vlm-eagle3 --name vlm-eagle3 --target vlm-target \\
        --train-command "python -m mmspec.vision.train --arch eagle3 ..." \\
        --data "1200 training scenes ..."

The card's figures: the final training loss (mean of the run's last 100 steps, its `log.jsonl`),
the training wall time (first to last logged step), the held-out τ the run measured, and a
held-out τ of the shipped fp16 weights in the zoo's CPU tree (`registry.ZOO_TREE`) on prompts
never trained on: for a VLM target the held-out scenes (`vlm_data.heldout_seeds`), for a text
target 256-token windows of the held-out split's token stream (`mmspec.zoo.training.data`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from mmspec.zoo.cards import write_card
from mmspec.zoo.paths import ZOO_DIR

HELD_OUT = 16  # prompts for the card's tau, as the ViSpec entries' cards
NEW_TOKENS = 128


def run_log(run: Path) -> tuple[list, list]:
    """(step records, held-out tau records) of a training run's `log.jsonl`."""
    steps, taus = [], []
    for line in (run / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        (taus if "held_out_tau" in record else steps).append(record)
    if not steps:
        raise ValueError(f"{run}/log.jsonl has no training steps")
    return steps, taus


def held_out_prompts(target_entry, n: int) -> list:
    """`n` samples never trained on, for the card's tau."""
    if target_entry.card["kind"] == "vlm":
        from mmspec.zoo.training.train_vlm import drafter_samples
        from mmspec.zoo.training.vlm_data import heldout_seeds

        return drafter_samples(target_entry.tokenizer, heldout_seeds(n))
    from mmspec.zoo.training.data import token_stream

    stream = token_stream(target_entry.tokenizer, "heldout")
    step = (len(stream) - 256) // n
    return [{"input_ids": stream[i * step:i * step + 256][None].clone()} for i in range(n)]


def export(run: Path, name: str, target_name: str, train_command: str, data: str,
           zoo_dir: Path = ZOO_DIR, budget: str | None = None) -> Path:
    """Write `zoo_dir/name` from the training run in `run`; `budget`: why the entry fits the
    zoo's size budget, recorded on the card where given."""
    from mmspec.eagle import EagleDrafter
    from mmspec.vision.train import held_out_tau
    from mmspec.zoo.registry import ZOO_TREE, load
    from mmspec.zoo.training.train_text import staged_export

    target_entry = load(target_name, zoo_dir)
    target = target_entry.model
    steps, taus = run_log(run)
    trained = EagleDrafter.from_pretrained(run, target)
    out_dir = zoo_dir / name
    with staged_export(out_dir) as stage:  # a kill mid-export leaves the previous entry
        trained.save_pretrained(stage, verifier=target_name, embedding=False,
                                dtype=torch.float16)
        shipped = EagleDrafter.from_pretrained(stage, target, **ZOO_TREE).eval()
        t0 = time.time()
        tau = held_out_tau(shipped, target, held_out_prompts(target_entry, HELD_OUT), NEW_TOKENS)
        tau_s = time.time() - t0
        cfg = shipped.config
        tail = [r["loss"] for r in steps[-100:]]
        size = (stage / "model.safetensors").stat().st_size
        write_card(stage, {
            "name": name,
            "summary": f"EAGLE-3 drafter (one Llama layer over three of the target's layers' "
                       f"features, trained with the training-time test) for {target_name}.",
            "kind": "eagle3",
            "target": target_name,
            "architecture": "mmspec.EagleDrafter (EAGLE-3; speculators format, no embedding)",
            "params": sum(p.numel() for p in shipped.head.parameters()),
            "size_bytes": size,
            "dtype": "float16",
            "config": {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                       "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
                       "draft_vocab_size": cfg.draft_vocab_size, "vocab_size": cfg.vocab_size,
                       "feature_layers": list(cfg.feature_layers)},
            "data": data,
            "results": {
                "steps": steps[-1]["step"],
                "final_train_loss": round(sum(tail) / len(tail), 4),
                "final_train_loss_note": "mean of the last 100 steps (the EAGLE-3 loss: the "
                                         "training-time test's passes, weighted 0.8 ** i)",
                "run_held_out_tau": [{"step": r["step"], "tau": round(r["held_out_tau"], 3)}
                                     for r in taus],
                "run_held_out_tau_note": "measured during training on the run's held-out "
                                         "samples, the drafter's default tree (8 levels, 60 "
                                         "nodes), fp32",
                "heldout_tau": round(tau, 3),
                "heldout_tau_note": f"tokens per target forward, bonus included, greedy, "
                                    f"{NEW_TOKENS} new tokens, {HELD_OUT} prompts never trained "
                                    f"on, fp16 weights as shipped, the zoo tree {ZOO_TREE}",
                "heldout_tau_wall_s": round(tau_s, 1),
                "train_wall_time_s": round(steps[-1]["time"] - steps[0]["time"], 1),
                "train_wall_time_note": "first to last logged step (the target's answers, if "
                                        "any, were precomputed before)",
                "threads": torch.get_num_threads(),
                "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs (shared)",
            },
            "command": train_command,
            **({"budget": budget} if budget else {}),
        })
    print(f"exported {out_dir}: {size} bytes, held-out tau {tau:.3f}")
    return out_dir


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m mmspec.zoo.training.eagle3",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="the --out folder of the training run")
    p.add_argument("--name", required=True, help="the zoo entry to write (e.g. vlm-eagle3)")
    p.add_argument("--target", required=True, help="the zoo target it drafts for")
    p.add_argument("--train-command", required=True, help="recorded on the card")
    p.add_argument("--data", required=True, help="the training data, in words, for the card")
    p.add_argument("--budget", help="why the entry fits the zoo's size budget, for the card")
    p.add_argument("--zoo", type=Path, default=ZOO_DIR)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    export(args.run, args.name, args.target, args.train_command, args.data, args.zoo,
           args.budget)


if __name__ == "__main__":
    sys.exit(main())
