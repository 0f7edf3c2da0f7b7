"""The run dir's records the launcher trusts: the newest *complete* checkpoint, and the heartbeat."""

import json

from launcher.rundir import MetricsWriter, RunDir


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
