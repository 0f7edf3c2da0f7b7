"""Liveness between the hosts of an elastic job (cluster.launch=elastic): each launcher shows the others it is alive
and watches them, through the round's rendezvous store, on a thread of its own.

Every ``beat_s`` (cluster.heartbeat_timeout_s / 6, 0.2 to 5 s) the thread adds 1 to ``hl/beat/<node>``, reads every
other node's count (an ``add`` of 0: no call waits for a key), the round's published failure (``hl/failed``) and,
when the round admits hosts, whether one waits to join. A node whose count has not moved while the store answered
for heartbeat_timeout_s is **lost** (its launcher is gone, or its link); when the thread's own calls have not come back for that long, the
**store is lost** (this host is cut off from the store's host, or that host is gone): a TCPStore call on a link that
drops packets does not return within its timeout (measured: still blocked after 27 s with a 20 s timeout), so no
call of the supervising loop is made on the store while ranks run; the loop only reads what the thread found
(``lost``, ``failure``, ``waiting``). A lost store is not called again: the launcher stops its ranks, reports and
exits without the goodbyes that would wait on it."""

from __future__ import annotations

import json
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

BEAT_KEY = "hl/beat/"
FAILED_KEY = "hl/failed"


def beat_interval(timeout_s: float) -> float:
    """Seconds between two beats: six within the timeout, 0.2 to 5 s."""
    return min(5.0, max(0.2, timeout_s / 6))


@dataclass(frozen=True)
class Silence:
    """What the liveness check found: nodes not heard from, or the store itself."""

    nodes: tuple[int, ...]
    """The silent nodes (for a lost store: every other node, none of which can be heard)."""
    store: bool
    """The store did not answer this host for the timeout."""
    silent_s: float


class Liveness:
    def __init__(self, store: Any, node: int, nnodes: int, timeout_s: float, handler: Any = None,
                 admit: bool = False) -> None:
        self.store, self.node, self.timeout_s = store, node, timeout_s
        self.handler, self.admit = handler, admit
        self.beat_s = beat_interval(timeout_s)
        now = time.monotonic()
        self._heard = {n: (-1, now) for n in range(nnodes) if n != node}
        """node -> (its last count, when this host saw it change)."""
        self._answered = now
        """When the store last answered a whole beat."""
        self.failure: dict[str, Any] | None = None
        """The failure a node published for the round (hl/failed), once the thread has read it."""
        self.waiting = 0
        """Hosts waiting to join (with ``admit``)."""
        self.store_lost = False
        """Set once the store is found lost: nothing calls it again."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hl-liveness", daemon=True)

    def start(self) -> "Liveness":
        self._thread.start()
        return self

    def stop(self, join: bool = False) -> None:
        """No more beats; ``join``: wait (a few seconds at most) for a beat under way, so that nothing else calls the
        store or the rendezvous handler meanwhile (not when the store is lost: that beat may never return)."""
        self._stop.set()
        if join and not self.store_lost and self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.store_lost:
            with suppress(Exception):  # whatever the store raised: silence, judged by time in silence()
                self._beat()
            self._stop.wait(self.beat_s)

    def _beat(self) -> None:
        self.store.add(BEAT_KEY + str(self.node), 1)
        for n, (count, _) in list(self._heard.items()):
            now_count = self.store.add(BEAT_KEY + str(n), 0)
            if now_count != count:
                self._heard[n] = (now_count, time.monotonic())
        if self.failure is None and self.store.check([FAILED_KEY]):
            self.failure = json.loads(self.store.get(FAILED_KEY))
        if self.admit and self.handler is not None:
            self.waiting = int(self.handler.num_nodes_waiting())
        self._answered = time.monotonic()

    def silence(self) -> Silence | None:
        """The store or the nodes not heard from for the timeout, if any (the store first: when it does not answer,
        no node can be heard)."""
        now = time.monotonic()
        if self.store_lost or now - self._answered > self.timeout_s:
            self.store_lost = True
            return Silence(nodes=tuple(sorted(self._heard)), store=True, silent_s=round(now - self._answered, 1))
        # A node is silent when the store answered for the timeout while its count stood still: while the store
        # does not answer, no node can be heard, and the silence is the store's.
        silent = [n for n, (_, seen) in self._heard.items() if self._answered - seen > self.timeout_s]
        if not silent:
            return None
        return Silence(nodes=tuple(sorted(silent)), store=False,
                       silent_s=round(max(now - self._heard[n][1] for n in silent), 1))
