"""The run dir's records the launcher trusts: the newest *complete* checkpoint, and the heartbeat."""

import json
import time

import pytest

from launcher.errors import ConfigError
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import RunDir, create_run_dir, create_sweep_dir, point_latest


def _checkpoint(run: RunDir, step: int, complete: bool) -> None:
    ckpt = run.checkpoint(step)
    ckpt.path.mkdir(parents=True)
    (ckpt.path / "model").mkdir()
    if complete:
        ckpt.meta.write_text(json.dumps({"step": step}))


def test_the_newest_complete_checkpoint_is_picked_and_a_half_written_one_never(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.newest_checkpoint() is None
    _checkpoint(run, 50, complete=True)
    _checkpoint(run, 100, complete=True)
    _checkpoint(run, 150, complete=False)  # killed while saving: no checkpoint.json
    (run.checkpoints / "step200").mkdir()
    (run.checkpoint(200).meta).write_text('{"step": 2')  # torn marker
    ckpt, step = run.newest_checkpoint()
    assert step == 100 and ckpt.path == run.checkpoint(100).path


def test_the_heartbeat_carries_step_time_and_memory_and_survives_rewrites(tmp_path):
    run = RunDir(tmp_path)
    w = MetricsWriter(run.rank(0))
    w.step_done(12345678)
    w.write(step=12345678, loss=1.0)
    w.step_done(7)  # a shorter record later: no stale tail
    w.close()
    beat = run.rank(0).read_heartbeat()
    assert beat["step"] == 7 and run.rank(0).last_step() == 7
    assert beat["rss"] > 2**20 and beat["host_available"] > 0 and beat["time"] > 1e9


def test_a_step_the_throttle_held_back_is_written_although_no_step_follows(tmp_path):
    """A rank that hangs right after a step which finished within HEARTBEAT_S of the last beat: the launcher's hang
    report said the step before it. And with no new step the heartbeat's time stands still (the watchdog's signal)."""
    run = RunDir(tmp_path)
    w = MetricsWriter(run.rank(0))
    w.step_done(1)
    w.step_done(2)  # within HEARTBEAT_S: held back
    assert run.rank(0).read_heartbeat()["step"] == 1
    time.sleep(4 * MetricsWriter.HEARTBEAT_S)
    beat = run.rank(0).read_heartbeat()
    assert beat["step"] == 2
    time.sleep(4 * MetricsWriter.HEARTBEAT_S)
    assert run.rank(0).read_heartbeat() == beat  # nothing new: not rewritten
    w.close()


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: p.write_text("notes")])
def test_a_latest_of_the_users_is_never_replaced_and_nothing_is_made(tmp_path, make):
    make(tmp_path / "latest")
    for create in (lambda: create_run_dir(tmp_path, "", "run"), lambda: create_sweep_dir(tmp_path)):
        with pytest.raises(ConfigError, match=rf"output.log_dir={tmp_path}: {tmp_path}/latest is a (folder|file), "
                                              rf"not the link .* Move it away \(mv {tmp_path}/latest"):
            create()
        assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_a_latest_link_even_a_loop_is_replaced(tmp_path):
    (tmp_path / "latest").symlink_to("latest")
    run = create_run_dir(tmp_path, "r1", "run")
    point_latest(tmp_path, run)
    assert (tmp_path / "latest").resolve() == run.path.resolve()


def test_a_log_dir_under_a_file_is_named(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=rf"output.log_dir={tmp_path}/f/logs: {tmp_path}/f is a file"):
        create_run_dir(tmp_path / "f" / "logs", "", "run")


def test_an_unwritable_log_dir_is_named_before_anything_is_made(tmp_path, monkeypatch):
    import launcher.rundir

    monkeypatch.setattr(launcher.rundir.os, "access", lambda path, mode: False)  # as a user without write access
    with pytest.raises(ConfigError, match=rf"output.log_dir={tmp_path}/a/b: {tmp_path} is not writable by this user"):
        create_run_dir(tmp_path / "a" / "b", "", "run")
    assert list(tmp_path.iterdir()) == []


def test_a_rank_error_raised_from_another_names_its_root_cause(tmp_path):
    """torch's pipeline stage raises "[Stage 0] failed to run forward" from the error its forward hit; the message the
    console and the summary show ends with that cause (from error.json's traceback), not with the wrapper alone."""
    import traceback

    def forward():
        raise RuntimeError("Tensor dtype mismatch! Expected: Float, Got: c10::BFloat16\n\nWhile executing %x")

    rank = RunDir(tmp_path / "run").rank(0)
    rank.path.mkdir(parents=True)
    try:
        try:
            forward()
        except RuntimeError as e:
            raise RuntimeError("\n    [Stage 0] failed to run forward:\n    args: ('Tensor(...)',)") from e
    except RuntimeError as e:
        callstack = "".join(traceback.format_exception(e))
    rank.error.write_text(json.dumps({"message": {"message": "RuntimeError: [Stage 0] failed to run forward",
                                                  "extraInfo": {"py_callstack": callstack, "timestamp": "0"}}}))
    assert rank.error_message() == ("RuntimeError: [Stage 0] failed to run forward (caused by RuntimeError: Tensor "
                                    "dtype mismatch! Expected: Float, Got: c10::BFloat16)")
    rank.error.write_text(json.dumps({"message": {"message": "ValueError: alone", "extraInfo": {
        "py_callstack": "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: alone\n"}}}))
    assert rank.error_message() == "ValueError: alone"
