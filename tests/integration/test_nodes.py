"""Two nodes as two launcher processes on loopback (cluster.launch=elastic, torch elastic's c10d rendezvous), 2 ranks
each: the same losses as one node with 4 ranks (the nodes with their tables' rows split over the 4 ranks of both
hosts, placement.ps=true; the one node with a copy per rank); a rank killed on node 1 stops both nodes, and both name it."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.rundir import RunDir
from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(tmp_path: Path, overrides: list[str]) -> list[subprocess.Popen]:
    """Two launchers, each in its own folder (no shared file system), meeting on one rendezvous endpoint."""
    port = _free_port()
    procs = []
    for n in (0, 1):
        cwd = tmp_path / f"node{n}"
        cwd.mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", *overrides, "cluster.launch=elastic", "cluster.nnodes=2",
             "cluster.nproc_per_node=2", f"cluster.rdzv_endpoint=127.0.0.1:{port}", f"cluster.rdzv_id=t{port}",
             "cluster.local_addr=127.0.0.1", "cluster.rdzv_timeout_s=120"],
            cwd=cwd, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _losses(run_dir: Path, rank: int) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in records if "event" not in m}


def _summary(tmp_path: Path, node: int) -> dict:
    return json.loads((tmp_path / f"node{node}" / "log_output" / "latest" / "summary.json").read_text())


WIDE_DEEP = ["recipe=wide_deep", "smoke=true", "trainer.steps=6", "trainer.log_every=1", "eval.batches=0",
             "trainer.checkpoint_every=-1"]


def test_two_nodes_train_as_one_node_of_four_ranks(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    res = run_cli([*WIDE_DEEP, "cluster.nproc_per_node=4"], one)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reference = _losses((one / "log_output" / "latest").resolve(), 0)
    procs = _nodes(tmp_path, [*WIDE_DEEP, "placement.ps=true"])  # and the tables' rows split over the 4 ranks
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
    summaries = [_summary(tmp_path, n) for n in (0, 1)]
    by_node = {s["node_rank"]: s for s in summaries}
    assert sorted(by_node) == [0, 1]
    assert [r["rank"] for r in by_node[0]["ranks"]] == [0, 1] and [r["rank"] for r in by_node[1]["ranks"]] == [2, 3]
    assert by_node[0]["nodes"][1]["ranks"] == [2, 3]
    node_dir = next((tmp_path / f"node{n}" / "log_output" / "latest").resolve() for n in (0, 1)
                    if _summary(tmp_path, n)["node_rank"] == 0)
    table = json.loads((node_dir / "rank_table.json").read_text())
    assert table["server_count"] == "2" and [d["rank_id"] for d in table["server_list"][1]["device"]] == ["2", "3"]
    plan = json.loads((node_dir / "plan.json").read_text())
    assert {t["shards"] for t in plan["placement"]["tables"]} == {4}
    two_nodes = _losses(node_dir, 0)
    worst = max(abs(two_nodes[s] - reference[s]) / abs(reference[s]) for s in reference)
    print(f"2 nodes x 2 ranks (ps) vs 1 node x 4 ranks, wide_deep, {len(reference)} steps: worst relative {worst:.2e}")
    assert sorted(two_nodes) == sorted(reference) and worst <= 1e-5
    from launcher.cli import main  # `hetero-launch report` merges the nodes' run dirs (gathered here) into one

    dirs = [str((tmp_path / f"node{n}" / "log_output" / "latest").resolve()) for n in (0, 1)]
    assert main(["report", *dirs, "--into", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert [r["rank"] for r in merged["ranks"]] == [0, 1, 2, 3] and all(r["exit_code"] == 0 for r in merged["ranks"])
    assert merged["status"] == "ok" and sorted(m["node_rank"] for m in merged["merged_from"]) == [0, 1]
    assert (tmp_path / "merged" / "loss.png").exists()


def test_a_rank_killed_on_one_node_stops_both_and_both_name_it(tmp_path):
    procs = _nodes(tmp_path, ["recipe=quickstart", "trainer.steps=1000000", "trainer.log_every=1",
                              "trainer.checkpoint_every=-1", "eval.batches=0"])
    deadline = time.monotonic() + 120
    pid_files = []
    while len(pid_files) < 4:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, [p.communicate() for p in procs]
        pid_files = list(tmp_path.glob("node*/log_output/latest/rank.*/pid"))
        time.sleep(0.2)
    time.sleep(2)  # training
    victim = next(f for f in pid_files if f.parent.name == "rank.3")
    os.kill(RunDir(victim.parent.parent).rank(3).read_pid()[1], signal.SIGKILL)
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 1, out[-3000:] + err[-3000:]
        assert "Traceback" not in out + err
        assert "rank 3 failed with signal SIGKILL" in out or "rank 3 on node 1" in out, out[-3000:]
    assert [_summary(tmp_path, n)["first_failed_rank"] for n in (0, 1)] == [3, 3]
    for f in pid_files:
        with pytest.raises(ProcessLookupError):
            os.kill(int(f.read_text().split()[1]), 0)


def test_a_node_that_never_joins_is_named_after_the_timeout(tmp_path):
    res = run_cli(["recipe=quickstart", "cluster.launch=elastic", "cluster.nnodes=2",
                   f"cluster.rdzv_endpoint=127.0.0.1:{_free_port()}", "cluster.local_addr=127.0.0.1",
                   "cluster.rdzv_timeout_s=2"], tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stdout + res.stderr
    assert "not every node joined the rendezvous" in res.stdout and "cluster.nnodes=2 were expected" in res.stdout
    run = (tmp_path / "log_output" / "latest").resolve()  # no rank was started; the run dir says why
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "not every node joined the rendezvous" in summary["error"]
    assert not list(run.glob("rank.*"))
