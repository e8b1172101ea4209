"""The update step the zoo trainers share: backward, gradients clipped to norm 1, then the
optimizer step with its loss record and step count, which a Ctrl-C cannot split
(`mmspec.interrupt.uninterrupted`), a save every `save_every_s` seconds, and on Ctrl-C a save
of what was trained and the line that says how to resume."""

from __future__ import annotations

import time

import torch

from mmspec.interrupt import Interrupted, uninterrupted


class Steps:
    """done: steps whose update is in the weights; losses: one per step, resumed with them."""

    def __init__(self, start: int, losses: list, save, save_every_s: float):
        self.done, self.losses, self.save = start, losses, save
        self.save_every_s, self.last_save = save_every_s, time.time()

    def update(self, model, opt, loss, step: int, bar, digits: int = 3) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with uninterrupted():
            opt.step()
            self.losses.append(loss.item())
            self.done = step + 1
        recent = self.losses[-20:]
        bar.set_postfix(loss=f"{sum(recent) / len(recent):.{digits}f}", refresh=False)
        if time.time() - self.last_save > self.save_every_s:
            self.save(self.done)
            self.last_save = time.time()

    def interrupted(self, name: str, total: int, ckpt_path, resume: str) -> Interrupted:
        """Save what was trained; the `Interrupted` to raise, naming it and how to resume."""
        self.save(self.done)  # nothing trained is lost
        return Interrupted(f"{name} saved at step {self.done} of {total} in {ckpt_path}; "
                           f"{resume}")
