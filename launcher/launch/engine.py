"""Start the ranks through torch.distributed.elastic's multiprocessing API, with our log layout.

torchrun's own path: the agent hosts a TCPStore, starts each rank in its own session with its env and log files,
and the ranks rendezvous on that store (``TORCHELASTIC_USE_AGENT_STORE``). We do the same on one host so that
every rank's variables come from the plan, passed explicitly (the launcher's os.environ is never changed).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, Std, start_processes

from launcher.plan import LaunchPlan
from launcher.plan.script import ScriptPlan


class RankLogsSpecs(LogsSpecs):
    """``<run_dir>/rank.<RANK>/{stdout,stderr,error.json}``: one folder per global rank, one attempt per run."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(log_dir=str(run_dir), redirects=Std.ALL, tee=Std.NONE)
        self._run_dir = run_dir

    @property
    def root_log_dir(self) -> str:
        return str(self._run_dir)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """Called by start_processes; like DefaultLogsSpecs it also tells each rank its error file via envs."""
        dest = LogsDest()
        for local_rank, env in envs.items():
            folder = self._run_dir / f"rank.{env['RANK']}"
            folder.mkdir(parents=True, exist_ok=True)
            dest.stdouts[local_rank] = str(folder / "stdout")
            dest.stderrs[local_rank] = str(folder / "stderr")
            dest.error_files[local_rank] = str(folder / "error.json")
            env["TORCHELASTIC_ERROR_FILE"] = str(folder / "error.json")  # where @record in the worker writes
        return dest


def host_store(plan: LaunchPlan | ScriptPlan) -> TCPStore:
    """The rendezvous store, on master_addr at the planned port (0 = a free one, chosen by the OS)."""
    env = plan.ranks[0].env
    return TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=True, wait_for_workers=False,
        timeout=timedelta(minutes=10),
    )


def spawn_ranks(plan: LaunchPlan | ScriptPlan, run_dir: Path, run_id: str, port: int) -> PContext:
    """Start this host's ranks as ``python -m launcher.worker <run_dir>`` (or ``python <script> <args>``)."""
    envs, args = {}, {}
    for r in plan.ranks:
        envs[r.local_rank] = {
            **r.env,
            "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
        }
        if isinstance(plan, ScriptPlan):  # the user's script, as torchrun would start it
            args[r.local_rank] = (str(Path(plan.script).resolve()), *plan.args)
        else:
            args[r.local_rank] = ("-m", "launcher.worker", str(run_dir))
    return start_processes(
        name=run_id,
        entrypoint=sys.executable,
        args=args,
        envs=envs,
        logs_specs=RankLogsSpecs(run_dir),
    )
