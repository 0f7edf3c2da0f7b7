"""`hetero-launch report` on run dirs that a crash, a full disk or a bad copy damaged: plan.json, summary.json or a
rank's metrics.jsonl cut short, with a stray byte, or of another shape. Each is one line that names the file and
what is wrong, and the report goes on with the rest (exit 0); when nothing of the run can be shown, one paragraph and
exit 2. Never a traceback.

The plan is a real one (a dry run of quickstart, 2 ranks); the ranks' records and the summary are written through
the run dir's own writers, then damaged as those accidents leave them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.metrics_writer import MetricsWriter
from launcher.report.summary import build_summary, read_records
from launcher.rundir import RunDir
from tests.conftest import run_cli
from tests.launch.test_report_merge import plan as elastic_plan  # noqa: F401 - a fixture
from tests.launch.test_report_merge import write_node


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    """plan.json of a real dry run: quickstart, 2 ranks."""
    cwd = tmp_path_factory.mktemp("dry")
    res = run_cli(["recipe=quickstart", "dry_run=true", "cluster.nproc_per_node=2"], cwd)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    plan = RunDir((cwd / "log_output" / "latest").resolve()).read_plan()
    assert [r["rank"] for r in plan["ranks"]] == [0, 1]
    return plan


def write_run(path: Path, plan: dict) -> RunDir:
    """A failed run as the launcher leaves it: both ranks logged 3 steps, summary.json written."""
    run = RunDir(path)
    run.path.mkdir()
    run.write_json(run.plan, plan)
    for r in (0, 1):
        w = MetricsWriter(run.rank(r))
        for step in (1, 2, 3):
            w.step_done(step)
            w.write(step=step, loss=1.0 / step, local_loss=1.0 / step + 0.01 * r, samples_per_s=100.0 * step)
        w.close()
    run.write_summary(build_summary(run, plan, [{"rank": 0, "exit_code": 1}, {"rank": 1, "exit_code": -15}],
                                    "failed", 3.0))
    return run


def report(cli, run: RunDir, cwd: Path, code: int = 0) -> str:
    """Report ``run`` in this process: its exit code is ``code``, nothing is a traceback; stdout and stderr, one
    space between words (however the console wrapped them)."""
    res = cli(["report", str(run.path)], cwd)
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == code and "Traceback" not in said, said
    return said


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def _stray_byte(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:20] + b"\xff" + data[21:])


SUMMARY_DAMAGE = {
    "cut short": (_cut, "summary.json is damaged: it is not JSON, or cut short (Unterminated string"),
    "empty": (lambda p: p.write_bytes(b""), "summary.json is damaged: it is empty;"),
    "a stray byte": (_stray_byte, "summary.json is damaged: it is not UTF-8 text (byte 0xff at offset 20)"),
    "an array": (lambda p: p.write_text("[1, 2, 3]\n"), "summary.json is damaged: it holds a JSON array, where a JSON "
                                                        "object belongs"),
    "a rank of another shape": (
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "ranks": [{"rank": 0}, "x"]})),
        "summary.json is damaged: it has no ranks[0].exit_code"),
    "a field of another shape": (
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "wall_s": "3 s"})),
        "summary.json is damaged: its wall_s is '3 s', not a number"),
}


@pytest.mark.parametrize("damage", SUMMARY_DAMAGE, ids=list(SUMMARY_DAMAGE))
def test_a_damaged_summary_is_named_and_rebuilt_from_the_ranks_records(tmp_path, plan, cli, damage):
    run = write_run(tmp_path / "run", plan)
    how, said_as = SUMMARY_DAMAGE[damage]
    how(run.summary)
    said = report(cli, run, tmp_path)
    assert said_as in said and "rebuilt from the ranks' records" in said
    assert "│ 1 │ - │ 3/" in said and run.plot("loss").is_file()  # both ranks, from their records


PLAN_DAMAGE = {
    "cut short": (_cut, "it is not JSON, or cut short"),
    "a stray byte": (_stray_byte, "it is not UTF-8 text (byte 0xff at offset 20)"),
    "an array": (lambda p: p.write_text("[1, 2]"), "it holds a JSON array, where a JSON object belongs"),
    "ranks of another shape": (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "ranks": [0, 1]})),
                               "its ranks[0] is 0, not an object with an int rank"),
    "a folder": (lambda p: (p.unlink(), p.mkdir()), "it cannot be read (Is a directory)"),
}


@pytest.mark.parametrize("damage", PLAN_DAMAGE, ids=list(PLAN_DAMAGE))
def test_a_damaged_plan_is_named_and_the_summary_shown(tmp_path, plan, cli, damage):
    run = write_run(tmp_path / "run", plan)
    how, why = PLAN_DAMAGE[damage]
    how(run.plan)
    said = report(cli, run, tmp_path)
    assert f"damaged: {run.plan}: {why}" in said and "; the report goes on without it" in said
    assert "run: failed in 3.0 s" in said and run.plot("loss").is_file()
    run.summary.unlink()  # and without a summary: rebuilt from the rank.<N>/ folders there
    said = report(cli, run, tmp_path)
    assert "unknown (no summary.json" in said and "│ 1 │ - │ 3 │" in said  # (how many steps: in the plan)


def test_a_plan_field_of_another_shape_is_left_out_of_the_rebuilt_summary(tmp_path, plan, cli):
    run = write_run(tmp_path / "run", plan)
    run.write_json(run.plan, {**plan, "peak": [1, 2], "reference": "none"})
    run.summary.unlink()
    said = report(cli, run, tmp_path)
    assert f"damaged: {run.plan}: a field the summary reads has another shape" in said
    assert "the summary is rebuilt without it" in said and "│ 1 │ - │ 3 │" in said


def test_nothing_to_show_is_one_paragraph_and_exit_2(tmp_path, plan, cli):
    run = write_run(tmp_path / "run", plan)
    _cut(run.plan)
    run.summary.write_text("[]")
    for r in (0, 1):
        shutil.rmtree(run.rank(r).path)
    said = report(cli, run, tmp_path, code=2)
    assert (f"nothing of {run.path} can be shown: its plan.json is damaged (it is not JSON, or cut short" in said
            and "its summary.json is damaged (it holds a JSON array, where a JSON object belongs), and it has no "
            "rank.<N>/ folder to rebuild a summary from. Copy the run dir again" in said), said


def test_bad_metrics_lines_are_skipped_and_counted_and_the_rest_read(tmp_path, plan, cli):
    run = write_run(tmp_path / "run", plan)
    metrics = run.rank(0).metrics
    lines = metrics.read_bytes().split(b"\n")
    metrics.write_bytes(b"\n".join([lines[0], b"\x00\xff garbage", *lines[1:-1]]) + b"\n" + b'{"step": 4, "lo')
    records, note = read_records(run.rank(0))
    assert [m["step"] for m in records] == [1, 2, 3]  # the stray byte's line lost, not the rest
    assert note == (f"2 line(s) of {metrics} skipped; the first, line 2, because it is not UTF-8 text (byte "
                    f"0xff)")
    said = report(cli, run, tmp_path)  # summary.json is intact: the plots say what they skipped
    assert f"skipped: rank 0: 2 line(s) of {metrics} skipped; the first, line 2" in said
    assert run.plot("loss").is_file() and "│ 0 │ 1 │ 3/" in said
    run.summary.unlink()  # rebuilt: its table says so, and the torn line is named as such
    metrics.write_bytes(b"\n".join(lines[:-1]) + b"\n" + b'{"step": 4, "lo')
    said = "".join(report(cli, run, tmp_path).split())  # (the table's caption folds a long path)
    assert "".join(f"note: rank 0: 1 line(s) of {metrics} skipped; the first, line 4, because it is not JSON (cut "
                   f"short: its rank died mid-write)".split()) in said
    metrics.unlink()
    metrics.mkdir()
    assert read_records(run.rank(0)) == ([], f"{metrics} skipped: the file cannot be read (Is a directory)")
    assert "│ 0 │ - │ 3/" in report(cli, run, tmp_path)


def test_missing_or_empty_rank_folders_leave_empty_rows(tmp_path, plan, cli):
    run = write_run(tmp_path / "run", plan)
    run.summary.unlink()
    shutil.rmtree(run.rank(1).path)
    for f in run.rank(0).path.iterdir():
        f.unlink()
    said = report(cli, run, tmp_path)
    assert "│ 0 │ - │ 0/" in said and "│ 1 │ - │ 0/" in said
    assert "nothing to plot" in said and not run.plot("loss").exists()  # no empty plot


def test_merging_damaged_node_dirs(tmp_path, elastic_plan, cli):  # noqa: F811
    node0 = write_node(tmp_path / "node0-run", elastic_plan, 0, [0, 1])
    node1 = write_node(tmp_path / "node1-run", elastic_plan, 1, [2, 3])
    node1.summary.write_text('["not", "a summary"]')
    node1.rank_env.write_bytes(b'{"2": \xff')
    res = cli(["report", str(node0.path), str(node1.path)], tmp_path)
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0 and "Traceback" not in said, said
    assert (f"damaged: {node1.summary}: it holds a JSON array, where a JSON object belongs; rebuilt from its ranks' "
            f"records" in said and f"damaged: {node1.rank_env}: it is not UTF-8 text (byte 0xff at offset 6); its "
            f"ranks' environments are left out" in said)
    merged = RunDir(tmp_path / "node0-run-merged")
    assert [r["rank"] for r in merged.read_summary()["ranks"]] == [0, 1, 2, 3]
    _cut(node1.plan)
    res = cli(["report", str(node0.path), str(node1.path), "--into", str(tmp_path / "again")], tmp_path)
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and "Traceback" not in said, said
    assert f"{node1.plan} is damaged: it is not JSON, or cut short" in said and "Copy the node's run dir again" in said
    assert not (tmp_path / "again").exists()
