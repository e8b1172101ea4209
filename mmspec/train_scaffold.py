"""The loop scaffolding of mmspec's trainers (the three zoo trainers and `mmspec.vision.train`),
on accelerate and transformers' schedulers; each trainer keeps its model, data and loss.

- **Schedules** are transformers': `cosine_schedule` (warm-up, then cosine down to 10%, the zoo)
  and `linear_schedule` (warm-up, then linear decay, ViSpec).
- **A run** (`TrainLoop`) is an `accelerate.Accelerator` that `prepare`s model, optimizer and
  scheduler; a step is `accelerator.backward` (once, or once per sample), clipping (by norm, or
  by value) and the optimizer and scheduler steps, which a Ctrl-C cannot split
  (`mmspec.interrupt.uninterrupted`). A checkpoint is the accelerator's `save_state` folder
  (model, optimizer, scheduler, RNG states, the trainer's `states`; or the model as the trainer
  writes it, `save_model`) plus `trainer.pt` (step, losses, wall time, the run's settings),
  written whole beside the previous one and swapped in by renames (`save_swapped`), every
  `save_every_s` seconds, on Ctrl-C or when the trainer asks.
- **Several processes** (`accelerate launch`, torchrun) train as one with `sum_grads`: each
  backwards its share of the step and the gradients are summed by one all-reduce (not DDP);
  process 0 writes the checkpoints.
- **The command** a card records and an interrupted run prints to resume: `command`.
- **Refusals** stay on top: a run never resumes another run's checkpoint (`refuse_other_run`),
  one already past its `--steps` (`refuse_past_steps`) or a checkpoint of the one-file format
  of earlier versions (`refuse_old_format`), and never overwrites a checkpoint unasked
  (`RunExists`); `run_refusals_as_exit` prints them as one line.
"""

from __future__ import annotations

import shlex
import shutil
import time
from pathlib import Path

import torch
from transformers import get_scheduler

from mmspec.interrupt import Interrupted, uninterrupted

META = "trainer.pt"  # step, losses, wall time and run settings, beside accelerate's state files


class RunRefused(ValueError):
    """A trainer will not resume a checkpoint (another run's, past --steps, an old format): its
    main prints the message as one line."""


class RunExists(FileExistsError):
    """A checkpoint is in the way of a run without --resume: its main prints one line."""


def run_refusals_as_exit(cmd, *args, refusals=()) -> None:
    """`cmd(*args)`, with a refusal to resume or overwrite a run (RunRefused, RunExists and the
    types in `refusals`) printed as one line (exit 1)."""
    try:
        cmd(*args)
    except (RunRefused, RunExists, *refusals) as err:
        raise SystemExit(str(err)) from None


def command(module: str, argv: list[str], resume: bool = False) -> str:
    """The command `python -m <module> <argv>` (the cards record it); with `resume`, the one that
    continues it (`--resume` added when it is not there)."""
    if resume and "--resume" not in argv:
        argv = [*argv, "--resume"]
    return f"python -m {module} " + shlex.join(argv)


def refuse_other_run(meta: dict, run: dict, ckpt_path: Path, fix: str = "") -> None:
    """RunRefused when checkpoint `meta` was saved by a run of other settings than `run` (a
    checkpoint from before the settings were recorded passes)."""
    if meta.get("run", run) != run:
        keys = list(run) + [key for key in meta["run"] if key not in run]
        differ = "; ".join(f"--{key.replace('_', '-')} {meta['run'].get(key)!r} there, "
                           f"{run.get(key)!r} here" for key in keys
                           if meta["run"].get(key) != run.get(key))
        raise RunRefused(f"{ckpt_path} is another run's checkpoint ({differ}): resuming it "
                         f"would train that run and label it as this one; {fix}delete it or "
                         f"pass another --out")


