"""The rendezvous store the launcher hosts, and each rank's variables as it is started, whichever backend starts it.

torchrun's own path: the agent hosts a TCPStore and the ranks rendezvous on it (``TORCHELASTIC_USE_AGENT_STORE``);
each rank's variables come from the plan, passed explicitly (the launcher's os.environ is never changed). Starting
the ranks is the backend's (``launcher.backends``: ``local_job.py`` for this host's, ``external_job.py`` for
mpirun/srun)."""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import TCPStore

from launcher.plan import RunPlan
from launcher.plan.ranks import on_node
from launcher.rundir import RUN_DIR_ENV, RunDir


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
