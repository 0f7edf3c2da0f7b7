"""A rank's live records: ``metrics.jsonl`` (one JSON object per logged step or event) and its heartbeat, which the
launcher's progress view and watchdog read (their paths: ``launcher.rundir.RankDir``), and the host's memory as /proc
tells it. Torch-free."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from launcher.procfs import kernel_field
from launcher.rundir import RankDir, finite


def host_available_memory() -> int:
    """The host's available memory in bytes (MemAvailable in /proc/meminfo; 0 where there is none)."""
    return kernel_field("/proc/meminfo", "MemAvailable")


def _memory() -> tuple[int, int]:
    """(this process's resident set, the host's available memory) in bytes, from /proc (0 where there is none)."""
    rss = 0
    with suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, host_available_memory()


class MetricsWriter:
    """A rank's ``metrics.jsonl`` (one JSON object per logged step or event, flushed line by line so a crash keeps
    every finished line) and its ``last_step`` heartbeat (rewritten in place: both files stay open, since opening a
    file per write costs a tiny model more than its step)."""

    HEARTBEAT_S = 0.2  # at most this often
    HEARTBEAT_WIDTH = 160  # fixed: a reader never sees a shorter record's stale tail
    SAVING_BEAT_S = 0.5
    """While a checkpoint is written, a thread rewrites the heartbeat this often."""

    def __init__(self, rank_dir: RankDir) -> None:
        rank_dir.path.mkdir(parents=True, exist_ok=True)
        self._file = open(rank_dir.metrics, "a")
        self._heartbeat = open(rank_dir.heartbeat, "w")
        self._t0 = time.time()
        self._beat = 0.0
        self._pending: int | None = None
        self._last = 0
        self._state = ""
        self._lock = threading.Lock()  # the saving thread and the rank's own thread both write the heartbeat
        self._closed = threading.Event()
        self._late: threading.Thread | None = None

    def step_done(self, step: int) -> None:
        """A finished step (cheap: the heartbeat is rewritten at most every HEARTBEAT_S; a step held back by that
        is written by a thread once HEARTBEAT_S has passed: a rank that hangs right after it is known to have done
        it)."""
        self._pending = step
        self.alive()
        if self._pending is not None and self._late is None:
            self._late = threading.Thread(target=self._write_late, name="heartbeat-step", daemon=True)
            self._late.start()

    def _write_late(self) -> None:
        """A finished step the throttle held back, written once due; never a beat without a new step (the watchdog
        must see a rank that makes no progress as one)."""
        while not self._closed.wait(self.HEARTBEAT_S):
            if self._pending is not None and time.monotonic() - self._beat >= self.HEARTBEAT_S:
                self._beat = time.monotonic()
                self._write_beat()

    def alive(self) -> None:
        """Progress within a step (an evaluation batch, a checkpoint's part): the heartbeat's time moves on, so the
        launcher's watchdog does not take a long evaluation for a hang."""
        now = time.monotonic()
        if now - self._beat >= self.HEARTBEAT_S:
            self._beat = now
            self._write_beat()

    @contextmanager
    def saving(self) -> Iterator[None]:
        """Around a checkpoint's save: the heartbeat says ``"state": "saving"`` and a thread rewrites it every
        SAVING_BEAT_S, so the launcher's watchdog sees a live rank in a save that takes longer than its limit (and
        still sees a rank that stops: the thread's beats stop with its process)."""
        done = threading.Event()
        beater = threading.Thread(target=self._beat_until, args=(done,), name="heartbeat-saving", daemon=True)
        self._state = "saving"
        self._write_beat()
        beater.start()
        try:
            yield
        finally:
            done.set()
            beater.join()
            self._state = ""
            self._write_beat()

    def _beat_until(self, done: threading.Event) -> None:
        while not done.wait(self.SAVING_BEAT_S):
            self._write_beat()

    def _flush_step(self) -> None:
        if self._pending is not None:
            self._write_beat()

    def _write_beat(self) -> None:
        """The heartbeat now: the pending step (if any) becomes the last one, with the time, memory and state."""
        with self._lock:
            if self._pending is not None:
                self._last, self._pending = self._pending, None
            rss, avail = _memory()
            record = {"step": self._last, "time": round(time.time(), 3), "rss": rss, "host_available": avail}
            beat = json.dumps({**record, "state": self._state} if self._state else record)
            self._heartbeat.seek(0)
            self._heartbeat.write(beat.ljust(self.HEARTBEAT_WIDTH))
            self._heartbeat.flush()

    def write(self, **record: Any) -> None:
        self._flush_step()  # last_step is exact at every logged step and at the end
        now = time.time()
        record.setdefault("time", round(now, 3))
        record.setdefault("wall_s", round(now - self._t0, 3))
        self._file.write(json.dumps(finite(record), allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._closed.set()
        if self._late is not None:
            self._late.join()
        self._flush_step()
        self._file.close()
        self._heartbeat.close()