def refuse_past_steps(done: int, steps: int, ckpt_path: Path) -> None:
    """RunRefused when checkpoint `ckpt_path`, already at step `done`, is past this run's
    `--steps`: the end would save it as `steps` and ship it so."""
    if done > steps:
        raise RunRefused(f"--steps {steps}: {ckpt_path} is already at step {done}; resuming it "
                         f"would label weights trained {done} steps as {steps}; pass --steps "
                         f"{done} or more, or delete it or pass another --out")


def refuse_old_format(old: Path, ckpt: Path) -> None:
    """RunRefused when `old`, a one-file checkpoint of mmspec before this scaffold, is there:
    its states are not accelerate's, so it cannot be continued."""
    if old.exists():
        raise RunRefused(f"{old} is a checkpoint of an earlier mmspec (one file; checkpoints are "
                         f"now accelerate state folders, {ckpt.name}/): it cannot be resumed; "
                         f"finish it with the mmspec that wrote it, or delete it to start over")


def cosine_schedule(optimizer, warmup: int, steps: int, floor: float = 0.1):
    """transformers' `cosine_warmup_with_min_lr`: step s < warmup trains at lr (s+1)/warmup, then
    a half cosine from lr down to `floor` lr, reached at the last step.

    The zoo's own `lr_at` before it had the same warm-up and the same cosine one step later
    (step s >= warmup trained at this schedule's rate of s-1; its floor came one step after
    the run); no transformers schedule has both that warm-up and that decay."""
    return get_scheduler("cosine_warmup_with_min_lr", optimizer, num_warmup_steps=warmup,
                         num_training_steps=steps,
                         scheduler_specific_kwargs={"min_lr_rate": floor})


def linear_schedule(optimizer, warmup: int, steps: int):
    """Step s < warmup trains at lr (s+1)/warmup (the peak at step warmup-1, so a warm-up as long
    as the run still reaches it), then lr (steps-s)/(steps-warmup), down to lr/(steps-warmup) at
    the last step: ViSpec's schedule, as `mmspec.vision.train` ran it by hand before.

    transformers' warm-ups start at 0 (step s at s/warmup), so this is its warmup-stable-decay
    schedule read one step on (`last_epoch=0`: the step s trains at the rate it gives s+1), with
    one stable step so that the decay still starts at step `warmup`."""
    for group in optimizer.param_groups:  # what a scheduler started past step 0 needs
        group.setdefault("initial_lr", group["lr"])
    return get_scheduler("warmup_stable_decay", optimizer, num_warmup_steps=warmup,
                         scheduler_specific_kwargs={"num_stable_steps": 1,
                                                    "num_decay_steps": steps - warmup,
                                                    "decay_type": "linear", "last_epoch": 0})


def rates_at_resume(scheduler) -> None:
    """Set each group's rate to this run's schedule at the step it resumes at: a loaded optimizer
    holds the rate of the run that saved it, whose --steps (so its schedule) may have been
    shorter."""
    scheduler = getattr(scheduler, "scheduler", scheduler)  # under accelerate's wrapper
    for group, base, rate in zip(scheduler.optimizer.param_groups, scheduler.base_lrs,
                                 scheduler.lr_lambdas):
        group["lr"] = base * rate(scheduler.last_epoch)


def checkpoint_dirs(ckpt: Path) -> tuple[Path, Path, Path]:
    """(the checkpoint folder, the one being written, the previous one while the new is swapped
    in)."""
    ckpt = Path(ckpt)
    return ckpt, ckpt.with_name(ckpt.name + ".new"), ckpt.with_name(ckpt.name + ".old")


def settle(ckpt: Path) -> None:
    """Clear up after a killed save: killed between its two renames, the previous checkpoint is
    put back; a half-written `.new` (or a half-deleted `.old`) is removed."""
    ckpt, new, old = checkpoint_dirs(ckpt)
    if old.is_dir() and not ckpt.exists():
        old.rename(ckpt)
    for leftover in (new, old):
        if leftover.exists():
            shutil.rmtree(leftover)


