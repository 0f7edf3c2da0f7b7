"""cluster.launch=local: this host's ranks, started by the launcher as torch elastic's processes
(the job: ``launcher.backends.local_job``, through ``Backend.start``)."""

from __future__ import annotations

from launcher.backends.base import Backend


class LocalBackend(Backend):
    name = "local"
    help = "local (one host)"

    def problems(self, c) -> list[str]:
        if c.nnodes == 1:
            return []
        return [f"cluster.nnodes={c.nnodes} with cluster.launch=local: a local launch starts this host's ranks "
                f"only. Set cluster.launch=elastic cluster.rdzv_endpoint=<host>:<port> and run the same command "
                f"on every host (or cluster.launch=mpi / slurm)."]
