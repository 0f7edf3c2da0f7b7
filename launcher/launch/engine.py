"""Start the ranks through torch.distributed.elastic's multiprocessing API, with our log layout.

torchrun's own path: the agent hosts a TCPStore, starts each rank in its own session with its env and log files,
and the ranks rendezvous on that store (``TORCHELASTIC_USE_AGENT_STORE``). We do the same on one host so that
every rank's variables come from the plan, passed explicitly (the launcher's os.environ is never changed).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, PContext, Std, start_processes

from launcher.backends import lifeline
from launcher.plan import RunPlan
from launcher.plan.ranks import on_node
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


def host_store(host: str, port: int) -> TCPStore:
    """The rendezvous store, listening on master_addr only (127.0.0.1 by default: a single-host run is not reachable
    from the network) at the planned port (0 = a free one, chosen by the OS). OSError when it cannot listen there.

    TCPStore alone would listen on every interface; it is handed a socket bound to master_addr instead."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart listens again on an explicit port
        sock.bind(addr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return TCPStore(host, sock.getsockname()[1], is_master=True, wait_for_workers=False,
                    timeout=timedelta(minutes=10), master_listen_fd=sock.detach())  # the store owns the socket now


def rank_envs(plan: RunPlan, run_dir: RunDir, port: int, attempt: int = 0, max_restarts: int = 0,
              node: int | None = 0, master_addr: str | None = None) -> dict[int, dict[str, str]]:
    """Each of node ``node``'s ranks' variables as it is started (node None: every rank, for mpirun and srun): the
    plan's, the store's real address and port, the run dir, torch elastic's own (TORCHELASTIC_RESTART_COUNT = the
    attempt: init_process_group keys each attempt's rendezvous by it)."""
    return {
        r.rank: {
            **r.env,
            "MASTER_ADDR": master_addr or r.env["MASTER_ADDR"],
            "MASTER_PORT": str(port),
            RUN_DIR_ENV: str(run_dir.path.resolve()),
            "TORCHELASTIC_RUN_ID": run_dir.name,
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": str(attempt),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        }
        for r in (plan.ranks if node is None else on_node(plan.ranks, node))
    }


def local_ranks(plan: RunPlan, envs: dict[int, dict[str, str]]) -> dict[int, int]:
    """local rank -> global rank of the ranks in envs (this host's)."""
    return {r.local_rank: r.rank for r in plan.ranks if r.rank in envs}


class LocalJob:
    """This host's ranks as torch elastic's processes (supervise.RankJob)."""

    def __init__(self, pc: PContext, by_local: dict[int, int]) -> None:
        self._pc, self._by_local = pc, by_local
        self.ranks = tuple(sorted(by_local.values()))

    def poll(self) -> dict[int, int]:
        return {self._by_local[local]: code for local, h in self._pc.subprocess_handlers.items()
                if (code := h.proc.poll()) is not None}

    def pids(self) -> dict[int, int]:
        return {self._by_local[local]: h.proc.pid for local, h in self._pc.subprocess_handlers.items()}

    def stop(self) -> None:
        from launcher.launch.supervise import stop_process_groups

        stop_process_groups([h.proc for h in self._pc.subprocess_handlers.values()])
        self._pc.close(death_sig=signal.SIGKILL, timeout=1)  # reaps the ranks and closes their log files


def spawn_ranks(plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> LocalJob:
    """Start this host's ranks (those in envs) as ``python <plan.rank_args(run_dir)>``, each tied to this process's
    life."""
    by_local = local_ranks(plan, envs)
    # each rank dies with this process (lifeline: the kernel's parent-death signal), then runs python <rank args>
    args = tuple(lifeline.command(os.getpid(), signal.SIGKILL, [sys.executable, *plan.rank_args(str(run_dir.path))]))
    pc = start_processes(
        name=run_dir.name,
        entrypoint=args[0],
        args={local: args[1:] for local in by_local},
        envs={local: dict(envs[rank]) for local, rank in by_local.items()},
        logs_specs=RankLogsSpecs(run_dir),
    )
    return LocalJob(pc, by_local)