def save_swapped(ckpt: Path, write) -> None:
    """`write(folder)` into `<ckpt>.new`, then swapped in by renames: `ckpt` is always one complete
    save, whenever the process is killed."""
    ckpt, new, old = checkpoint_dirs(ckpt)
    settle(ckpt)
    new.mkdir(parents=True)
    write(new)
    if ckpt.exists():
        ckpt.rename(old)
    new.rename(ckpt)
    if old.exists():
        shutil.rmtree(old)


def read_meta(ckpt: Path) -> dict | None:
    """The `trainer.pt` of checkpoint folder `ckpt` (after `settle`), None when there is none."""
    settle(ckpt)
    path = Path(ckpt) / META
    return torch.load(path, weights_only=True) if path.is_file() else None


def saved_model_state(ckpt: Path) -> dict:
    """The model weights of checkpoint folder `ckpt` (accelerate's first model file)."""
    from accelerate.utils import MODEL_NAME

    return torch.load(Path(ckpt) / f"{MODEL_NAME}.bin", weights_only=True)


def zero_missing_grads(params: list) -> None:
    """A zero gradient for each parameter the step did not reach (an adaptor on a step without
    images): AdamW skips a parameter without one (no moment decay, no weight decay) but steps one
    with zeros, so one process would train otherwise than N, whose summed gradients always exist.
    Zeros in both, as under DeepSpeed (ViSpec's trainer)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def sum_grads(accelerator, params: list) -> None:
    """Sum the gradients of `params` over the processes (one flat `accelerator.reduce`). Not DDP:
    a model that trains through other methods than `forward` never arms DDP's hooks."""
    flat = accelerator.reduce(torch.cat([p.grad.reshape(-1) for p in params]), "sum")
    for p, chunk in zip(params, flat.split([p.numel() for p in params])):
        p.grad = chunk.view_as(p).clone()


