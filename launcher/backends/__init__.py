"""Launch backends: how a run's ranks start and stop, one module each (``cluster.launch``).

- ``local``: this host's ranks, started by the launcher as torch elastic's processes.
- ``elastic``: one launcher on every host; they meet at torch elastic's c10d rendezvous, which gives each its node
  rank, then each starts its host's ranks as ``local`` does.
- ``mpi``: OpenMPI's ``mpirun`` starts every rank (on the hosts of a hostfile or rank table).
- ``slurm``: Slurm's ``srun`` starts every rank inside an allocation (a dry run writes ``job.sbatch``).

A backend says what it can run (``problems``, ``restarts``, ``scripts``), where the hosts come from (``layout``),
and how the job's ranks start and stop (``start`` -> a ``RankJob``: ``poll``, ``pids``, ``stop``; ``job_config``
reads what it needs of the config once). A new backend is one module and one ``register`` line. What every
backend shares is written once, beside this seam: ranks die with their launcher (``launcher.lifeline``), stopping a job's
processes (``processes``), and the launcher does not return while a process of its job lives
(``launch.supervise``).

Names are compared here and in the backends' own modules only; everywhere else a backend is asked what it knows.
This package is torch-free where the plan's facts read it (a job's own module, ``local_job``, imports
torch when a job starts). The plan imports none of it: it gets ``BACKENDS``' values in ``Facts.backends`` (the
``launcher.contract.BackendRules`` each backend answers), gathered before planning."""

from __future__ import annotations

from launcher.backends.base import Backend
from launcher.backends.elastic import ElasticBackend
from launcher.backends.job import JobConfig, RankJob
from launcher.backends.local import LocalBackend
from launcher.backends.mpi import MpiBackend
from launcher.backends.slurm import SlurmBackend

__all__ = ["BACKENDS", "Backend", "JobConfig", "RankJob", "backend", "names", "register"]

BACKENDS: dict[str, Backend] = {}


def register(b: Backend) -> Backend:
    """Add a backend to the registry under ``b.name`` (cluster.launch=<name>): the plan's rules, the launch path and
    the messages' lists of choices see it from then on. A second backend of the same name is refused."""
    if not b.name or b.name in BACKENDS:
        raise ValueError(f"a launch backend needs a name of its own; {b.name!r} is taken or empty")
    BACKENDS[b.name] = b
    return b


for _b in (LocalBackend(), ElasticBackend(), MpiBackend(), SlurmBackend()):
    register(_b)
del _b


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend(name: str) -> Backend:
    """The backend called ``name`` (cluster.launch); KeyError for another name (the plan's rules report it first)."""
    return BACKENDS[str(name)]
