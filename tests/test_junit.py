"""junit.xml stays well-formed XML whatever a rank printed, and says which ranks never started."""

import xml.etree.ElementTree as ET

from launcher.report.junit import write_junit
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
