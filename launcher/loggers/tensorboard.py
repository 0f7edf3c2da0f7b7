"""TensorBoard event files from rank 0 (``logger=tensorboard``, the default): ``log_output/<run>/tensorboard/``.

``tensorboard --logdir log_output`` then shows every run side by side: train/loss, train/samples_per_s, train/lr
and the evaluations' eval/* at their steps. Written by torch's ``SummaryWriter`` (the ``tensorboard`` package);
this module imports it only when a logger is built, so checking the ``_target_`` costs no torch import."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.rundir import RUN_DIR_ENV, RunDir

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger:
    """One scalar per metric and step (``launcher.loggers.MetricsLogger``)."""

    requires = ("tensorboard",)
    """Checked before the run starts (pip install tensorboard)."""

    def __init__(self, log_dir: str = "", flush_secs: int = 10) -> None:
        """log_dir: where the event files go; "" = the run dir's tensorboard/ folder (the run dir the launcher gives
        each rank in HL_RUN_DIR). flush_secs: at most this long between a scalar and its write to disk (the end of
        the run writes everything)."""
        from torch.utils.tensorboard import SummaryWriter

        if not log_dir and not os.environ.get(RUN_DIR_ENV):
            raise ValueError(f"log_dir is empty and {RUN_DIR_ENV} is not set (not under hetero-launch): give "
                             f"log_dir=<folder>")
        self.log_dir = Path(log_dir) if log_dir else RunDir(os.environ[RUN_DIR_ENV]).tensorboard
        self._writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self._writer.close()
