"""Loggers a user writes (launcher.loggers.MetricsLogger), for the tests: the integration tests copy this file into
the run's folder as my_logs.py and name its classes by _target_."""

from __future__ import annotations

import json


class FileLogger:
    """Appends one JSON line per call to ``path``: {"step", "metrics"}, then {"closed": true}."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._append({"step": step, "metrics": metrics})

    def close(self) -> None:
        self._append({"closed": True})


class BrokenLogger:
    """Fails from step ``fail_at`` on, as a logger whose service went away does."""

    def __init__(self, fail_at: int = 2) -> None:
        self.fail_at = fail_at

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if step >= self.fail_at:
            raise OSError("the metrics service went away")

    def close(self) -> None:
        pass
