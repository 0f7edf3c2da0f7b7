"""What every launch backend says about itself and how it starts a job's ranks, with the defaults of one that starts
this host's ranks itself (torch elastic's processes: ``local_job``) or, with a ``program``, one mpirun/srun command
for every rank (``external_job``). A backend of another kind overrides ``start`` (and ``job_config``)."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING

from launcher.facts.cluster_files import read_cluster_files
from launcher.backends.job import JobConfig
from launcher.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from launcher.backends.job import RankJob
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
    rdzv_backends: dict = {}
    """The rendezvous backends its launchers may meet at (cluster.rdzv_backend), each name -> what it needs
    (``launcher.backends.elastic.RDZV_BACKENDS``); none for a backend without a rendezvous."""
    scripts: bool = True
    """script= runs (a user's own training loop) can start on it."""
    reads: tuple[str, ...] = ()
    """The cluster.* keys that only this backend reads (cluster.rdzv_endpoint: elastic): set with another backend,
    such a key would change nothing, so the plan refuses it."""

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

    @property
    def starts_every_rank(self) -> bool:
        """One start on this host starts every rank of the world (mpirun, srun), not only this host's."""
        return bool(self.program)

    def job_config(self, cfg: DictConfig, environ: dict[str, str]) -> JobConfig:
        """What ``start`` needs of the config and the environment, read once per run before anything starts: for a
        scheduler's program, the hosts in node order (a hostfile's or rank table's, the Slurm allocation's)."""
        hosts = ()
        if self.program:
            layout = self.layout(cfg, environ)
            hosts = layout.hosts if layout is not None else ()
        return JobConfig(hosts=tuple(hosts), launcher_args=tuple(cfg.cluster.launcher_args))

    def start(self, config: JobConfig, plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> RankJob:
        """Start the ranks in envs (global rank -> its variables, from the plan) and return them as one job.
        Default: this host's as torch elastic's processes; with a ``program``, one ``job_command`` for every rank.
        A rank's output goes to ``run_dir.rank(N)``; it must die with this process (``lifeline``)."""
        if self.program:
            from launcher.backends.external_job import start_job

            return start_job(self.job_command(plan, run_dir, config.hosts, list(config.launcher_args)), plan,
                             run_dir, envs)
        from launcher.backends.local_job import spawn_ranks

        return spawn_ranks(plan, run_dir, envs)


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