class TrainLoop:
    """One run of a trainer: `accelerator.prepare`d model, optimizer and scheduler, the update
    step, the losses and the checkpoint folder `ckpt` (None: a run without checkpoints).

    done: steps whose update is in the weights; losses: one per step, resumed with them; extra:
    what the trainer records besides (JSON-like, saved in trainer.pt).

    The options a trainer declares beside the defaults (the zoo's: one process, `forward`, norm
    clipping, the model in accelerate's state):
    - clip_norm / clip_value: gradients clipped to total norm `clip_norm`, or each entry to
      [-clip_value, clip_value] (give one, the other None).
    - sum_grads: a multi-process update without DDP: each process backwards its share of the
      step's loss (`backward`, as often as it likes) and the gradients are summed over the
      processes before clipping, a parameter the step did not reach getting zeros in every
      process (`zero_missing_grads`, `sum_grads`).
    - save_model: `save_model(folder)` writes the model into each checkpoint itself (a
      `save_pretrained` folder that the trainer reads back before `resume`); the accelerator
      then neither wraps nor saves it.
    - states: objects with `state_dict`/`load_state_dict` (a sample stream) saved and resumed
      with the accelerator's state.
    Whatever the number of processes, process 0 alone writes checkpoints and shows progress."""

    def __init__(self, model, optimizer, scheduler, ckpt: Path | None, run: dict,
                 save_every_s: float = 120.0, clip_norm: float | None = 1.0, cpu: bool = True,
                 *, clip_value: float | None = None, sum_grads: bool = False,
                 save_model=None, states=()):
        from accelerate import Accelerator

        if (clip_norm is None) == (clip_value is None):
            raise ValueError(f"TrainLoop: give one of clip_norm and clip_value, the other None; "
                             f"got clip_norm={clip_norm!r}, clip_value={clip_value!r}")
        # the scheduler steps once per update, however many processes (not once per process)
        self.accelerator = Accelerator(cpu=cpu, step_scheduler_with_optimizer=False)
        if save_model is None:
            self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
                model, optimizer, scheduler)
        else:
            self.model = model
            self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        for state in states:
            self.accelerator.register_for_checkpointing(state)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ckpt, self.run, self.extra = (Path(ckpt) if ckpt is not None else None), run, {}
        self.save_every_s, self.clip_norm, self.clip_value = save_every_s, clip_norm, clip_value
        self.sum_grads, self.save_model = sum_grads, save_model
        self.done, self.losses, self.elapsed = 0, [], 0.0
        self.t0 = self.last_save = time.time()

    def resume(self, meta: dict) -> int:
        """Continue the checkpoint whose `read_meta` is `meta`: weights, optimizer, scheduler and
        RNG states, step, losses and wall time. Returns the step."""
        self.accelerator.load_state(str(self.ckpt))
        rates_at_resume(self.scheduler)
        self.done, self.losses, self.elapsed = meta["step"], meta["losses"], meta["elapsed"]
        self.extra = meta.get("extra", {})
        return self.done

    def steps(self, total: int, desc: str, mininterval: float = 10.0, file=None):
        """The progress bar over the steps left (on `file`, default stdout; process 0's alone);
        the wall time counts from here."""
        import sys

        from tqdm import tqdm

        self.t0 = self.last_save = time.time()
        return tqdm(range(self.done, total), initial=self.done, total=total, desc=desc,
                    mininterval=mininterval, file=file or sys.stdout,
                    disable=not self.accelerator.is_main_process)

    def wall_time(self) -> float:
        return self.elapsed + time.time() - self.t0

    def update(self, loss, step: int, bar, digits: int = 3) -> None:
        """Step `step` on `loss`: `zero_grad`, `backward(loss)`, then `apply(loss.item(), ...)`."""
        self.zero_grad()
        self.backward(loss)
        self.apply(loss.item(), step, bar, digits)

    def zero_grad(self) -> None:
        """Forget the gradients of the last update (before the first `backward` of a step)."""
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss) -> None:
        """Add `loss`'s gradients to the step's (a step may backward once per sample)."""
        self.accelerator.backward(loss)

    def apply(self, loss: float, step: int, bar, digits: int = 3) -> None:
        """The update of step `step` from the gradients backwarded since `zero_grad` (summed over
        the processes with `sum_grads`), clipped, then optimizer and scheduler step with the
        record of `loss` and the step count (not split by a Ctrl-C); a save every
        `save_every_s`."""
        if self.sum_grads:
            zero_missing_grads(self.params)
            if self.accelerator.num_processes > 1:
                sum_grads(self.accelerator, self.params)
        if self.clip_norm is not None:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        else:
            self.accelerator.clip_grad_value_(self.params, self.clip_value)
        with uninterrupted():
            self.optimizer.step()
            self.scheduler.step()
            self.losses.append(loss)
            self.done = step + 1
        recent = self.losses[-20:]
        bar.set_postfix(loss=f"{sum(recent) / len(recent):.{digits}f}", refresh=False)
        if time.time() - self.last_save > self.save_every_s:
            self.save()

    def save(self) -> None:
        """The checkpoint of step `done`, swapped in whole (by process 0)."""
        if self.ckpt is None:
            raise ValueError("TrainLoop.save: this run has no checkpoint folder (ckpt None)")
        meta = {"step": self.done, "elapsed": self.wall_time(), "losses": self.losses,
                "run": self.run, "extra": self.extra}

        def write(folder: Path) -> None:
            if self.save_model is not None:
                self.save_model(folder)
            # torch.save, not safetensors: tied embeddings share their storage
            self.accelerator.save_state(str(folder), safe_serialization=False)
            torch.save(meta, folder / META)

        if self.accelerator.is_main_process:
            save_swapped(self.ckpt, write)
        self.last_save = time.time()

    def finish(self) -> None:
        """The last save, and the wall time of the run so far into `elapsed`."""
        self.save()
        self.elapsed = self.wall_time()
        self.t0 = time.time()

    def interrupted(self, name: str, total: int, resume: str) -> Interrupted:
        """Save what was trained; the `Interrupted` to raise, naming it and how to resume."""
        self.save()  # nothing trained is lost
        return Interrupted(f"{name} saved at step {self.done} of {total} in {self.ckpt}; "
                           f"{resume}")
