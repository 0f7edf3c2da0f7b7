"""Start the ranks through torch.distributed.elastic's multiprocessing API, with our log layout.

torchrun's own path: the agent hosts a TCPStore, starts each rank in its own session with its env and log files,
and the ranks rendezvous on that store (``TORCHELASTIC_USE_AGENT_STORE``). We do the same on one host so that
every rank's variables come from the plan, passed explicitly (the launcher's os.environ is never changed).
"""

from __future__ import annotations

import sys
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, Std, start_processes

from launcher.plan import RunPlan
from launcher.rundir import RUN_DIR_ENV, RunDir


class RankLogsSpecs(LogsSpecs):
    """``<run_dir>/rank.<RANK>/{stdout,stderr,error.json}``: one folder per global rank, one attempt per run."""

    def __init__(self, run_dir: RunDir) -> None:
        super().__init__(log_dir=str(run_dir.path), redirects=Std.ALL, tee=Std.NONE)
        self._run_dir = run_dir

    @property
    def root_log_dir(self) -> str:
        return str(self._run_dir.path)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Called by start_processes; like DefaultLogsSpecs it also tells each rank its error file via envs."""
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank_dir = self._run_dir.rank(int(env["RANK"]))
            rank_dir.path.mkdir(parents=True, exist_ok=True)
            dest.stdouts[local_rank] = str(rank_dir.stdout)
            dest.stderrs[local_rank] = str(rank_dir.stderr)
            dest.error_files[local_rank] = str(rank_dir.error)
            env["TORCHELASTIC_ERROR_FILE"] = str(rank_dir.error)  # where @record in the worker writes
        return dest


def host_store(plan: RunPlan) -> TCPStore:
    """The rendezvous store, on master_addr at the planned port (0 = a free one, chosen by the OS)."""
    env = plan.ranks[0].env
    return TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=True, wait_for_workers=False,
        timeout=timedelta(minutes=10),
    )


def rank_envs(plan: RunPlan, run_dir: RunDir, port: int) -> dict[int, dict[str, str]]:
    """Each rank's variables as it is started: the plan's, the store's real port, the run dir, torch elastic's own."""
    return {
        r.rank: {
            **r.env,
            "MASTER_PORT": str(port),
            RUN_DIR_ENV: str(run_dir.path.resolve()),
            "TORCHELASTIC_RUN_ID": run_dir.name,
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
        }
        for r in plan.ranks
    }


def spawn_ranks(plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> PContext:
    """Start this host's ranks as ``python <plan.rank_args(run_dir)>``."""
    by_local = {r.local_rank: r.rank for r in plan.ranks}
    args = plan.rank_args(str(run_dir.path))
    return start_processes(
        name=run_dir.name,
        entrypoint=sys.executable,
        args={local: args for local in by_local},
        envs={local: dict(envs[rank]) for local, rank in by_local.items()},
        logs_specs=RankLogsSpecs(run_dir),
    )
