"""Ranks started by the cluster's own launcher, one command for the whole job: OpenMPI's ``mpirun``
(cluster.launch=mpi) or Slurm's ``srun`` (cluster.launch=slurm, inside an allocation); ``Backend.start`` of a backend
with a ``program`` runs it.

The launcher hosts the rendezvous store (as with the local backend), writes every rank's environment to
``rank_env.json`` and runs one ``mpirun``/``srun`` command, built as an argument list, that starts
``launcher.backends.rank_start`` once per rank: it maps the scheduler's variables to torch's, redirects the rank's
output to ``rank.N/`` and records how the rank ended (``rank.N/exit.json``). The launcher supervises through those
records and the heartbeats; the scheduler's own output goes to ``backend.log``. Ranks on other hosts see the run
dir through a shared file system (as mpirun and Slurm users have; the elastic backend needs none)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from contextlib import suppress

from launcher import lifeline
from launcher.backends.processes import STOP_TIMEOUT_S, send_signals, wait_ended
from launcher.plan import RunPlan
from launcher.rundir import RunDir

LINGER_S = 0.5
"""How long mpirun/srun get to end by themselves once every rank has recorded its end, when stopping."""


class ExternalJob:
    """The ranks of one mpirun/srun command (a ``job.RankJob``), seen through their exit records and pid files."""

    def __init__(self, proc: subprocess.Popen, run_dir: RunDir, ranks: tuple[int, ...]) -> None:
        self._proc, self._run_dir, self.ranks = proc, run_dir, ranks
        self._host = socket.gethostname()

    def poll(self) -> dict[int, int]:
        """Each ended rank's code from its exit record; once mpirun/srun itself has ended, a rank without one
        (never started, or its rank_start was killed) gets the scheduler's exit code (1 if that was 0)."""
        backend = self._proc.poll()  # first: the records of ranks that ended before it are on disk by then
        out = {}
        for rank in self.ranks:
            record = self._run_dir.rank(rank).read_exit()
            if record is not None:
                out[rank] = record["exit_code"]
            elif backend is not None:
                out[rank] = backend or 1
        return out

    def pids(self) -> dict[int, int]:
        out = {}
        for rank in self.ranks:
            found = self._run_dir.rank(rank).read_pid()
            if found is not None and found[0] == self._host:
                out[rank] = found[1]
        return out

    def _recorded(self) -> bool:
        return all(self._run_dir.rank(r).read_exit() is not None for r in self.ranks)

    def stop(self) -> None:
        """SIGTERM to this host's ranks and to mpirun/srun (which forward it to every rank; rank_start passes it on),
        then wait: for the scheduler to end, or, once every rank has recorded its end, LINGER_S more (mpirun takes
        seconds to wind down after its ranks are gone; nothing of the run is left in it). SIGKILL after
        STOP_TIMEOUT_S or on a second signal, to the scheduler's process group and to this host's ranks that have
        not recorded their end."""
        from torch.distributed.elastic.multiprocessing.api import SignalException

        local = self.pids()
        send_signals([self._proc.pid], (signal.SIGTERM, signal.SIGCONT))
        send_signals(list(local.values()), (signal.SIGTERM, signal.SIGCONT), os.kill)
        deadline, recorded_at = time.monotonic() + STOP_TIMEOUT_S, None
        with suppress(KeyboardInterrupt, SignalException):  # a second signal: no more grace
            while self._proc.poll() is None and time.monotonic() < deadline:
                if recorded_at is None and self._recorded():
                    recorded_at = time.monotonic()
                if recorded_at is not None and time.monotonic() - recorded_at > LINGER_S:
                    break
                time.sleep(0.05)
        send_signals([self._proc.pid], (signal.SIGKILL,))
        send_signals([pid for rank, pid in local.items() if self._run_dir.rank(rank).read_exit() is None],
                     (signal.SIGKILL,), os.kill)
        self._proc.wait()
        wait_ended(list(local.values()))


def start_job(command: list[str], plan: RunPlan, run_dir: RunDir, envs: dict[int, dict[str, str]]) -> ExternalJob:
    """Run mpirun/srun (in its own session, its output in backend.log) for every rank in envs. Its rank dirs hold no
    record of an earlier attempt: a restart moves them to attempt.<k>/ first (attempt.archive_attempt)."""
    with open(run_dir.backend_log, "ab") as log:
        log.write(("$ " + shlex.join(command) + "\n").encode())
        log.flush()
        # mpirun/srun gets SIGTERM should this process die (lifeline): it then stops the ranks on every host
        proc = subprocess.Popen(lifeline.command(os.getpid(), signal.SIGTERM, command), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return ExternalJob(proc, run_dir, tuple(sorted(envs)))

