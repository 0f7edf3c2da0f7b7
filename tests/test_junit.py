"""junit.xml stays well-formed XML whatever a rank printed, and says which ranks never started."""

import io
import time
import xml.etree.ElementTree as ET

from rich.console import Console

from launcher.report.junit import write_junit
from launcher.report.log_tail import TAIL_CHARS, log_tail
from launcher.report.summary import failure_report
from launcher.rundir import RunDir


def _summary(exit_codes, status):
    ranks = [{"rank": r, "exit_code": c, "signal": None, "stopped_by_launcher": False, "last_step": 1}
             for r, c in enumerate(exit_codes)]
    return {"status": status, "run_id": "r", "recipe": "quickstart", "engine": "ddp", "world_size": len(ranks),
            "steps": 2, "completed_steps": 1, "final_loss": None, "wall_s": 1.5, "ranks": ranks, "eval": {}}


def test_control_characters_in_stderr_do_not_break_the_xml(tmp_path):
    run = RunDir(tmp_path / "run")
    run.rank(1).path.mkdir(parents=True)
    run.rank(1).stderr.write_text("\x1b[31mTraceback\x1b[0m (most recent call last):\n\x00bad\x07byte\nValueError: boom\n")
    write_junit(run, _summary([0, 1], "failed"))
    suite = ET.parse(run.junit).getroot()  # raises on XML 1.0's forbidden characters
    failure = suite.find("testcase[@name='rank 1']/failure")
    assert "Traceback (most recent call last)" in failure.text and "ValueError: boom" in failure.text
    assert "\x1b" not in failure.text and "[31m" not in failure.text
    assert suite.get("hostname") and suite.get("timestamp")[:4].isdigit()


def test_ranks_that_never_started_say_so(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    write_junit(run, _summary([None, None], "failed"))
    suite = ET.parse(run.junit).getroot()
    assert suite.get("failures") == "3"  # the run and both ranks
    assert "did not start" in suite.find("testcase[@name='rank 0']/failure").get("message")


def _failed_rank_1(tmp_path, stderr: bytes) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.rank(1).path.mkdir(parents=True)
    run.rank(1).stderr.write_bytes(stderr)
    return run


def test_a_10_mb_line_gives_a_report_and_a_junit_of_a_few_kb_fast(tmp_path):
    """A tensor printed whole, or a bar that never wrote a newline: the report reads the file's end only, and cuts
    each line and the whole tail (it printed 11 MB in 43 s, and junit.xml had 20 MB)."""
    line = ", ".join(f"{i * 0.5:.4f}" for i in range(1_000_000))  # ~10 MB, no newline
    run = _failed_rank_1(tmp_path, f"Traceback (most recent call last):\nValueError: boom\n[{line}]".encode())
    summary = _summary([0, 1], "failed")
    start = time.perf_counter()
    out = io.StringIO()
    Console(file=out, width=120).print(failure_report(run, summary, 1, 20))
    write_junit(run, summary)
    assert time.perf_counter() - start < 2.0
    assert len(out.getvalue().encode()) < 12_000 and run.junit.stat().st_size < 24_000
    failure = ET.parse(run.junit).getroot().find("testcase[@name='rank 1']/failure").text
    assert "499999.5000]" in failure and "characters left out" in failure  # its end, and its middle said cut


def test_a_progress_bar_shows_its_last_state_and_control_characters_show_escaped(tmp_path):
    bar = "".join(f"\r{i:3d}%|{'#' * (i // 10):10s}|" for i in range(101))
    run = _failed_rank_1(tmp_path, f"{bar}\nbell\x07 and nul\x00 \x1b[2Jcleared\nlast\n".encode())
    lines = log_tail(run.rank(1).stderr, 20)
    assert lines == ["100%|##########|", "bell\\x07 and nul\\x00 cleared", "last"]


def test_many_long_lines_keep_the_newest_within_the_limit(tmp_path):
    run = _failed_rank_1(tmp_path, "".join(f"line {i} " + "x" * 3000 + "\n" for i in range(100)).encode())
    lines = log_tail(run.rank(1).stderr, 20)
    assert sum(len(x) + 1 for x in lines) < TAIL_CHARS + 200
    assert lines[-1].startswith("line 99 ") and lines[0].startswith("…[") and "earlier line(s) left out" in lines[0]


def test_a_rank_named_for_leaving_first_with_exit_code_0_is_a_failure_in_junit(tmp_path):
    run = _failed_rank_1(tmp_path, b"")
    summary = _summary([1, 0], "failed")
    summary["ranks"][1].update(first_failure=True, blame="it exited 0 while other ranks still ran")
    write_junit(run, summary)
    suite = ET.parse(run.junit).getroot()
    failure = suite.find("testcase[@name='rank 1']/failure")
    assert failure.get("message").startswith("rank 1 left first: it exited 0") and failure.get("type") == "exit 0"
    assert suite.find("testcase[@name='run run']/failure").text.startswith("rank 1 left first")  # the first, in full


def test_ranks_that_failed_of_their_own_are_not_said_to_have_lost_a_peer(tmp_path):
    """A script whose every rank exits 3 by itself (it never made a process group): no rank lost a peer."""
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    summary = _summary([3, 3, 1], "failed")
    for r, lost in zip(summary["ranks"], (False, False, True)):
        r["lost_peer"] = lost
    out = io.StringIO()
    Console(file=out, width=200).print(failure_report(run, summary, 0, 5))
    said = out.getvalue()
    assert "failed of its own too (its error is not the loss of a peer): rank 1 (exit code 3)" in said
    assert "failed after rank 0, having lost it as a peer: rank 2 (exit code 1)" in said
