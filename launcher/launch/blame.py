"""Which rank ended the run, decided by evidence, never by which rank the launcher signalled.

A rank that ends on its own takes its peers down with it: gloo and NCCL raise "connection closed by peer" in every
rank still talking to it, and those ranks may be seen ending in the same poll. A rank that leaves cleanly (exit code
0) while its peers are still inside a collective does the same, and is the one to name. So, among the ranks that
ended before the launcher signalled anyone, when at least one of them failed:

1. first a rank that failed of its own (its error is not the loss of a peer: an exception, a signal such as SIGKILL
   or SIGSEGV) or that exited 0 before the plan's last step (a recipe's; rank.N/last_step says where it was);
2. then a rank that exited 0 while others went on and then failed having lost a peer (a script's loop, or a recipe's
   rank that had done its steps): the first to leave;
3. then a rank that only lost its peer.

Within the first of these groups that holds a rank, the earliest, comparing only times taken on one clock and of one
kind, the best that every rank of the group has: when each wrote its error file (error.json's mtime, the file
system's clock: the file server's on NFS, whichever host the rank ran on); else when each ended by its exit record
(cluster.launch=mpi|slurm: rank_start's time.time()), only where every record was written on the launcher's host;
else when the launcher saw each gone (its own monotonic clock). Then the lowest rank."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(aborted|Watchdog caught)|"
    r"(Socket|Connection) [Tt]imeout|Connection refused|recvBytes|sendBytes|Gloo connectFullMesh failed",
)
"""What a rank raises when another rank of its group went away (gloo's and NCCL's words)."""

OWN, LEFT, LOST_PEER = 0, 1, 2
"""The groups above, in the order they are blamed."""


@dataclass(frozen=True)
class Ending:
    """What the launcher knows about a rank that ended on its own (before the launcher signalled any rank)."""

    rank: int
    exit_code: int
    seen_s: float
    """When the launcher saw it ended (seconds on the launcher's monotonic clock)."""
    error_s: float | None
    """When its error file was written (error.json's mtime, s, on the file system's clock), if it left one."""
    error: str
    """Its error message (error.json) and the tail of its stderr: what it said as it ended."""
    exit_s: float | None = None
    """When it ended by its exit record (epoch s), only when that record was written on the launcher's host."""
    last_step: int | None = None
    """The last step it recorded (rank.N/last_step), if it recorded one."""
    planned_steps: int | None = None
    """The plan's last step (a recipe's trainer.steps); None for a script, whose own loop decides."""

    @property
    def lost_peer(self) -> bool:
        return self.exit_code != 0 and bool(PEER_LOST.search(self.error))

    @property
    def left_early(self) -> bool:
        """Exited 0 before the plan's last step."""
        return (self.exit_code == 0 and self.planned_steps is not None and self.last_step is not None
                and self.last_step < self.planned_steps)

    @property
    def group(self) -> int:
        if self.exit_code == 0:
            return OWN if self.left_early else LEFT
        return LOST_PEER if self.lost_peer else OWN


def first_failure(endings: list[Ending]) -> Ending | None:
    """The rank that ended the run by the rules above; None when no rank failed (exit code != 0)."""
    if not any(e.exit_code != 0 for e in endings):
        return None
    group = _first_group(endings)
    when, _ = _clock(group)
    return min(group, key=lambda e: (when(e), e.rank))


def _first_group(endings: list[Ending]) -> list[Ending]:
    first = min(e.group for e in endings)
    return [e for e in endings if e.group == first]


def _clock(group: list[Ending]) -> tuple[Callable[[Ending], float], str]:
    """(the time of each ending, what that time is): the best evidence every ending of the group has, on one clock."""
    if all(e.error_s is not None for e in group):
        return (lambda e: e.error_s), "when each wrote its error file (error.json's mtime, the file system's clock)"
    if all(e.exit_s is not None for e in group):
        return (lambda e: e.exit_s), "when each ended by its exit record (written on the launcher's host, its clock)"
    return (lambda e: e.seen_s), "when the launcher saw each end (its own clock)"


def blame_reason(blamed: Ending, endings: list[Ending]) -> str:
    """Why ``blamed`` (first_failure's answer) was named, in words, with the evidence that ordered it."""
    lost = [e.rank for e in endings if e.lost_peer and e.rank != blamed.rank]
    after = f"rank {', '.join(map(str, lost))} then failed having lost a peer" if lost else ""
    if blamed.left_early:
        why = f"it exited 0 at step {blamed.last_step}, before the plan's last step ({blamed.planned_steps})"
    elif blamed.exit_code == 0:
        why = "it exited 0 while other ranks still ran, and no rank failed of its own"
    elif blamed.lost_peer:
        why = "every failure was the loss of a peer (gloo's or NCCL's words in its error); its came first"
    else:
        why = "its error is not the loss of a peer"
    why += f"; {after}" if after and not blamed.lost_peer else ""
    group = _first_group(endings)
    if len(group) > 1:
        _, evidence = _clock(group)
        ranks = ", ".join(str(e.rank) for e in sorted(group, key=lambda e: e.rank))
        why += f"; the first of rank {ranks} by {evidence}"
    return why
