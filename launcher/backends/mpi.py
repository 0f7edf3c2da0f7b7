"""cluster.launch=mpi: OpenMPI's ``mpirun`` starts every rank, on this host or on the hosts of cluster.hostfile /
cluster.rank_table_file (the job itself: ``launcher.backends.external_job``, through ``Backend.start``)."""

from __future__ import annotations

import os

from launcher.backends.base import Backend, find_program, rank_command

FORWARDED_ENV = ("PYTHONPATH", "HL_CACHE_DIR", "PATH")
"""Variables of the launcher that mpirun passes on to ranks on other hosts (-x); the plan's own are in
rank_env.json."""


class MpiBackend(Backend):
    name = "mpi"
    help = "mpi (mpirun)"
    program = "mpirun"
    scheduler_vars = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE")
    reads = ("launcher_args",)

    def problems(self, c) -> list[str]:
        if c.nnodes > 1 and not (c.hostfile or c.rank_table_file):
            return [f"cluster.launch=mpi with cluster.nnodes={c.nnodes}: mpirun needs the hosts. Give "
                    f"cluster.hostfile=<file> ('<host> slots=<N>' lines: OpenMPI's and DeepSpeed's format) or "
                    f"cluster.rank_table_file=<file>."]
        return []

    def ranks_elsewhere(self, c, layout) -> bool:
        return c.nnodes > 1 or layout is not None  # mpirun may start them on a file's hosts

    def check_ready(self, environ: dict[str, str]) -> None:
        find_program("mpirun", "cluster.launch=mpi", "Debian: apt-get install openmpi-bin")

    def job_command(self, plan, run_dir, hosts, extra) -> list[str]:
        return mpirun_command(plan, run_dir, hosts, extra, os.geteuid() == 0)


def mpirun_command(plan, run_dir, hosts: tuple[str, ...], extra: list[str], as_root: bool,
                   mpirun: str = "mpirun") -> list[str]:
    """``mpirun`` for the plan's world: the hosts in node order with nproc_per_node slots each (ranks fill a host
    before the next: the plan's blocks), no core binding (OMP_NUM_THREADS shares the cores), the launcher's
    forwarded variables, then cluster.launcher_args."""
    cmd = [mpirun, "-n", str(plan.world_size), "--bind-to", "none", "--map-by", "slot"]
    if hosts:
        cmd += ["--host", ",".join(f"{h}:{plan.nproc_per_node}" for h in hosts)]
    else:  # this host: as many ranks as planned, whatever slots OpenMPI counts
        cmd += ["--oversubscribe"]
    if as_root:
        cmd += ["--allow-run-as-root"]  # mpirun refuses root unless told; the ranks run as the launcher does
    for name in FORWARDED_ENV:
        cmd += ["-x", name] if name in os.environ else []
    return [*cmd, *extra, *rank_command(run_dir, MpiBackend.name, plan)]
