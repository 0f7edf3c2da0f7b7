"""The launcher's reader goes away or its disk fills up (issue 21): the run goes on or ends with a clear word, its
summary written whenever the disk allows, never a traceback.

- stdout into a pipe whose reader exits (`| head`, a CI log pipe that closes): the run trains to its last step and
  ends ok, with its summary (rich alone would have ended the launcher, and with it every rank, on the first write).
- the same pipe closed, then Ctrl-C (`| tee log` and Ctrl-C: tee dies too): 130, summary `interrupted`.
- the terminal hangs up (an ssh session that drops): SIGHUP, every rank stopped, 129, the summary written.
- a full disk (a 2 MiB tmpfs; needs root to mount, else skipped): exit 1, the summary written into the space kept for
  it from the start, saying the disk filled up; the launcher prints no traceback."""

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import pid_alive, start_training

pytestmark = pytest.mark.integration

QUICK = ["recipe=quickstart", "trainer.log_every=1", "eval.batches=0", "trainer.checkpoint_every=-1"]


def _launcher(tmp_path: Path, args: list[str], **streams) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", *QUICK, *args], cwd=tmp_path,
                            env={**os.environ, "COLUMNS": "200"}, **streams)


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "log_output" / "latest" / "summary.json").read_text())


def test_a_closed_output_pipe_does_not_stop_the_run(tmp_path):
    launcher = _launcher(tmp_path, ["trainer.steps=30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    launcher.stdout.readline()  # the reader takes one line, then goes away (`| head -1`)
    launcher.stdout.close()
    err = launcher.stderr.read().decode()
    assert launcher.wait(timeout=300) == 0, err[-3000:]
    summary = _summary(tmp_path)
    assert summary["status"] == "ok" and summary["ranks"][0]["last_step"] == 30, summary
    assert "Traceback" not in err


def test_a_closed_pipe_then_ctrl_c_ends_as_interrupted(tmp_path):
    launcher, run_dir, pids = start_training(tmp_path)
    launcher.stdout.close()  # `| tee log`: Ctrl-C ends tee as well
    launcher.send_signal(signal.SIGINT)
    err = launcher.stderr.read()
    assert launcher.wait(timeout=60) == 130, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert not any(pid_alive(p) for p in pids) and "Traceback" not in err


def test_a_terminal_that_hangs_up_ends_the_run_as_sighup_with_its_summary(tmp_path):
    master, slave = pty.openpty()
    err_path = tmp_path / "launcher.stderr"
    with open(err_path, "wb") as err:
        launcher = _launcher(tmp_path, ["trainer.steps=1000000"], stdin=slave, stdout=slave, stderr=err,
                             start_new_session=True, preexec_fn=lambda: _take_terminal(slave))
    os.close(slave)
    metrics, deadline = tmp_path / "log_output" / "latest" / "rank.0" / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert launcher.poll() is None and time.monotonic() < deadline
        try:
            os.read(master, 65536)  # the terminal shows what it is given
        except OSError:
            pass
        time.sleep(0.1)
    os.close(master)  # the hang-up: the kernel sends SIGHUP, and writes to the terminal fail (EIO)
    assert launcher.wait(timeout=60) == 129, err_path.read_text()[-3000:]
    assert _summary(tmp_path)["interrupted_by"] == "SIGHUP"
    assert "Traceback" not in err_path.read_text()


def _take_terminal(fd: int) -> None:
    import fcntl
    import termios

    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)  # the pty is the launcher's controlling terminal, as a login's is


def _tmpfs(disk: Path, size: str):
    """A tmpfs of ``size`` mounted at ``disk`` while the with-block runs (root only: skips otherwise)."""
    import contextlib

    @contextlib.contextmanager
    def mounted():
        disk.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs to fill ({res.stderr.strip() or 'mount failed'}): needs root")
        try:
            yield disk
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)

    return mounted()


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs at tmp_path/disk (root only)."""
    with _tmpfs(tmp_path / "disk", "2m") as disk:
        yield disk


def test_a_full_disk_ends_with_exit_1_and_no_traceback(tmp_path, small_disk):
    res = subprocess.run([sys.executable, "-m", "launcher.cli", *QUICK, "trainer.steps=1000000",
                          "trainer.checkpoint_every=1", f"output.log_dir={small_disk}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "Traceback" not in res.stderr and "launcher/launch" not in out, out[-3000:]
    # The 1 MiB kept from the start takes the summary although the ranks filled the disk (issue 35).
    summary = json.loads((small_disk / "latest" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["disk_full"]["free_bytes"] < 2**20, summary.get("disk_full")
    assert "filled up during the run" in " ".join(out.split()), out[-3000:]
    assert not (small_disk / "latest" / ".reserved").exists()


def test_a_disk_without_room_for_the_last_records_starts_nothing(tmp_path):
    """Under 1 MiB free where the run dir goes: exit 2 before any rank starts, saying what the space is for."""
    with _tmpfs(tmp_path / "tiny", "512k") as disk:
        res = subprocess.run([sys.executable, "-m", "launcher.cli", *QUICK, f"output.log_dir={disk}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        out = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and "keeps 1 MiB there for its last records" in out, out[-2000:]
        assert "Traceback" not in out and not any(disk.iterdir())  # no half-made run dir, no latest
