"""cluster.launch=slurm: Slurm's ``srun`` starts every rank inside an allocation (its hosts from Slurm); outside one,
a dry run writes ``job.sbatch``, which runs the same command inside one (the job itself:
``launcher.backends.external_job``, through ``Backend.start``)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from launcher.backends.base import Backend, find_program, rank_command

ALLOCATION = "SLURM_JOB_ID"
"""Set inside a Slurm allocation."""


class SlurmBackend(Backend):
    name = "slurm"
    help = "slurm (srun)"
    program = "srun"
    scheduler_vars = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
    reads = ("launcher_args",)

    def layout(self, cfg, environ):
        return allocation_layout(cfg, environ) or super().layout(cfg, environ)

    def check_ready(self, environ: dict[str, str]) -> None:
        from launcher.errors import ConfigError
        find_program("srun", "cluster.launch=slurm", "Debian: apt-get install slurm-client")
        if ALLOCATION not in environ:
            raise ConfigError("cluster.launch=slurm runs inside a Slurm allocation (SLURM_JOB_ID is not set here). "
                              "Run the same command with dry_run=true: it writes job.sbatch into the run dir; submit "
                              "it with `sbatch log_output/latest/job.sbatch`. Or run inside `salloc`.")

    def job_command(self, plan, run_dir, hosts, extra) -> list[str]:
        return srun_command(plan, run_dir, extra)

    def write_dry_run(self, run_dir, plan, argv, log_dir) -> None:
        run_dir.sbatch.write_text(sbatch_script(plan, list(argv), Path.cwd(), Path(log_dir).resolve()))


def srun_command(plan, run_dir, extra: list[str]) -> list[str]:
    """``srun`` for the plan's world inside the allocation: nnodes × nproc_per_node tasks in blocks (Slurm's
    default distribution), one failed task ends the step, each task the CPUs the plan gives a rank (OMP_NUM_THREADS:
    the node's cores shared by its ranks, as the plan made on the node found them), no CPU binding."""
    threads = int(plan.ranks[0].env.get("OMP_NUM_THREADS", "1"))
    return ["srun", f"--nodes={plan.nnodes}", f"--ntasks={plan.world_size}",
            f"--ntasks-per-node={plan.nproc_per_node}", f"--cpus-per-task={threads}", "--distribution=block",
            "--kill-on-bad-exit=1", "--cpu-bind=none", f"--job-name={run_dir.name}", *extra,
            *rank_command(run_dir, SlurmBackend.name, plan)]


def sbatch_script(plan, argv: list[str], cwd: Path, log_dir: Path) -> str:
    """A batch script that runs this plan inside an allocation: ``sbatch job.sbatch``. Every argument is quoted
    for the shell (shlex.quote): no value of the config reaches it unquoted. It asks for whole nodes (--exclusive):
    the CPUs a rank gets are the target node's cores shared by its ranks, planned on that node when the script runs
    (srun's --cpus-per-task), not this host's (a login node's)."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(plan.name)}",
        f"#SBATCH --nodes={plan.nnodes}",
        f"#SBATCH --ntasks-per-node={plan.nproc_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={q(str(log_dir / 'slurm-%j.out'))}",
    ]
    if plan.device_type == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={plan.nproc_per_node}")
    args = [a for a in argv if not a.startswith(("dry_run=", "cluster.launch="))]
    lines += [
        "# Written by hetero-launch's dry run: the same command, run by srun inside the allocation.",
        "set -euo pipefail",
        f"cd {q(str(cwd))}",
        "exec " + " ".join(q(a) for a in [sys.executable, "-m", "launcher.cli", *args, "cluster.launch=slurm"]),
    ]
    return "\n".join(lines) + "\n"


def allocation_layout(cfg, environ: dict[str, str]):
    """Inside an allocation (SLURM_JOB_ID set): its hosts (``scontrol show hostnames``) and tasks per node
    (SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE when every node has the same). None outside one (a dry run
    then writes job.sbatch)."""
    import subprocess

    from launcher.errors import ConfigError
    from launcher.plan.hostfile import hostfile_layout

    if ALLOCATION not in environ:
        return None
    source = f"the Slurm allocation (SLURM_JOB_ID={environ[ALLOCATION]})"
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    try:
        res = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        hosts = res.stdout.split() if res.returncode == 0 else []
    except (OSError, subprocess.SubprocessError):
        hosts = []
    if not hosts:
        raise ConfigError(f"cluster.launch=slurm: cannot list the hosts of {source} (`scontrol show hostnames "
                          f"{nodelist}` failed). Run hetero-launch inside the allocation's batch script or salloc.")
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    if not per_node.isdigit():  # e.g. "2(x3)" or "2,1": only the same count on every node fits the plan
        counts = environ.get("SLURM_TASKS_PER_NODE", "").split("(")[0]
        per_node = counts if counts.isdigit() and "," not in environ.get("SLURM_TASKS_PER_NODE", ",") else ""
    nproc = int(per_node) if per_node.isdigit() else (int(cfg.cluster.nproc_per_node)
                                                      if str(cfg.cluster.nproc_per_node).isdigit() else 0)
    if nproc < 1:
        raise ConfigError(f"cluster.nproc_per_node={cfg.cluster.nproc_per_node}: {source} does not say how many "
                          f"tasks each node runs. Allocate with --ntasks-per-node=N (as the dry run's job.sbatch "
                          f"does), or set cluster.nproc_per_node=N.")
    return hostfile_layout([(h, list(range(nproc))) for h in hosts], source)
