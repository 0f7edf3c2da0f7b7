"""The rank's side of the loggers: rank 0's ``metrics.jsonl`` writer also hands every record to the plan's loggers.

``open_metrics`` is what the worker (``launcher.worker.train``) and ``runtime.prepare()`` open instead of a bare
``MetricsWriter``: on rank 0 with loggers it is a ``LoggedMetricsWriter``, whose records go to the file first and
then, as ``train/<key>`` or ``eval/<key>`` scalars at their step, to each logger. A logger that fails (to build, to
log, to close) is reported once as a ``LoggerWarning`` and dropped; the run goes on."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from launcher.loggers import LOGGER_OFF, MetricsLogger
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import RankDir

__all__ = ["LoggedMetricsWriter", "LoggerWarning", "Loggers", "build_loggers", "metrics_of", "open_metrics"]

NOT_METRICS = frozenset({"step", "event", "time", "wall_s", "local_loss", "n"})
"""Keys of a metrics.jsonl record that are not scalars to plot (local_loss: rank 0's own share; n: samples)."""


class LoggerWarning(UserWarning):
    """A logger failed; it is off for the rest of the run and training goes on."""


def metrics_of(record: dict[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, {name: value}) of a metrics.jsonl record: a training step's numbers as ``train/<key>``, an evaluation's
    as ``eval/<key>``; None for other events (checkpoint_verified) and records without numbers."""
    event = record.get("event")
    if event not in (None, "eval") or not isinstance(record.get("step"), int):
        return None
    prefix = "eval" if event == "eval" else "train"
    values = {f"{prefix}/{k}": float(v) for k, v in record.items()
              if k not in NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return (record["step"], values) if values else None


class Loggers:
    """Several loggers as one (``MetricsLogger``); one that raises is warned about once and dropped, and ``dropped``
    keeps (its index among the specs, the step, where it failed: "constructor", "log_metrics" or "close")."""

    def __init__(self, loggers: Sequence[tuple[int, str, MetricsLogger]],
                 dropped: Sequence[tuple[int, int, str]] = ()) -> None:
        self._loggers = list(loggers)
        """(its index among the specs, its _target_, the logger)."""
        self.dropped = list(dropped)

    @property
    def names(self) -> list[str]:
        return [name for _, name, _ in self._loggers]

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for entry in list(self._loggers):
            try:
                entry[2].log_metrics(step, metrics)
            except Exception as e:  # noqa: BLE001 - a logger never fails the run
                self._drop(entry, step, f"log_metrics at step {step}", e)

    def close(self, step: int = 0) -> None:
        for index, name, logger in list(self._loggers):
            try:
                logger.close()
            except Exception as e:  # noqa: BLE001
                _warn(name, "close", e)
                self.dropped.append((index, step, "close"))
        self._loggers.clear()

    def _drop(self, entry: tuple[int, str, MetricsLogger], step: int, what: str, e: Exception) -> None:
        index, name, logger = entry
        _warn(name, what, e)
        self.dropped.append((index, step, "log_metrics"))
        self._loggers = [x for x in self._loggers if x[2] is not logger]
        with suppress(Exception):
            logger.close()  # let it release what it holds; its own error was reported already


def _warn(name: str, what: str, e: BaseException) -> None:
    warnings.warn(f"hetero-launch: logger {name} failed in {what} ({type(e).__name__}: {e}); it is off for the rest "
                  f"of the run, training goes on.", LoggerWarning, stacklevel=3)


def build_loggers(specs: Sequence[dict[str, Any]]) -> Loggers:
    """Each spec built by Hydra's ``instantiate`` (its module found from the folder the run started in, too); one
    that fails to build, or is no MetricsLogger, is warned about and left out."""
    from hydra.utils import instantiate

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    built, dropped = [], []
    for index, spec in enumerate(specs):
        name = str(spec.get("_target_"))
        try:
            logger = instantiate(dict(spec), _convert_="all")
        except Exception as e:  # noqa: BLE001
            _warn(name, "its constructor", e.__cause__ or e)
            dropped.append((index, 0, "constructor"))
            continue
        if not isinstance(logger, MetricsLogger):
            _warn(name, "its constructor", TypeError(f"built a {type(logger).__name__}, which has no log_metrics(step, "
                                                     f"metrics) and close()"))
            dropped.append((index, 0, "constructor"))
            continue
        built.append((index, name, logger))
    return Loggers(built, dropped)


class LoggedMetricsWriter(MetricsWriter):
    """A rank's metrics.jsonl writer that also sends each record's numbers to loggers (after the line is on disk).
    A logger dropped is written down as a ``logger_off`` event (its index among the plan's loggers, the step), which
    the launcher's summary names: the warning alone went to this rank's stderr, where nobody looked."""

    def __init__(self, rank_dir: RankDir, loggers: Loggers) -> None:
        super().__init__(rank_dir)
        self.loggers = loggers
        self._said = 0
        self._say_dropped()

    def write(self, **record: Any) -> None:
        super().write(**record)
        found = metrics_of(record)
        if found is not None:
            self.loggers.log_metrics(*found)
            self._say_dropped()

    def close(self) -> None:
        try:
            self._flush_step()
            self.loggers.close(self._last)  # the last step done
            self._say_dropped()
        finally:
            super().close()

    def _say_dropped(self) -> None:
        for index, step, where in self.loggers.dropped[self._said:]:
            super().write(event=LOGGER_OFF, step=step, logger=index, **{f"in_{where}": 1})
        self._said = len(self.loggers.dropped)


def open_metrics(rank_dir: RankDir, specs: Sequence[dict[str, Any]], rank: int) -> MetricsWriter:
    """The rank's metrics.jsonl writer: on rank 0, with the plan's loggers (``plan.loggers``) when it names any."""
    if rank != 0 or not specs:
        return MetricsWriter(rank_dir)
    return LoggedMetricsWriter(rank_dir, build_loggers(specs))
