"""A diverged run fails: a non-finite loss stops the run before anything after it is logged or saved.

On the CPU every step's loss is read as the step ends (a float read costs nothing there). On an accelerator, reading
the loss each step would make the host wait for the device at every step, so that it could never queue the next
step's work while the device runs this one; there the first non-finite step and its loss are kept on the device, with
no wait, and read where the run must know: before a step's record is logged, before an evaluation or a checkpoint,
and at the end. A diverged run then stops at the first of those after the divergence, and what it logged and saved
is all from before it."""

from __future__ import annotations

import math

import torch


class Diverged(FloatingPointError):
    """A non-finite loss: the run fails (never ``ok``) and nothing after it is saved."""


class LossWatch:
    """``see(loss, step)`` after every step, ``check()`` before logging, evaluating or saving (module docstring)."""

    def __init__(self, device: torch.device, rank: int, lr: float, deferred: bool | None = None) -> None:
        self.rank, self.lr = rank, lr
        self.deferred = device.type != "cpu" if deferred is None else deferred
        """Keep the first bad step on the device (accelerators) rather than read every loss."""
        self._step: torch.Tensor | None = None  # the first non-finite step, -1 while there is none
        self._loss: torch.Tensor | None = None

    def _diverged(self, value: float, step: int) -> Diverged:
        return Diverged(f"training diverged: the loss is {value} at step {step} on rank {self.rank}; the run stops "
                        f"and saves nothing after it. Lower optimizer.lr (now {self.lr}), clip or warm up, or check "
                        f"the data for NaN/inf values; resume from the last checkpoint with trainer.resume=latest.")

    def see(self, loss: torch.Tensor, step: int) -> None:
        """This rank's loss of ``step`` (a scalar tensor): raises Diverged now when not deferred."""
        if not self.deferred:
            value = loss.item()
            if not math.isfinite(value):
                raise self._diverged(value, step)
            return
        loss = loss.detach().float()
        if self._step is None:
            self._step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._loss = torch.zeros((), device=loss.device)
        first = ~torch.isfinite(loss) & (self._step < 0)
        self._step = torch.where(first, step, self._step)
        self._loss = torch.where(first, loss, self._loss)

    def check(self) -> None:
        """Raise Diverged when a step seen so far had a non-finite loss (waits for the device when deferred)."""
        if self._step is not None and (step := int(self._step.item())) >= 0:
            raise self._diverged(float(self._loss.item()), step)
