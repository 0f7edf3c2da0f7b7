"""A signal to the launcher (Ctrl-C = SIGINT, `kill` = SIGTERM) while ranks train: every rank is stopped, the summary
says `interrupted` and by what, the exit code is 128 + the signal, and no traceback is printed."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import pid_alive, start_training

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGUSR1, 138)],
                         ids=["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_signal_stops_every_rank_and_writes_the_summary(tmp_path, sig, code):
    launcher, run_dir, pids = start_training(tmp_path)
    t0 = time.monotonic()
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=60)
    stop_s = time.monotonic() - t0
    print(f"{sig.name}: launcher exited {launcher.returncode} after {stop_s:.1f} s")
    assert launcher.returncode == code, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err and f"interrupted by {sig.name}" in out, err[-3000:] + out[-1000:]
    assert not any(pid_alive(p) for p in pids)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == sig.name
    assert (run_dir / "junit.xml").exists()
    assert stop_s < 15


def test_a_second_ctrl_c_kills_ranks_that_ignore_sigterm_at_once(tmp_path):
    script = Path(__file__).parents[1] / "data" / "ignore_sigterm.py"
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", f"script={script}", "--", str(tmp_path)],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
    launcher.send_signal(signal.SIGINT)
    time.sleep(1.5)
    assert launcher.poll() is None and all(pid_alive(p) for p in pids)  # SIGTERM sent, ignored: the grace runs
    t0 = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    print(f"second SIGINT: launcher exited {launcher.returncode} after {time.monotonic() - t0:.1f} s")
    assert launcher.returncode == 130 and time.monotonic() - t0 < 5, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err and not any(pid_alive(p) for p in pids)
