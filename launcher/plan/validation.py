"""PURE: when the held-out splits are scored, and trainer.early_stop.

With a validation split (the data facts' ``val_samples``, e.g. data.val_fraction of a tabular file) the ranks score
it every ``eval.every`` steps (0: once an epoch) and at the last step, and the test split only once, at the end — as
Keras' ``validation_split`` and Lightning's ``val_dataloaders`` do. Without one, ``eval.every`` scores the test
split as it always did, and early stopping is refused: a run stopped by its test score reports a test score chosen
by the test itself."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.contract import DataFacts
from launcher.plan.types import EarlyStopPlan

HIGHER_IS_BETTER = ("auc", "accuracy")
"""Metrics for which mode=auto means max."""
BINARY_METRICS = ("auc", "accuracy", "logloss")
"""What evaluation reports besides loss with eval.metrics=binary (launcher/worker/eval_metrics.py)."""
MODES = ("auto", "min", "max")


@dataclass(frozen=True)
class ValidationPlan:
    val_every: int
    eval_every: int
    early_stop: EarlyStopPlan | None


def plan_validation(cfg, data: DataFacts, steps_per_epoch: int | None, eval_metrics: str, problems: list[str],
                    notes: list[str]) -> ValidationPlan:
    """When each split is scored, and the early stop, from eval.every, trainer.early_stop and the data facts."""
    every = cfg.eval.every
    if data.val_samples <= 0:
        early = _early_stop(cfg, eval_metrics, False, problems)
        return ValidationPlan(val_every=0, eval_every=every, early_stop=early)
    val_every = every if every > 0 else (steps_per_epoch or 0)
    if val_every <= 0:
        problems.append(f"a validation split ({data.val_samples:,} samples) with eval.every=0 is scored once an "
                        f"epoch, and this data has no known epoch. Set eval.every (steps between validations).")
    early = _early_stop(cfg, eval_metrics, True, problems)
    when = f"every {val_every} steps" if every > 0 else f"once an epoch ({val_every} steps)"
    on = "on the best checkpoint" if early is not None else "on the last weights"
    notes.append(f"validation: {data.val_samples:,} samples scored {when} and at the last step; the test split "
                 f"once, at the end, {on}")
    return ValidationPlan(val_every=max(val_every, 0), eval_every=0, early_stop=early)


def _early_stop(cfg, eval_metrics: str, has_val: bool, problems: list[str]) -> EarlyStopPlan | None:
    e = cfg.trainer.early_stop
    key = "trainer.early_stop"
    if e.patience < 0:
        problems.append(f"{key}.patience={e.patience} must be >= 0 (0 = no early stopping; e.g. 3).")
        return None
    if e.patience == 0:
        set_alone = [f"{key}.{k}={getattr(e, k)}" for k, default in (("metric", "loss"), ("mode", "auto"),
                                                                        ("min_delta", 0.0)) if getattr(e, k) != default]
        if set_alone:
            problems.append(f"{', '.join(set_alone)} does nothing with {key}.patience=0 (no early stopping). Set "
                            f"{key}.patience (e.g. 3), or remove {set_alone[0].split('=')[0]}.")
        return None
    allowed = ("loss", *BINARY_METRICS) if eval_metrics == "binary" else ("loss",)
    before = len(problems)
    if not has_val:
        problems.append(f"{key}.patience={e.patience} needs a validation split to watch: set data.val_fraction "
                        f"(e.g. 0.1) with data=tabular. The test split is not watched: a run stopped by its test "
                        f"score reports a test score chosen by the test itself.")
    if e.metric not in allowed:
        why = "" if eval_metrics == "binary" else " (auc, accuracy and logloss need eval.metrics=binary)"
        problems.append(f"{key}.metric={e.metric!r} is not reported by this run's evaluation{why}. Set {key}.metric "
                        f"to one of {', '.join(allowed)}.")
    if e.mode not in MODES:
        problems.append(f"{key}.mode={e.mode!r} is not one of {', '.join(MODES)}. Set {key}.mode=auto.")
    if e.min_delta < 0:
        problems.append(f"{key}.min_delta={e.min_delta} must be >= 0 (an improvement smaller than it does not count).")
    if cfg.trainer.checkpoint_every < 0:
        problems.append(f"{key}.patience={e.patience} keeps the best checkpoint, and trainer.checkpoint_every="
                        f"{cfg.trainer.checkpoint_every} writes none. Set trainer.checkpoint_every=0 (the end only).")
    if len(problems) > before:
        return None
    mode = e.mode if e.mode != "auto" else ("max" if e.metric in HIGHER_IS_BETTER else "min")
    return EarlyStopPlan(metric=e.metric, mode=mode, patience=e.patience, min_delta=float(e.min_delta))
