"""A script written for torchrun runs unchanged under hetero-launch, with the same logs and failure handling."""

import json
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parents[1] / "data" / "allreduce_script.py"


def test_torchrun_script_runs_unchanged(tmp_path):
    res = run_cli([f"script={SCRIPT}", "cluster.nproc_per_node=2", "--", "--lr", "0.1", "it's"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run = (tmp_path / "log_output" / "latest").resolve()
    assert run.name.startswith("script-")
    for rank in (0, 1):
        out = (run / f"rank.{rank}" / "stdout").read_text()
        assert f"rank {rank}/2 sum=3.0 expected=3.0 args=['--lr', '0.1', \"it's\"]" in out
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and [r["exit_code"] for r in s["ranks"]] == [0, 0]
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
