"""A rank killed from outside, a rank that hangs: the launcher names the right rank by evidence, stops every other
rank (no process of the job survives), and says so in its report, summary.json and junit.xml."""

import json
import os
import signal
import time
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import assert_nothing_survives, start_training

pytestmark = pytest.mark.integration


def test_a_rank_killed_from_outside_is_blamed_with_an_oom_hint(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path)
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)  # what the kernel's OOM killer does
    out, err = launcher.communicate(timeout=60)
    exit_s = time.monotonic() - t0
    print(f"kill -9 of rank 1: launcher exited {launcher.returncode} after {exit_s:.2f} s\n{out}")
    assert launcher.returncode == 1, out[-3000:] + err[-3000:]
    assert exit_s < 5
    assert "Traceback" not in out + err
    assert "rank 1 failed with signal SIGKILL from outside the launcher: likely the out-of-memory killer" in out
    assert "its last RSS" in out and "last step of each rank: rank 0" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["first_failed_rank"] == 1
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    assert by_rank[1]["signal"] == "SIGKILL" and by_rank[1]["first_failure"] and not by_rank[1]["stopped_by_launcher"]
    assert by_rank[1]["rss_bytes"] > 10 * 2**20 and by_rank[1]["host_available_bytes"] > 0
    assert not by_rank[0]["first_failure"]
    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
    assert "SIGKILL" in cases["rank 1"].find("failure").get("message")
    assert_nothing_survives(pids)


def test_a_stopped_rank_is_named_as_hung_with_every_ranks_stacks(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path, "launcher.watchdog_s=2")
    os.kill(pids[1], signal.SIGSTOP)  # a rank that stops making progress: its peer waits for it in all-reduce
    t0 = time.monotonic()
    out, err = launcher.communicate(timeout=90)
    print(f"SIGSTOP of rank 1: launcher exited {launcher.returncode} after {time.monotonic() - t0:.1f} s\n{out}")
    assert launcher.returncode == 1, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    assert "rank 1 hung after step" in out and "named by its process state" in out
    assert "stopped (SIGSTOP" in out
    assert "rank 0 Python stacks" in out and "most recent call first" in out  # the waiting rank's stacks, shown
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "hung" and summary["hang"]["ranks"] == [1]
    assert summary["hang"]["limit_s"] >= 2
    assert "most recent call first" in (run_dir / "rank.0" / "stderr").read_text()
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    assert by_rank[1]["stalled"] and not by_rank[0]["stalled"]
    assert_nothing_survives(pids)
