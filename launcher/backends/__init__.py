"""Launch backends: how a run's ranks start and stop, one module each (``cluster.launch``).

- ``local``: this host's ranks, started by the launcher as torch elastic's processes.
- ``elastic``: one launcher on every host; they meet at torch elastic's c10d rendezvous, which gives each its node
  rank, then each starts its host's ranks as ``local`` does.
- ``mpi``: OpenMPI's ``mpirun`` starts every rank (on the hosts of a hostfile or rank table).
- ``slurm``: Slurm's ``srun`` starts every rank inside an allocation (a dry run writes ``job.sbatch``).

A backend says what it can run (``problems``, ``restarts``, ``scripts``), where the hosts come from (``layout``),
and how the job's ranks start (``job_command``: the scheduler's command line, or None when the launcher starts them
itself). What every backend shares is written once, beside this seam: ranks die with their launcher
(``lifeline``), and the launcher does not return while a process of its job lives (``launch.supervise``).

Names are compared here and in the backends' own modules only; everywhere else a backend is asked what it knows.
This package is torch-free. The plan imports none of it: it gets ``BACKENDS``' values in ``Facts.backends`` (the
``launcher.contract.BackendRules`` each backend answers), gathered before planning.
"""

from __future__ import annotations

from launcher.backends.base import Backend
from launcher.backends.elastic import ElasticBackend
from launcher.backends.local import LocalBackend
from launcher.backends.mpi import MpiBackend
from launcher.backends.slurm import SlurmBackend

__all__ = ["BACKENDS", "Backend", "backend", "names"]

BACKENDS: dict[str, Backend] = {b.name: b for b in (LocalBackend(), ElasticBackend(), MpiBackend(), SlurmBackend())}


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend(name: str) -> Backend:
    """The backend called ``name`` (cluster.launch); KeyError for another name (the plan's rules report it first)."""
    return BACKENDS[str(name)]
