"""mpirun and srun (cluster.launch=mpi|slurm): the commands are argument lists built from the plan, each rank maps
its scheduler's variables to torch's, and the batch script quotes every value; bad input is exit 2 before a run."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.backends.mpi import mpirun_command
from launcher.backends.slurm import sbatch_script, srun_command
from launcher.backends.rank_start import rank_environment
from launcher.rundir import RunDir
from tests.conftest import plan_of


def _planned(world: int, per_node: int) -> dict[str, dict[str, str]]:
    return {str(r): {"RANK": str(r), "LOCAL_RANK": str(r % per_node), "LOCAL_WORLD_SIZE": str(per_node),
                     "MASTER_PORT": "29500"} for r in range(world)}


def test_mpirun_places_blocks_of_ranks_on_the_hostfiles_hosts(cpu_host, tmp_path):
    plan = plan_of(["recipe=quickstart", "cluster.launch=mpi", "cluster.nnodes=2", "cluster.nproc_per_node=2",
                    "cluster.hostfile=h", "cluster.master_addr=10.0.0.1"], cpu_host)
    run_dir = RunDir(tmp_path / "run")
    cmd = mpirun_command(plan, run_dir, ("n0", "n1"), ["--mca", "btl", "tcp,self"], as_root=False)
    assert cmd[:3] == ["mpirun", "-n", "4"] and "--allow-run-as-root" not in cmd
    assert cmd[cmd.index("--host") + 1] == "n0:2,n1:2" and cmd[cmd.index("--bind-to") + 1] == "none"
    tail = cmd[cmd.index("tcp,self") + 1:]
    assert tail == [sys.executable, "-m", "launcher.backends.rank_start", str(run_dir.path.resolve()), "mpi", "--",
                    "-m", "launcher.worker", str(run_dir.path.resolve())]
    one = mpirun_command(plan_of(["recipe=quickstart", "cluster.launch=mpi"], cpu_host), run_dir, (), [], True)
    assert "--oversubscribe" in one and "--allow-run-as-root" in one and "--host" not in one


def test_srun_asks_for_the_plans_tasks_per_node(cpu_host, tmp_path):
    plan = plan_of(["recipe=quickstart", "cluster.launch=slurm", "cluster.nnodes=3", "cluster.nproc_per_node=2",
                    "data.samples=512"],
                   cpu_host)
    cmd = srun_command(plan, RunDir(tmp_path / "r"), ["--exclusive"])
    assert cmd[:4] == ["srun", "--nodes=3", "--ntasks=6", "--ntasks-per-node=2"]
    assert "--kill-on-bad-exit=1" in cmd and cmd[cmd.index("--exclusive") + 1] == sys.executable


def test_each_rank_maps_its_schedulers_variables(tmp_path):
    planned = _planned(4, 2)
    rank, env = rank_environment("mpi", {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                                         "OMPI_COMM_WORLD_SIZE": "4", "X": "kept"}, planned)
    assert rank == 3 and env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["X"] == "kept"
    rank, env = rank_environment("slurm", {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"}, planned)
    assert rank == 2 and env["MASTER_PORT"] == "29500"
    with pytest.raises(ValueError, match="SLURM_NTASKS=3 but the plan has 4 ranks"):
        rank_environment("slurm", {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "3"}, planned)
    with pytest.raises(ValueError, match="made rank 1 local rank 0 of its host; the plan has local rank 1"):
        rank_environment("mpi", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                                 "OMPI_COMM_WORLD_SIZE": "4"}, planned)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK not set: this process was not started by mpirun"):
        rank_environment("mpi", {"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, planned)


def test_a_rank_started_outside_its_scheduler_says_so(tmp_path):
    run_dir = RunDir(tmp_path)
    run_dir.write_json(run_dir.rank_env, _planned(2, 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    res = subprocess.run([sys.executable, "-m", "launcher.backends.rank_start", str(tmp_path), "slurm", "--", "-c",
                          "pass"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS not set" in res.stderr


def test_a_rank_ends_as_its_process_did_and_leaves_the_record(tmp_path):
    run_dir = RunDir(tmp_path)
    run_dir.write_json(run_dir.rank_env, _planned(2, 2))
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    res = subprocess.run([sys.executable, "-m", "launcher.backends.rank_start", str(tmp_path), "mpi", "--", "-c",
                          "import os, sys; print(os.environ['RANK']); sys.exit(3)"], env=env, timeout=60)
    assert res.returncode == 3 and run_dir.rank(1).read_exit()["exit_code"] == 3
    assert run_dir.rank(1).stdout.read_text() == "1\n" and run_dir.rank(1).read_pid()[1] > 0
    res = subprocess.run([sys.executable, "-m", "launcher.backends.rank_start", str(tmp_path), "mpi", "--", "-c",
                          "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], env=env, timeout=60)
    assert res.returncode == -9 and run_dir.rank(1).read_exit()["exit_code"] == -9


def test_the_batch_script_quotes_every_value_and_runs_the_same_command(cpu_host, tmp_path):
    plan = plan_of(["recipe=quickstart", "cluster.launch=slurm", "cluster.nnodes=2"], cpu_host)
    argv = ["recipe=quickstart", "output.run_name='a b$(touch pwned)'", "dry_run=true", "cluster.nnodes=2"]
    text = sbatch_script(plan, argv, tmp_path / "my dir", tmp_path / "logs")
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=2" in text
    # whole nodes: the CPUs per rank are the target node's, planned there (srun --cpus-per-task), not this host's
    assert "#SBATCH --exclusive" in text and "cpus-per-task" not in text
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    assert shlex.split(exec_line)[1:] == [sys.executable, "-m", "launcher.cli", "recipe=quickstart",
                                          "output.run_name='a b$(touch pwned)'", "cluster.nnodes=2",
                                          "cluster.launch=slurm"]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_a_slurm_dry_run_writes_job_sbatch(tmp_path):
    assert main(["recipe=quickstart", "cluster.launch=slurm", "dry_run=true", "cluster.nnodes=2",
                 f"output.log_dir={tmp_path / 'logs'}"]) == 0
    job = (tmp_path / "logs" / "latest" / "job.sbatch").read_text()
    exec_line = next(line for line in job.splitlines() if line.startswith("exec "))
    assert "#SBATCH --nodes=2" in job and exec_line.endswith(" cluster.launch=slurm") and "dry_run=" not in exec_line


def test_slurm_outside_an_allocation_is_refused_before_a_run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 0\n")  # an srun on PATH: the refusal is about the allocation
    (tmp_path / "srun").chmod(0o755)
    logs = tmp_path / "logs"
    assert main(["recipe=quickstart", "cluster.launch=slurm", f"output.log_dir={logs}"]) == 2
    assert not logs.exists()


def test_mpi_without_mpirun_is_refused_before_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    logs = tmp_path / "logs"
    assert main(["recipe=quickstart", "cluster.launch=mpi", f"output.log_dir={logs}"]) == 2
    assert "`mpirun` is not on PATH. Install it (Debian: apt-get install openmpi-bin)" in capsys.readouterr().err
    assert not logs.exists()


def test_a_script_runs_on_one_host_under_any_backend_but_elastic(tmp_path, capsys):
    script = Path(__file__).resolve().parents[1] / "data" / "allreduce_script.py"
    logs = f"output.log_dir={tmp_path / 'logs'}"
    assert main([f"script={script}", "cluster.launch=mpi", "dry_run=true", logs]) == 0
    assert main([f"script={script}", "cluster.launch=elastic", "cluster.nnodes=2",
                 "cluster.rdzv_endpoint=h:29400", logs]) == 2
    assert "cluster.launch=elastic cluster.nnodes=2 with script=: scripts run on one host" in capsys.readouterr().err


def test_mpi_ranks_on_other_hosts_are_not_told_a_loopback_store_address(tmp_path, monkeypatch, capsys):
    """With cluster.master_addr left at loopback and a hostfile naming other hosts, the launcher gives the ranks this
    host's name: one that resolves to a loopback address (Debian's 127.0.1.1) they could not reach was given
    silently (elastic's launchers refuse it)."""
    import socket

    (tmp_path / "hosts").write_text("localhost slots=1\nother.invalid slots=1\n")
    monkeypatch.setattr(socket, "getfqdn", lambda *a: "this-host")
    real = socket.gethostbyname
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1" if name == "this-host" else real(name))
    assert main(["recipe=quickstart", "cluster.launch=mpi", f"cluster.hostfile={tmp_path / 'hosts'}", "dry_run=true",
                 f"output.log_dir={tmp_path / 'logs'}"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert ("cluster.master_addr=127.0.0.1 with ranks on other hosts (localhost, other.invalid): this host's name "
            "this-host resolves to 127.0.1.1, a loopback address, which they cannot reach") in said, said
