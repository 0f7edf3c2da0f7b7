"""Per-rank records in the run dir, written line by line so they survive a crash of the rank."""

from __future__ import annotations

import json
import time
from pathlib import Path


class MetricsWriter:
    """``rank.N/metrics.jsonl``: one JSON object per logged step or event; ``rank.N/last_step``: a heartbeat."""

    HEARTBEAT_S = 0.2  # at most this often: a file write per step would cost tiny models more than the step

    def __init__(self, rank_dir: Path) -> None:
        self._file = open(rank_dir / "metrics.jsonl", "a", buffering=1)
        self._last_step = rank_dir / "last_step"
        self._t0 = time.time()
        self._beat = 0.0
        self._pending: int | None = None

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        self._pending = step
        if now - self._beat >= self.HEARTBEAT_S:
            self._flush_step()
            self._beat = now

    def _flush_step(self) -> None:
        if self._pending is not None:
            self._last_step.write_text(str(self._pending))
            self._pending = None

    def write(self, **record) -> None:
        self._flush_step()  # last_step is exact at every logged step and at the end
        now = time.time()
        record.setdefault("time", round(now, 3))
        record.setdefault("wall_s", round(now - self._t0, 3))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._flush_step()
        self._file.close()
