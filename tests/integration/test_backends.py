"""The same run under mpirun (cluster.launch=mpi) and under Slurm (sbatch of the dry run's job.sbatch, srun inside)
trains to the local backend's losses. Skipped, saying why, where mpirun or Slurm is missing (.ci/run installs
Debian's openmpi-bin, slurmctld, slurmd, slurm-client and munge when it can)."""

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.conftest import pid_alive, run_cli, start_training
from tests.slurm_cluster import slurm_cluster  # noqa: F401

pytestmark = pytest.mark.integration

WIDE_DEEP = ["recipe=wide_deep", "smoke=true", "trainer.steps=6", "trainer.log_every=1", "eval.batches=0",
             "trainer.checkpoint_every=-1", "cluster.nproc_per_node=2"]


def _losses(run_dir: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> the loss each rank logged."""
    out = {}
    for rank in (0, 1):
        for line in (run_dir / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            if "event" not in m:
                out[(rank, m["step"])] = m["loss"]
    return out


@pytest.fixture(scope="module")
def local_losses(tmp_path_factory) -> dict[tuple[int, int], float]:
    cwd = tmp_path_factory.mktemp("local")
    res = run_cli(WIDE_DEEP, cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _losses((cwd / "log_output" / "latest").resolve())


def _same(got: dict, want: dict, what: str) -> None:
    worst = max(abs(got[k] - want[k]) / abs(want[k]) for k in want)
    print(f"{what} vs local, wide_deep, 2 ranks x {len(want) // 2} steps: worst relative difference {worst:.2e}")
    assert sorted(got) == sorted(want) and worst <= 1e-5


NO_MPIRUN = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not installed (Debian: apt-get "
                                                                        "install openmpi-bin; .ci/run installs it)")


@NO_MPIRUN
def test_mpirun_trains_as_the_local_backend(tmp_path, local_losses):
    res = run_cli([*WIDE_DEEP, "cluster.launch=mpi"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = (tmp_path / "log_output" / "latest").resolve()
    assert (run_dir / "backend.log").read_text().startswith("$ mpirun -n 2 ")
    assert all(json.loads((run_dir / f"rank.{r}" / "exit.json").read_text())["exit_code"] == 0 for r in (0, 1))
    _same(_losses(run_dir), local_losses, "mpirun")


@NO_MPIRUN
def test_a_rank_killed_under_mpirun_is_blamed_and_nothing_of_the_job_is_left(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path, "cluster.launch=mpi")
    os.kill(pids[1], signal.SIGKILL)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1 and "rank 1 failed with signal SIGKILL" in out, out[-3000:] + err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["first_failed_rank"] == 1
    assert not any(pid_alive(p) for p in pids)
    assert _processes_naming(str(run_dir)) == []  # no mpirun, rank_start or rank of this run


@NO_MPIRUN
def test_a_torchrun_script_runs_under_mpirun_with_its_arguments(tmp_path):
    script = Path(__file__).resolve().parents[1] / "data" / "allreduce_script.py"
    res = run_cli([f"script={script}", "cluster.launch=mpi", "--", "--flag", "a b"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = (tmp_path / "log_output" / "latest").resolve()
    for rank in (0, 1):
        assert (run_dir / f"rank.{rank}" / "stdout").read_text() == (
            f"rank {rank}/2 sum=3.0 expected=3.0 args=['--flag', 'a b']\n")


def _processes_naming(text: str) -> list[str]:
    """The command lines in /proc that contain text (pgrep -f, without needing procps)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line:
            found.append(line)
    return found


@NO_MPIRUN
def test_mpiruns_own_failure_is_shown_from_its_output(tmp_path):
    res = run_cli(["recipe=quickstart", "cluster.launch=mpi", "cluster.launcher_args=[--no-such-option]"], tmp_path)
    assert res.returncode == 1 and "mpirun failed" in res.stdout and "--no-such-option" in res.stdout, res.stdout
    assert "Traceback" not in res.stdout + res.stderr


def test_sbatch_of_the_dry_runs_job_trains_as_the_local_backend(slurm_cluster, tmp_path, local_losses):  # noqa: F811
    res = run_cli([*WIDE_DEEP, "cluster.launch=slurm", "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    job = (tmp_path / "log_output" / "latest" / "job.sbatch").resolve()
    rc, job_id = slurm_cluster.sbatch_wait(job, cwd=tmp_path, timeout=300)
    out = tmp_path / "log_output" / f"slurm-{job_id}.out"
    assert rc == 0, (out.read_text() if out.exists() else "") + slurm_cluster.tail_logs()
    run_dir = (tmp_path / "log_output" / "latest").resolve()
    assert run_dir != job.parent and json.loads((run_dir / "summary.json").read_text())["status"] == "ok"
    assert (run_dir / "backend.log").read_text().startswith("$ srun --nodes=1 --ntasks=2 ")
    table = json.loads((run_dir / "rank_table.json").read_text())  # the allocation's host, from Slurm
    assert [s["server_id"] for s in table["server_list"]] == [slurm_cluster.node]
    _same(_losses(run_dir), local_losses, "sbatch + srun")
