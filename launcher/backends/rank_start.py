"""The first process of a rank that mpirun or srun started (cluster.launch=mpi|slurm).

``python -m launcher.backends.rank_start <run_dir> <mpi|slurm> -- <python args of the rank>``

OpenMPI and Slurm start the processes themselves and describe each one in their own variables. This maps them to
torch's (``OMPI_COMM_WORLD_RANK`` / ``SLURM_PROCID`` -> ``RANK``, ...), checks that the scheduler put the rank where
the plan has it (global rank, local rank and world size), and starts the rank as a child with the plan's
environment (``rank_env.json``, written by the launcher) and its output in ``rank.N/{stdout,stderr}``, as the local
backend does. It stays as the rank's parent to forward signals and to record how the rank ended (``rank.N/exit``:
code and time, the launcher's evidence for blame), then exits as the rank did.

It imports nothing heavy: it is in every rank's start-up time."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from launcher import lifeline
from launcher.backends import BACKENDS, backend
from launcher.rundir import RunDir

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)


def scheduler_rank(scheduler: str, environ: dict[str, str]) -> tuple[int, int, int]:
    """(global rank, local rank, world size) as the scheduler describes this process; ValueError naming what is
    missing."""
    names = backend(scheduler).scheduler_vars
    missing = [n for n in names if not environ.get(n, "").isdigit()]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set: this process was not started by {backend(scheduler).program}")
    rank, local, world = (int(environ[n]) for n in names)
    return rank, local, world


def rank_environment(scheduler: str, environ: dict[str, str], planned: dict[str, dict[str, str]]) -> tuple[int, dict]:
    """(global rank, the rank's full environment): the scheduler's, then the plan's for that rank. ValueError
    when the scheduler placed the process elsewhere than the plan (another world size, or local rank)."""
    rank, local, world = scheduler_rank(scheduler, environ)
    if str(rank) not in planned or len(planned) != world:
        raise ValueError(f"{backend(scheduler).scheduler_vars[2]}={world} but the plan has {len(planned)} ranks: start the "
                         f"ranks through hetero-launch (cluster.launch={scheduler}), which asks for the right number")
    env = planned[str(rank)]
    if env["LOCAL_RANK"] != str(local):
        raise ValueError(f"the scheduler made rank {rank} local rank {local} of its host; the plan has local rank "
                         f"{env['LOCAL_RANK']} (ranks are placed in blocks of LOCAL_WORLD_SIZE="
                         f"{env['LOCAL_WORLD_SIZE']} per host). Remove a --map-by/--distribution option from "
                         f"cluster.launcher_args")
    return rank, {**environ, **env}


def main(argv: list[str]) -> int:
    external = [name for name, b in BACKENDS.items() if b.scheduler_vars]
    if len(argv) < 3 or argv[1] not in external or "--" not in argv:
        print(f"usage: python -m launcher.backends.rank_start <run_dir> <{'|'.join(external)}> -- <python args>",
              file=sys.stderr)
        return 2
    run_dir, scheduler, args = RunDir(argv[0]), argv[1], argv[argv.index("--") + 1 :]
    if os.getppid() == 1:  # the scheduler that started this process is gone already
        return 128 + signal.SIGTERM
    lifeline.die_with_parent(os.getppid(), signal.SIGTERM)  # should mpirun's or srun's process go: stop the rank
    try:
        planned = run_dir.read_json(run_dir.rank_env)
        rank, env = rank_environment(scheduler, dict(os.environ), planned)
    except (OSError, ValueError) as e:
        print(f"hetero-launch rank start ({socket.gethostname()}): {e}", file=sys.stderr)
        return 2
    rank_dir = run_dir.rank(rank)
    rank_dir.path.mkdir(parents=True, exist_ok=True)
    env["TORCHELASTIC_ERROR_FILE"] = str(rank_dir.error)
    child, pending = None, []

    def forward(signum: int, _frame) -> None:  # installed before the rank starts: no signal falls between
        if child is None:
            pending.append(signum)
        else:
            child.send_signal(signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    parent = os.getpid()
    with open(rank_dir.stdout, "wb") as out, open(rank_dir.stderr, "wb") as err:
        child = subprocess.Popen([sys.executable, *args], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 preexec_fn=lambda: lifeline.die_with_parent(parent))
    rank_dir.write_pid(child.pid)
    for signum in pending:  # what came while the rank was being started
        child.send_signal(signum)
    code = child.wait()
    rank_dir.write_exit(code, time.time())
    if code < 0:  # end as the rank did: the scheduler reports the signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # (those two cannot be caught: no handler to reset)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
