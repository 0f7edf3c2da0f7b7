"""What every launch backend says about itself, with the defaults of one that starts this host's ranks itself."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING

from launcher.backends.cluster_files import read_cluster_files
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from launcher.plan import RunPlan
    from launcher.plan.layout import ClusterLayout
    from launcher.rundir import RunDir


class Backend:
    name: str = ""
    help: str = ""
    """What it is, for the list of choices in messages: 'local (one host)'."""
    program: str = ""
    """The scheduler's program that starts every rank (mpirun, srun); '' when the launcher starts its host's
    ranks itself. Ranks started by a program go through ``launcher.backends.rank_start``, which records their end."""
    scheduler_vars: tuple[str, str, str] | tuple[()] = ()
    """The scheduler's variables for a process's (global rank, local rank, world size)."""
    launcher_per_host: bool = False
    """One launcher runs on every host and they meet at a rendezvous, which gives each its node rank."""
    restarts: bool = True
    """launcher.max_restarts > 0 restarts the job in place."""
    scripts: bool = True
    """script= runs (a user's own training loop) can start on it."""

    def problems(self, c: DictConfig) -> list[str]:
        """Problems of the cluster.* keys that only this backend has (cluster.launch is this one)."""
        return []

    def layout(self, cfg: DictConfig, environ: dict[str, str]) -> ClusterLayout | None:
        """The hosts and ranks the run is given (a rank table or hostfile; None: this host, as cluster.* says)."""
        return read_cluster_files(cfg)

    def ranks_elsewhere(self, c: DictConfig, layout: ClusterLayout | None) -> bool:
        """Ranks may run on other hosts than the launcher's (they then reach its store at this host's name)."""
        return c.nnodes > 1

    def check_ready(self, environ: dict[str, str]) -> None:
        """ConfigError when this host cannot start the job (a program missing, no allocation), before anything
        starts."""

    def job_command(self, plan: RunPlan, run_dir: RunDir, hosts: tuple[str, ...], extra: list[str]) -> list[str]:
        """The scheduler's command line that starts every rank (only for a backend with a ``program``)."""
        raise NotImplementedError(f"cluster.launch={self.name} starts its ranks itself")

    def write_dry_run(self, run_dir: RunDir, plan: RunPlan, argv: list[str], log_dir: str) -> None:
        """What a dry run writes for this backend besides the plan (Slurm: the batch script)."""


def find_program(name: str, key: str, package: str) -> str:
    """The scheduler program's path, or a ConfigError saying how to get it (before any run dir exists)."""
    path = shutil.which(name)
    if path is None:
        raise ConfigError(f"{key}: `{name}` is not on PATH. Install it ({package}), or use cluster.launch=local "
                          f"(one host) or elastic (several hosts, torch's own rendezvous).")
    return path


def rank_command(run_dir: RunDir, scheduler: str, plan: RunPlan) -> list[str]:
    """What a scheduler's program (mpirun, srun) starts on each rank's host: ``launcher.backends.rank_start``."""
    return [sys.executable, "-m", "launcher.backends.rank_start", str(run_dir.path.resolve()), scheduler, "--",
            *plan.rank_args(str(run_dir.path.resolve()))]
