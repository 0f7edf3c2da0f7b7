"""Per-rank records in the run dir, written line by line so they survive a crash of the rank."""

from __future__ import annotations

import json
import time
from pathlib import Path


class MetricsWriter:
    """``rank.N/metrics.jsonl``: one JSON object per logged step or event; ``rank.N/last_step``: a heartbeat."""

    def __init__(self, rank_dir: Path) -> None:
        self._file = open(rank_dir / "metrics.jsonl", "a", buffering=1)
        self._last_step = rank_dir / "last_step"
        self._t0 = time.time()

    def step_done(self, step: int) -> None:
        self._last_step.write_text(str(step))

    def write(self, **record) -> None:
        now = time.time()
        record.setdefault("time", round(now, 3))
        record.setdefault("wall_s", round(now - self._t0, 3))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
