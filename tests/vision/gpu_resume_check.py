"""`benchmarks/gpu_session.sh` step `train`: `mmspec.vision.train` on a CUDA device (accelerate's
GPU state, not the CPU one the tests run), a run cut at step 5 and resumed ends with the weights
of an uninterrupted one. Prints one line; exit 1 if they differ. (`python ... cpu`: the same
on the CPU, to try the script here.)"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_vlms import llava_prompt, no_eos, tiny_llava  # noqa: E402

from mmspec.vision import ViSpecDrafter  # noqa: E402
from mmspec.vision import train as train_mod  # noqa: E402
from mmspec.vision.train import TrainConfig, train  # noqa: E402

CFG = TrainConfig(steps=6, lr=3e-3, warmup_steps=2, noise=0.2, answer_tokens=16, eval_every=3,
                  eval_new_tokens=6, checkpoint_every=3)


def fresh(target):
    torch.manual_seed(0)
    return ViSpecDrafter.from_target(target).float()


if __name__ == "__main__":
    want = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    target = no_eos(tiny_llava()).to(want)
    samples = [{"input_ids": ids.to(want), **{k: v.to(want) for k, v in extras.items()}}
               for ids, extras in (llava_prompt(images=n, seed=s) for n, s in [(1, 0), (2, 1)])]
    with tempfile.TemporaryDirectory() as tmp:
        full = fresh(target)
        train(full, target, samples, CFG, held_out=samples[:1], out_dir=Path(tmp) / "full")
        real, calls = train_mod.sample_loss, [0]

        def dies(*args, **kwargs):  # Ctrl-C on the 5th step (one sample a step)
            calls[0] += 1
            if calls[0] == 5:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        train_mod.sample_loss = dies
        try:
            train(fresh(target), target, samples, CFG, out_dir=Path(tmp) / "cut")
        except KeyboardInterrupt as err:
            print(f"cut: {err}")
        train_mod.sample_loss = real
        resumed = fresh(target)
        losses = train(resumed, target, samples, CFG, out_dir=Path(tmp) / "cut", resume=True)
    a, b = full.state_dict(), resumed.state_dict()
    same = all(torch.equal(a[k], b[k]) for k in a)
    device = next(resumed.parameters()).device
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"vision.train on {device} ({name}): resumed {len(losses)} steps, weights "
          f"{'equal' if same else 'DIFFER'} to the uninterrupted run's")
    sys.exit(0 if same and device.type == want.type else 1)
