"""One process of `test_train_distributed.py`'s two-process run (launched by torchrun)."""

import sys
from pathlib import Path

import torch
from accelerate import PartialState

sys.path.insert(0, str(Path(__file__).parent))
from tiny_vlms import llava_prompt, no_eos, tiny_llava  # noqa: E402

from mmspec.vision import ViSpecDrafter  # noqa: E402
from mmspec.vision.train import TrainConfig, train  # noqa: E402

CFG = TrainConfig(steps=4, lr=3e-3, warmup_steps=1, noise=0.2, answer_tokens=8, eval_every=2,
                  eval_new_tokens=6, checkpoint_every=2)


def samples(seeds=(1, 2, 3)):
    return [{"input_ids": ids, **extras}
            for ids, extras in (llava_prompt(images=1, seed=s) for s in seeds)]


HELD_OUT = (4, 5, 6)


if __name__ == "__main__":
    # joins torchrun's process group, as `python -m mmspec.vision.train` does (cpu=True: else
    # accelerate counts CPU processes as one)
    rank = PartialState(cpu=not torch.cuda.is_available()).process_index
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    target = no_eos(tiny_llava())
    torch.manual_seed(rank)  # a different start per process: train broadcasts
    drafter = ViSpecDrafter.from_target(target)
    losses = train(drafter, target, samples(), CFG, held_out=samples(HELD_OUT), out_dir=out)
    torch.save({"state": drafter.state_dict(), "losses": losses},
               out / f"rank{rank}.pt")
