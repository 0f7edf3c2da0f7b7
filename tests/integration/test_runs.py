"""Real runs: 2 ranks over gloo through the launcher, as a user starts them, checked from the run dir."""

import json
import os

import pytest

from launcher.rundir import RunDir
from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration


def _metrics(run, rank):
    return [json.loads(line) for line in (run / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines()]


def _check_ok_run(tmp_path, recipe):
    run = (tmp_path / "log_output" / "latest").resolve()
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["world_size"] == 2 and s["recipe"] == recipe
    assert s["final_loss"] < s["first_loss"]
    assert [r["exit_code"] for r in s["ranks"]] == [0, 0]
    assert [r["last_step"] for r in s["ranks"]] == [s["steps"], s["steps"]]
    assert s["eval"]["loss"] > 0 and s["eval"]["n"] > 0
    for rank in (0, 1):
        assert (run / f"rank.{rank}" / "stdout").is_file() and (run / f"rank.{rank}" / "stderr").is_file()
        steps = [m for m in _metrics(run, rank) if "event" not in m]
        assert {"step", "loss", "samples_per_s", "wall_s"} <= set(steps[0])
        assert steps[-1]["step"] == s["steps"]
    # The logged loss is the mean over ranks: both ranks write the same numbers.
    assert [m["loss"] for m in _metrics(run, 0)] == [m["loss"] for m in _metrics(run, 1)]
    assert (run / "checkpoints" / f"step{s['steps']}").is_dir()
    env = json.loads((run / "rank_env.json").read_text())
    ports = {e["MASTER_PORT"] for e in env.values()}
    assert len(env) == 2 and len(ports) == 1 and ports != {"0"}  # the real port the ranks met on
    return run, s


def test_quickstart_two_ranks(tmp_path, cli):
    res = run_cli(["recipe=quickstart"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run, _ = _check_ok_run(tmp_path, "quickstart")
    assert "step 50/50" in res.stdout  # plain progress lines when stdout is not a terminal
    rep = cli(["report", str(run)], tmp_path)
    assert rep.returncode == 0 and "wrote" in rep.stdout and (run / "loss.png").is_file()


def test_wide_deep_two_ranks_zero2_with_periodic_checkpoints(tmp_path):
    res = run_cli(["recipe=wide_deep", "trainer.steps=40", "zero.stage=2", "trainer.checkpoint_every=20",
                   "eval.every=20"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run, s = _check_ok_run(tmp_path, "wide_deep")
    assert 0.5 < s["eval"]["auc"] <= 1 and 0.5 < s["eval"]["bayes_auc"] <= 1 and s["eval"]["n"] == 16 * 1024 * 2
    assert {"logloss", "accuracy"} <= set(s["eval"])
    evals = [m for m in _metrics(run, 0) if m.get("event") == "eval"]
    assert [m["step"] for m in evals] == [20, 40]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.is_dir()) == ["step20", "step40"]


def test_failing_rank_stops_the_others_and_is_named(tmp_path, cli):
    res = run_cli(["recipe=quickstart", "debug.fail_rank=1", "debug.fail_step=3"], tmp_path)
    assert res.returncode == 1
    out = res.stdout + res.stderr
    assert "rank 1 failed with exit code 1 after step 3 of 50" in out
    assert "injected failure" in out and "Begin global rank 1 STDERR" in out
    s = read_summary(tmp_path)
    assert s["status"] == "failed"
    by_rank = {r["rank"]: r for r in s["ranks"]}
    assert by_rank[1]["exit_code"] == 1 and not by_rank[1]["stopped_by_launcher"]
    assert by_rank[1]["first_failure"] and not by_rank[0]["first_failure"]
    # Rank 0 stops either way: the launcher stops it, or its collective fails first ("Connection closed by peer") and
    # it ends at once with its own error's code (a rank that raised skips the interpreter's teardown).
    assert (by_rank[0]["stopped_by_launcher"] and by_rank[0]["signal"] in ("SIGTERM", "SIGKILL")) or \
        (by_rank[0]["exit_code"] == 1 and by_rank[0]["signal"] is None), by_rank[0]
    assert by_rank[1]["last_step"] == 3
    run = (tmp_path / "log_output" / "latest").resolve()
    assert json.loads((run / "rank.1" / "error.json").read_text())["message"]
    # Nothing is lost (metrics, logs) and no rank survives the launcher.
    assert _metrics(run, 0) and _metrics(run, 1)
    # The report works on what a failed run left.
    rep = cli(["report", "log_output/latest"], tmp_path)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    for png in ("loss.png", "throughput.png"):
        assert (run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for rank in (0, 1):
        pid = RunDir(run).rank(rank).read_pid()[1]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_tabular_file_trains_and_reports_auc(tmp_path):
    from tests.data.make_ctr_csv import write_ctr_csv

    write_ctr_csv(str(tmp_path / "ctr.csv.gz"), 6000, gz=True)
    res = run_cli(["recipe=wide_deep", "data=tabular", "data.path=ctr.csv.gz", "data.label=clicked",
                   "data.positive=yes", "data.drop=[user_id]", "trainer.epochs=3"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "4,800 train + 1,200 test rows" in res.stdout
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["final_loss"] < s["first_loss"]
    assert s["steps"] == 3 * (4800 // 512)
    assert s["eval"]["n"] == 1200 and s["eval"]["auc"] > 0.65 and "bayes_auc" not in s["eval"]
