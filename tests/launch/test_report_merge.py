"""`hetero-launch report DIR DIR ... [--into OUT]`: the run dirs two nodes of one cluster.launch=elastic run wrote
(each only its own ranks) merged into one, and every reason to refuse a merge named with its dir, nothing written.

The plan is a real one (a dry run of 2 nodes x 2 ranks); the ranks' records and each node's summary are written
through the run dir's own writers, with the node fields launch._report adds."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from launcher.cli import main
from launcher.report.junit import write_junit
from launcher.report.merge import merged_summary, plan_digest, read_node_dirs, write_merged_run
from launcher.report.summary import build_summary
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import RunDir
from tests.conftest import plan_of, run_cli

HOSTS = [{"node": 0, "addr": "10.0.0.1", "hostname": "alpha", "accelerators": 0},
         {"node": 1, "addr": "10.0.0.2", "hostname": "beta", "accelerators": 0}]


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    """plan.json of a real dry run: 2 nodes x 2 ranks (ranks 2 and 3 on node 1)."""
    cwd = tmp_path_factory.mktemp("dry")
    res = run_cli(["recipe=quickstart", "dry_run=true", "cluster.launch=elastic", "cluster.nnodes=2",
                   "cluster.nproc_per_node=2", "cluster.rdzv_endpoint=127.0.0.1:29400", "cluster.local_addr=127.0.0.1"],
                  cwd)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    plan = RunDir((cwd / "log_output" / "latest").resolve()).read_plan()
    assert [(r["rank"], r["node_rank"]) for r in plan["ranks"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    return plan


def write_node(path: Path, plan: dict, node: int, ranks: list[int], status: str = "ok", wall_s: float = 3.0,
               exit_codes: dict[int, int] | None = None, first_failed_rank: int | None = None,
               first_failure: dict | None = None) -> RunDir:
    """One node's run dir as cluster.launch=elastic leaves it: its ranks' records, plan.json, summary.json with
    node_rank and nodes, junit.xml."""
    run = RunDir(path)
    run.path.mkdir()
    run.write_json(run.plan, plan)
    run.config.write_text(f"# node {node}\n")
    run.write_json(run.rank_env, {str(r): {"RANK": str(r), "GROUP_RANK": str(node)} for r in ranks})
    exit_codes = exit_codes or {}
    for r in ranks:
        w = MetricsWriter(run.rank(r))
        last = 3 if exit_codes.get(r, 0) == 0 else 2
        for step in range(1, last + 1):
            w.step_done(step)
            w.write(step=step, loss=1.0 / step, local_loss=1.0 / step + 0.01 * r, samples_per_s=100.0 * step)
        w.close()
        run.rank(r).stderr.write_text(f"rank {r} says hello\n")
    exits = [{"rank": r, "exit_code": exit_codes.get(r, 0), "first_failure": r == first_failed_rank} for r in ranks]
    summary = build_summary(run, plan, exits, status, wall_s)
    summary["first_failed_rank"] = first_failed_rank
    summary["node_rank"] = node
    summary["nodes"] = [{**h, "ranks": [r["rank"] for r in plan["ranks"] if r["node_rank"] == h["node"]]}
                        for h in HOSTS]
    if first_failure is not None:
        summary["first_failure"] = first_failure
    run.write_summary(summary)
    write_junit(run, summary)
    return run


def two_nodes(tmp_path: Path, plan: dict) -> tuple[RunDir, RunDir]:
    """Rank 3 (node 1) killed by SIGKILL after step 2; both nodes name it."""
    failure = {"rank": 3, "node": 1, "exit_code": -9, "signal": "SIGKILL", "last_step": 2, "error": ""}
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1], "failed", 3.0, {0: -15, 1: -15}, 3, failure)
    node1 = write_node(tmp_path / "node1-run", plan, 1, [2, 3], "failed", 3.5, {2: -15, 3: -9}, 3)
    return node0, node1


def test_two_complete_nodes_merge_into_one_run_of_four_ranks(tmp_path, plan):
    node0, node1 = two_nodes(tmp_path, plan)
    merged, summary = write_merged_run([node1.path, node0.path], tmp_path / "merged")
    assert merged.read_summary() == summary
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert summary["status"] == "failed" and summary["wall_s"] == 3.5 and summary["completed_steps"] == 2
    assert summary["first_failed_rank"] == 3 and summary["first_failure"]["node"] == 1
    assert "disagreements" not in summary and "node_rank" not in summary
    assert summary["run_id"] == "merged" and summary["nodes"][1]["ranks"] == [2, 3]
    assert summary["merged_from"] == [
        {"dir": str(node0.path), "node_rank": 0, "status": "failed", "ranks": [0, 1]},
        {"dir": str(node1.path), "node_rank": 1, "status": "failed", "ranks": [2, 3]},
    ]
    for r in range(4):  # copied, not moved
        src = (node0 if r < 2 else node1).rank(r)
        assert merged.rank(r).read_metrics() == src.read_metrics() and src.metrics.exists()
    assert merged.config.read_text() == "# node 0\n"  # the run files of node 0, whichever dir came first
    assert merged.read_plan() == plan
    assert sorted(merged.read_json(merged.rank_env)) == ["0", "1", "2", "3"]
    suite = ET.parse(merged.junit).getroot()
    assert suite.get("tests") == "5"
    rank3 = next(c for c in suite.iter("testcase") if c.get("name") == "rank 3")
    assert "SIGKILL" in rank3.find("failure").get("message")


def test_the_worst_status_wins_and_disagreements_are_named(tmp_path, plan):
    node0 = write_node(tmp_path / "a", plan, 0, [0, 1], "failed", first_failed_rank=2)
    node1 = write_node(tmp_path / "b", plan, 1, [2, 3], "hung", first_failed_rank=3)
    summary = merged_summary(read_node_dirs([node0.path, node1.path]), "m")
    assert summary["status"] == "hung"
    assert summary["first_failed_rank"] == 2
    assert summary["disagreements"] == {"first_failed_rank": {str(node0.path): 2, str(node1.path): 3}}
    ok = write_node(tmp_path / "c", plan, 0, [0, 1], "ok")
    interrupted = write_node(tmp_path / "d", plan, 1, [2, 3], "interrupted")
    assert merged_summary(read_node_dirs([ok.path, interrupted.path]), "m")["status"] == "interrupted"


def test_the_cli_merges_beside_the_first_dir_and_reports_the_merged_run(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    node1 = write_node(tmp_path / "node1-run", plan, 1, [2, 3], wall_s=4.0)
    assert main(["report", str(node0.path), str(node1.path)]) == 0
    out = capsys.readouterr().out
    merged = RunDir(tmp_path / "node0-run-merged")
    summary = merged.read_summary()
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3] and summary["status"] == "ok"
    assert merged.plot("loss").exists() and merged.plot("throughput").exists()
    assert f"into {merged.path}" in out and "node0-run-merged: ok in 4.0 s" in out
    assert main(["report", str(node0.path), str(node1.path), f"--into={tmp_path / 'again'}"]) == 0
    assert RunDir(tmp_path / "again").read_summary()["status"] == "ok"


def test_one_dir_is_reported_as_before_and_into_needs_several(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    assert main(["report", str(node0.path)]) == 0
    assert node0.plot("loss").exists() and not (tmp_path / "node0-run-merged").exists()
    capsys.readouterr()
    for args, said in (([str(tmp_path / "out")], "--into merges several run dirs: give two or more"),
                       ([], "--into needs a folder"), (["--bogus"], None)):
        if said is None:
            assert main(["report", str(node0.path), "--bogus"]) == 2
            said = "--bogus: not an option of report (--into OUT is)"
        else:
            assert main(["report", str(node0.path), "--into", *args]) == 2
        err = capsys.readouterr().err  # which argument is wrong, then the usage
        assert f"hetero-launch report: {said}." in err and "usage: hetero-launch report RUN_DIR" in err, err
    assert not (tmp_path / "out").exists()


def test_a_run_whose_ranks_logged_nothing_gets_no_empty_plots(tmp_path, plan, capsys):
    """A run whose ranks never started (an elastic rendezvous that timed out) had two empty plots written: now none,
    and the report says why; the summary table is shown as before."""
    run = RunDir(tmp_path / "never")
    run.path.mkdir()
    run.write_json(run.plan, plan)
    for r in (0, 1):
        run.rank(r).path.mkdir(parents=True)
    run.write_json(run.summary, build_summary(run, plan, [{"rank": r, "exit_code": None} for r in (0, 1)], "failed",
                                              1.0))
    assert main(["report", str(run.path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing to plot (no loss.png, no throughput.png)" in out and "never: failed" in out, out
    assert not run.plot("loss").exists() and not run.plot("throughput").exists()


def _refused(tmp_path: Path, dirs: list[Path], capsys, *, into: Path | None = None) -> str:
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = ["report", *map(str, dirs)] + (["--into", str(into)] if into else [])
    assert main(argv) == 2
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    return capsys.readouterr().out


def test_a_rank_in_two_dirs_is_refused(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    node1 = write_node(tmp_path / "node1-run", plan, 1, [1, 2, 3])
    out = _refused(tmp_path, [node0.path, node1.path], capsys)
    assert f"rank 1 is in both {node0.path} and {node1.path}" in out and "Give each node's run dir once" in out


def test_the_same_dir_twice_names_its_ranks_and_its_node_rank(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    shutil.copytree(node0.path, tmp_path / "copy")
    out = _refused(tmp_path, [node0.path, tmp_path / "copy"], capsys)
    assert "rank 0, 1 is in both" in out and "both say node_rank 0" in out
    assert "rank 2, 3 of the plan (world_size 4) is in none of the given dirs" in out  # every problem at once
    assert "3 problems with the run dirs to merge; nothing was written" in out


def test_missing_ranks_name_the_node_that_holds_them(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    node1 = write_node(tmp_path / "node1-run", plan, 1, [2])
    out = _refused(tmp_path, [node0.path, node1.path], capsys)
    assert "rank 3 of the plan (world_size 4) is in none of the given dirs: node 1 (beta, 10.0.0.2) holds rank 3" in out
    assert "scp -r 10.0.0.2:log_output/latest node1-run" in out


def test_a_different_plan_is_refused(tmp_path, plan, capsys):
    node0 = write_node(tmp_path / "node0-run", plan, 0, [0, 1])
    node1 = write_node(tmp_path / "node1-run", {**plan, "steps": plan["steps"] + 1, "notes": ["other host"]}, 1,
                       [2, 3])
    out = _refused(tmp_path, [node0.path, node1.path], capsys)
    assert f"{node1.path}: its plan differs from {node0.path}'s (in steps): not the same run" in out


def test_an_existing_out_and_a_dir_that_is_no_run_dir_are_refused(tmp_path, plan, capsys):
    node0, node1 = two_nodes(tmp_path, plan)
    (tmp_path / "out").mkdir()
    out = _refused(tmp_path, [node0.path, node1.path], capsys, into=tmp_path / "out")
    assert f"--into {tmp_path / 'out'}: exists, and run dirs are never overwritten" in out
    (tmp_path / "empty").mkdir()
    out = _refused(tmp_path, [node0.path, tmp_path / "empty", tmp_path / "nowhere"], capsys)
    assert f"{tmp_path / 'empty'} is not a run dir (no plan.json)" in out
    assert f"{tmp_path / 'nowhere'}: no such dir" in out


def test_a_plan_json_read_back_digests_as_the_launchers_plan(cpu_host):
    from launcher.launch.nodes import plan_hash

    run_plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=2"], cpu_host)
    as_written = json.loads(json.dumps(run_plan.to_dict()))
    assert plan_digest(as_written) == plan_hash(run_plan)
    assert plan_digest({**as_written, "notes": ["x"], "ranks": []}) == plan_hash(run_plan)
    assert plan_digest({**as_written, "steps": as_written["steps"] + 1}) != plan_hash(run_plan)
