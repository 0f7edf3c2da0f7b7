"""Nothing is lost: two ranks each print 1,000,000 lines to stdout and to stderr at the same time, then one is killed;
every line is in its rank's files, whole and in order."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

LINES = 1_000_000
SCRIPT = Path(__file__).parents[1] / "data" / "print_lines.py"


def _check(path: Path, rank: int, name: str) -> None:
    lines = path.read_text().split("\n")
    assert lines.pop() == ""  # the file ends with a whole line
    assert len(lines) == LINES, (path, len(lines))
    expected = [f"rank {rank} {name} line {i:07d} " + "x" * (i % 50) for i in range(LINES)]
    if lines != expected:
        first = next(i for i, (a, b) in enumerate(zip(lines, expected)) if a != b)
        pytest.fail(f"{path}: line {first} is {lines[first][:200]!r}, expected {expected[first]!r}")


def test_a_million_lines_per_stream_and_rank_survive_a_killed_rank(tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", f"script={SCRIPT}", "cluster.nproc_per_node=2", "--", str(LINES),
         str(done)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while len(list(done.iterdir())) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.2)
    run = (tmp_path / "log_output" / "latest").resolve()
    os.kill(int((done / "rank1.done").read_text()), signal.SIGKILL)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 1, out[-2000:] + err[-2000:]
    assert json.loads((run / "summary.json").read_text())["first_failed_rank"] == 1
    for rank in (0, 1):
        _check(run / f"rank.{rank}" / "stdout", rank, "out")
        _check(run / f"rank.{rank}" / "stderr", rank, "err")
