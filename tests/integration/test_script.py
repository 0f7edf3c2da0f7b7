"""A script written for torchrun runs unchanged under hetero-launch, with the same logs and failure handling."""

import json
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parents[1] / "data" / "allreduce_script.py"
LOG_SCRIPT = Path(__file__).resolve().parents[1] / "data" / "log_script.py"


def test_torchrun_script_runs_unchanged(tmp_path):
    res = run_cli([f"script={SCRIPT}", "cluster.nproc_per_node=2", "output.console=all", "--", "--lr", "0.1", "it's"],
                  tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run = (tmp_path / "log_output" / "latest").resolve()
    assert run.name.startswith("script-")
    for rank in (0, 1):
        line = f"rank {rank}/2 sum=3.0 expected=3.0 args=['--lr', '0.1', \"it's\"]"
        assert line in (run / f"rank.{rank}" / "stdout").read_text()
        assert res.stdout.count(f"[rank {rank}] {line}") == 1, res.stdout  # output.console=all: each rank, prefixed
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and [r["exit_code"] for r in s["ranks"]] == [0, 0]
    assert s["note"] == "the script did not call runtime.log: no step or loss was recorded" and s["engine"] is None
    assert s["final_loss"] is None and "note: the script did not call runtime.log" in res.stdout
    assert "0/0" not in res.stdout
    env = json.loads((run / "rank_env.json").read_text())["1"]
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
                "ROLE_RANK", "ROLE_WORLD_SIZE"):
        assert key in env


def test_failing_script_rank_is_named(tmp_path):
    res = run_cli([f"script={SCRIPT}", "--", "--fail-on-rank", "1"], tmp_path)
    assert res.returncode == 1
    assert "rank 1 failed with exit code 3" in res.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "failed" and {r["rank"]: r["exit_code"] for r in s["ranks"]}[1] == 3


def test_missing_script_is_refused_before_anything_starts(tmp_path):
    res = run_cli(["script=nope/train.py"], tmp_path)
    assert res.returncode == 2 and "script=nope/train.py: no such file" in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_script_output_streams_and_runtime_log_feeds_the_summary(tmp_path):
    res = run_cli([f"script={LOG_SCRIPT}", "cluster.nproc_per_node=2"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "if the script calls runtime.prepare(), it builds: ddp" in " ".join(res.stdout.split())
    # output.console=rank0 (the default): rank 0's stdout and stderr lines once, unprefixed; rank 1's in its files only
    assert res.stdout.count("hello from rank 0") == 1 and res.stdout.count("warning on rank 0") == 1, res.stdout
    assert "hello from rank 1" not in res.stdout and "warning on rank 1" not in res.stdout
    run = (tmp_path / "log_output" / "latest").resolve()
    assert (run / "rank.1" / "stdout").read_text() == "hello from rank 1\n"
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and "note" not in s
    assert s["completed_steps"] == 2 and [r["last_step"] for r in s["ranks"]] == [2, 2]
    assert s["final_loss"] == 1.0 and s["first_loss"] == 1.5 and s["final_metrics"] == {"acc": 0.5}
    assert "metrics: acc=0.5" in res.stdout and "1.00000" in res.stdout and "2/0" not in res.stdout


def test_unknown_output_console_is_refused(tmp_path):
    res = run_cli([f"script={LOG_SCRIPT}", "output.console=rank1"], tmp_path)
    assert res.returncode == 2 and "output.console=rank1 is not one of rank0, all, none. Did you mean " \
        "output.console=rank0?" in res.stderr, res.stderr
    assert not (tmp_path / "log_output").exists()
