"""Which rank's failure ended the run, decided by evidence, never by which rank the launcher signalled.

A rank that ends on its own takes its peers down with it: gloo and NCCL raise "connection closed by peer" in every
rank still talking to it, and those ranks may be seen ending in the same poll. So, among the ranks that ended before
the launcher signalled anyone:

1. a rank whose own error is not the loss of a peer comes before one that only lost its peer;
2. then the earliest: when its error was written (error.json's mtime, ns) or, for a rank that left no error (a
   signal: SIGKILL, SIGSEGV), when the launcher saw it gone;
3. then the lowest rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(aborted|Watchdog caught)|"
    r"(Socket|Connection) [Tt]imeout|Connection refused|recvBytes|sendBytes|Gloo connectFullMesh failed",
)
"""What a rank raises when another rank of its group went away (gloo's and NCCL's words)."""


@dataclass(frozen=True)
class Ending:
    """What the launcher knows about a rank that ended on its own (before the launcher signalled any rank)."""

    rank: int
    exit_code: int
    seen_s: float
    """When the launcher saw it ended (seconds on the launcher's monotonic clock)."""
    error_s: float | None
    """When its error file was written (same clock), if it left one."""
    error: str
    """Its error message (error.json) and the tail of its stderr: what it said as it ended."""

    @property
    def lost_peer(self) -> bool:
        return bool(PEER_LOST.search(self.error))

    @property
    def when(self) -> float:
        return self.error_s if self.error_s is not None else self.seen_s


def first_failure(endings: list[Ending]) -> Ending | None:
    """The rank whose failure ended the run: the first failure (exit code != 0) by the rules above."""
    failed = [e for e in endings if e.exit_code != 0]
    if not failed:
        return None
    return min(failed, key=lambda e: (e.lost_peer, e.when, e.rank))
