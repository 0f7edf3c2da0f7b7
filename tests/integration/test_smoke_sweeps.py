"""Smoke runs of every shipped recipe on 2 real ranks, junit.xml as CI systems read it, and sweeps (-m) that run
every job, failed ones included (quickstart's smoke run is the sweep's first job: one launch for both)."""

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import ALL_RECIPES, run_cli

pytestmark = pytest.mark.integration


def parse_junit(path: Path) -> ET.Element:
    """junit.xml, checked for what the JUnit schema (and GitLab/GitHub/Jenkins) require: a testsuite with name and
    counts, testcases with name and classname, failure/skipped children with a message."""
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and suite.get("name")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) and int(suite.get("errors")) == 0
    assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
    assert int(suite.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
    for c in cases:
        assert c.get("name") and c.get("classname") and float(c.get("time")) >= 0
        for child in c:
            assert child.tag in ("failure", "skipped", "system-out")
            if child.tag != "system-out":
                assert child.get("message")
    return suite


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """A sweep of two quickstart smoke jobs, rank 1 failing at step 2 in the second: (its result, its folder). Job 0
    (debug.fail_rank=-1, the default: no rank fails; fail_step is then unused) is quickstart's smoke run, which the
    smoke test reads instead of launching the same run again."""
    cwd = tmp_path_factory.mktemp("sweep")
    res = run_cli(["-m", "recipe=quickstart", "smoke=true", "debug.fail_rank=-1,1", "debug.fail_step=2"], cwd)
    return res, (cwd / "log_output" / "latest").resolve()


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_shipped_recipe_passes_its_smoke_run(tmp_path, recipe, request):
    if recipe == "quickstart":  # the sweep's job 0
        res, sweep_dir = request.getfixturevalue("sweep")
        run = sweep_dir / "0"
        assert json.loads((sweep_dir / "sweep.json").read_text())["jobs"][0]["status"] == "ok", res.stdout[-3000:]
    else:
        res = run_cli([f"recipe={recipe}", "smoke=true"], tmp_path)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        run = (tmp_path / "log_output" / "latest").resolve()
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "ok" and s["completed_steps"] == 2 and s["world_size"] == 2 and s["eval"]
    assert s["recipe"] == recipe
    assert (run / "checkpoints" / "step2" / "checkpoint.json").exists()
    for rank in (0, 1):  # and read back by every rank, against the state it saved
        events = [json.loads(line).get("event") for line in (run / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines()]
        assert "checkpoint_verified" in events
    suite = parse_junit(run / "junit.xml")
    assert suite.get("failures") == "0" and len(suite.findall("testcase")) == 3  # the run and 2 ranks


def test_a_sweep_runs_every_job_and_a_failed_one_fails_it(sweep):
    res, sweep = sweep
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    record = json.loads((sweep / "sweep.json").read_text())
    assert [(j["job"], j["status"], j["exit_code"]) for j in record["jobs"]] == [(0, "ok", 0), (1, "failed", 1)]
    assert record["status"] == "failed" and "1/2 ok" in res.stdout
    ok, failed = parse_junit(sweep / "0" / "junit.xml"), parse_junit(sweep / "1" / "junit.xml")
    assert ok.get("failures") == "0"
    rank1 = next(c for c in failed.findall("testcase") if c.get("name") == "rank 1")
    failure = rank1.find("failure")
    assert "rank 1 failed with exit code 1" in failure.get("message")
    assert "injected failure" in failure.text and "Begin global rank 1 STDERR" in failure.text
    run_case = next(c for c in failed.findall("testcase") if c.get("name").startswith("run "))
    assert run_case.find("failure").get("type") == "failed"


def test_a_sweep_with_hydra_range_syntax_writes_every_jobs_dry_run(tmp_path, cli):
    res = cli(["-m", "recipe=quickstart", "smoke=true", "zero.stage=range(0,3)", "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep = (tmp_path / "log_output" / "latest").resolve()
    stages = [json.loads((sweep / str(n) / "plan.json").read_text())["zero_stage"] for n in range(3)]
    assert stages == [0, 1, 2]
    assert [j["status"] for j in json.loads((sweep / "sweep.json").read_text())["jobs"]] == ["dry run"] * 3
