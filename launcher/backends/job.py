"""The seam between a launch backend and the launcher's one path (torchrun's ``LaunchConfig -> elastic_launch ->
agent``): the launcher makes the run dir and the ranks' variables, asks the backend to ``start`` the ranks, and
supervises what it gets back, a ``RankJob``, the same way whoever started them (torch elastic's processes, one
mpirun/srun, a toy backend's own Popen). What a backend needs of the config besides the plan it reads once, before
anything starts, into a ``JobConfig``.

Torch-free: the registry (and through it the plan's facts) imports this module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class JobConfig:
    """What starting a job needs besides the plan, read from the config and the environment once per run
    (``Backend.job_config``), as torchrun's ``LaunchConfig``; frozen so every attempt starts the same way."""

    hosts: tuple[str, ...] = ()
    """The hosts the ranks run on, in node order (a hostfile's, a rank table's, a Slurm allocation's): the run's
    rank table names them. () = this host (or the hosts a rendezvous gives, which writes its own table)."""
    launcher_args: tuple[str, ...] = ()
    """cluster.launcher_args: extra arguments for the scheduler's program, one item each."""


class RankJob(Protocol):
    """The ranks of one attempt, however a backend started them: what supervision (``launch.supervise``), the
    watchdog and the reports ask of them."""

    ranks: tuple[int, ...]
    """The global ranks this launcher watches."""

    def poll(self) -> dict[int, int]:
        """The exit code of each rank that has ended (global rank -> code; negative: killed by that signal)."""

    def pids(self) -> dict[int, int]:
        """The process of each rank on this host (the watchdog asks them for stacks)."""

    def stop(self) -> None:
        """Stop every rank (SIGTERM, SIGKILL after ``processes.STOP_TIMEOUT_S`` or on a second signal) and reap
        them; also called when every rank has ended (a rank's leftover children go with it)."""
