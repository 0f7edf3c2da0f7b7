"""Parameter-server mode (placement.ps=true) under faults: every step routes each rank's table lookups and row
gradients to their owners through all-to-alls, so a rank that dies or stops leaves its peers inside one. The launcher
names the rank by evidence (its signal, its process state), stops the others, and nothing waits past the watchdog."""

import json
import os
import signal
import time

import pytest

from tests.conftest import assert_nothing_survives, start_training

pytestmark = pytest.mark.integration

PS = ("smoke=true", "model.rows_per_table=1000", "placement.ps=true")


def test_a_ps_rank_killed_inside_the_row_exchange_is_named_and_its_peer_stopped(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path, *PS, recipe="wide_deep")
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    out, err = launcher.communicate(timeout=60)
    print(f"kill -9 of ps rank 1: launcher exited {launcher.returncode} after {time.monotonic() - t0:.2f} s\n{out}")
    assert launcher.returncode == 1 and "Traceback" not in out + err, out[-3000:] + err[-3000:]
    assert "rank 1 failed with signal SIGKILL from outside the launcher" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["first_failed_rank"] == 1
    assert not {r["rank"]: r for r in summary["ranks"]}[0]["first_failure"]  # rank 0 only lost its peer
    assert_nothing_survives(pids)


def test_a_stopped_ps_rank_is_named_as_hung_within_the_watchdog(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path, *PS, "launcher.watchdog_s=2", recipe="wide_deep")
    os.kill(pids[1], signal.SIGSTOP)  # rank 0 waits for it in the next lookup's all-to-all
    t0 = time.monotonic()
    out, err = launcher.communicate(timeout=90)
    took = time.monotonic() - t0
    print(f"SIGSTOP of ps rank 1: launcher exited {launcher.returncode} after {took:.1f} s\n{out}")
    assert launcher.returncode == 1 and "Traceback" not in out + err, out[-3000:] + err[-3000:]
    assert "rank 1 hung after step" in out and "stopped (SIGSTOP" in out
    assert "rank 0 Python stacks" in out  # where the waiting peer is: inside the exchange
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "hung" and summary["hang"]["ranks"] == [1]
    assert took < 60
    assert_nothing_survives(pids)
