"""Loggers in real runs: TensorBoard event files in the run dir, a user's own logger by _target_ (a module in the
folder the run starts in), a logger that fails mid-run, a script's runtime.log, and a bad _target_ refused."""

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration
USER_LOGGERS = Path(__file__).resolve().parents[1] / "loggers" / "file_logger.py"


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rank.0" / "metrics.jsonl").read_text().splitlines()]


def test_a_run_writes_tensorboard_and_feeds_the_users_loggers(tmp_path):
    shutil.copy(USER_LOGGERS, tmp_path / "my_logs.py")
    loggers = "[tensorboard,{_target_:my_logs.FileLogger,path:got.jsonl},{_target_:my_logs.BrokenLogger,fail_at:4}]"
    res = run_cli(["recipe=quickstart", "trainer.steps=6", "trainer.log_every=2", "eval.every=3",
                   f"logger={loggers}"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run, s = (tmp_path / "log_output" / "latest").resolve(), read_summary(tmp_path)
    steps = [r for r in _records(run) if "event" not in r]
    evals = [r for r in _records(run) if r.get("event") == "eval"]
    tb = _scalars(run / "tensorboard")
    # TensorBoard holds rank 0's records at their steps (as float32): the loss is summary.json's.
    assert tb["train/loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in steps]
    assert [step for step, _ in tb["train/loss"]] == [1, 2, 4, 6]
    assert tb["train/loss"][-1][1] == pytest.approx(s["final_loss"], rel=1e-6)
    assert tb["train/lr"] == [(step, pytest.approx(0.2)) for step in (1, 2, 4, 6)]  # quickstart's optimizer.lr
    assert [step for step, _ in tb["train/samples_per_s"]] == [1, 2, 4, 6]
    assert tb["eval/loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in evals]
    assert [step for step, _ in tb["eval/loss"]] == [3, 6]
    assert tb["eval/loss"][-1][1] == pytest.approx(s["eval"]["loss"], rel=1e-6)
    # The user's logger got the same numbers, and was closed; the broken one was reported once and training went on.
    got = [json.loads(line) for line in (tmp_path / "got.jsonl").read_text().splitlines()]
    assert got[-1] == {"closed": True}
    got = got[:-1]
    assert [(g["step"], g["metrics"]["train/loss"]) for g in got if "train/loss" in g["metrics"]] == \
        [(r["step"], r["loss"]) for r in steps]
    assert [(g["step"], g["metrics"]["eval/loss"]) for g in got if "eval/loss" in g["metrics"]] == \
        [(r["step"], r["loss"]) for r in evals]
    stderr = (run / "rank.0" / "stderr").read_text()
    assert stderr.count("logger my_logs.BrokenLogger failed") == 1, stderr
    assert "failed in log_metrics at step 4 (OSError: the metrics service went away)" in stderr
    # ... and the summary and the console name it, which had been silent (only rank 0's stderr said so)
    said = "logger my_logs.BrokenLogger failed at step 4 and was off from then (its error: rank.0/stderr)"
    assert s["loggers_off"] == [said] and said in " ".join(res.stdout.replace("│", " ").split()), res.stdout
    assert s["status"] == "ok" and not (run / "rank.1" / "tensorboard").exists()


def test_a_bad_logger_target_exits_2_before_anything_starts(tmp_path, cli):
    res = cli(["recipe=quickstart", "logger={_target_:no_such_pkg.Logger}"], tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "logger._target_=no_such_pkg.Logger does not import: ModuleNotFoundError" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "log_output").exists()


SCRIPT = """
import torch
from launcher import runtime

net = torch.nn.Linear(4, 1)
model, optimizer = runtime.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05))
for step in range(1, 4):
    x, y = runtime.move(torch.randn(8, 4), torch.randn(8, 1))
    loss = torch.nn.functional.mse_loss(model(x), y)
    runtime.backward(loss)
    runtime.step()
    runtime.log(step=step, loss=loss, accuracy=0.5)
"""


def test_a_scripts_runtime_log_reaches_tensorboard(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    res = run_cli(["script=train.py", "cluster.nproc_per_node=1"], tmp_path)  # the loggers are rank 0's
    assert res.returncode == 0, res.stdout + res.stderr
    run = (tmp_path / "log_output" / "latest").resolve()
    tb = _scalars(run / "tensorboard")
    assert tb["train/loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in _records(run)]
    assert tb["train/accuracy"] == [(step, 0.5) for step in (1, 2, 3)]
    assert tb["train/lr"] == [(step, pytest.approx(0.05)) for step in (1, 2, 3)]
