"""Validation inside the ranks: the validation split scored during training, trainer.early_stop, the best checkpoint.

``validate`` runs where the plan says (``val_every``): every rank scores its share of the validation split (the
result is reduced, so every rank holds the same numbers), the record goes to metrics.jsonl as ``event: val``, and
with early stopping ``EarlyStop.see`` decides, alike on every rank, whether it improved (the checkpoint of this step
is kept as the best: ``checkpoints/best`` points at it, the best before it is removed unless it is a periodic or the
last checkpoint) and whether the run stops now. Its state travels in every checkpoint (``Trainer._progress``), so a
killed and resumed run stops at the step the uninterrupted one did. At the end ``finish`` scores the test split once,
on the best checkpoint's weights (Keras' ``restore_best_weights``, Lightning's ``ckpt_path="best"``)."""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

import torch
import torch.distributed as dist

from launcher.plan.types import EarlyStopPlan
from launcher.rundir import RunDir


class EarlyStop:
    """The watched metric's best value and step, the validations since it improved, and whether the run stopped."""

    def __init__(self, plan: EarlyStopPlan) -> None:
        self.plan = plan
        self.best: float | None = None
        self.best_step = 0
        self.bad = 0
        """Validations in a row without improvement."""
        self.stopped = False

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        delta = self.plan.min_delta
        return value < self.best - delta if self.plan.mode == "min" else value > self.best + delta

    def see(self, result: dict[str, Any], step: int) -> bool:
        """Take one validation's result; True when it is the best so far (its checkpoint is to be kept)."""
        value = result.get(self.plan.metric)
        value = float(value) if isinstance(value, (int, float)) else math.nan
        if self.improves(value):
            self.best, self.best_step, self.bad = value, step, 0
            return True
        self.bad += 1
        self.stopped = self.bad >= self.plan.patience
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "bad": self.bad, "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state["best"], int(state["best_step"])
        self.bad, self.stopped = int(state["bad"]), bool(state["stopped"])

    def record(self) -> dict[str, Any]:
        """metrics.jsonl's ``event: early_stop`` (numbers only; the metric and mode are in the plan)."""
        return {"stopped": int(self.stopped), "best_step": self.best_step, "best": self.best,
                "validations_without_improvement": self.bad}


def _agree(flags: list[bool], device: torch.device) -> list[bool]:
    """The flags as every rank of the job sees them (any rank's True): a rank never saves or stops alone."""
    t = torch.tensor([float(f) for f in flags], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def validate(trainer, run_dir: RunDir, metrics, step: int) -> bool:
    """Score the validation split at ``step`` and apply early stopping; True when the run stops here."""
    result = trainer.evaluate("val")
    metrics.write(event="val", step=step, **result)
    early = trainer.early
    if early is None:
        return False
    before = early.best_step if early.best is not None else 0
    improved = early.see(result, step)
    improved, early.stopped = _agree([improved, early.stopped], trainer.device)
    if improved:
        trainer.save(run_dir.checkpoint(step))
        _point_best(trainer, run_dir, step, before)
    return early.stopped


def _point_best(trainer, run_dir: RunDir, step: int, before: int) -> None:
    """checkpoints/best -> step<step> (written by each node's first rank, after every rank's part is on disk), and
    the best before it removed unless a periodic checkpoint is kept there anyway."""
    if int(os.environ.get("LOCAL_RANK", trainer.rank)) != 0:
        return
    link = run_dir.checkpoints / "best"
    tmp = link.with_name("best.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.checkpoint(step).path.name)
    os.replace(tmp, link)
    every = trainer.plan.checkpoint_every
    if before and before != step and not (every > 0 and before % every == 0):
        old = run_dir.checkpoint(before)
        old.meta.unlink(missing_ok=True)  # first: a half-removed checkpoint is never taken for a complete one
        shutil.rmtree(old.path, ignore_errors=True)


def finish(trainer, run_dir: RunDir, metrics) -> None:
    """After the last checkpoint: with early stopping, load the best checkpoint (if the last step is not it) and
    record how the run ended; the test split is then scored by the caller on these weights."""
    early = trainer.early
    if early is None:
        return
    last, record = trainer.step, early.record()  # before a load brings back the state of the best step
    if early.best is not None and early.best_step != last:
        trainer.load(run_dir.checkpoint(early.best_step))
        trainer.step = last  # the records of the end keep the step training reached
    metrics.write(event="early_stop", step=last, **record)
