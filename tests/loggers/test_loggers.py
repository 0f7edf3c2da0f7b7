"""The logger component without a run: the ``logger`` value's shapes, the checks before launch, the records' names,
a failing logger, and TensorBoard's event files read back."""

import json
import re
import warnings

import pytest

from launcher.loggers import check_loggers, logger_specs
from launcher.loggers.sink import LoggedMetricsWriter, LoggerWarning, Loggers, metrics_of, open_metrics
from launcher.plan import LaunchPlan
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import RankDir
from tests.conftest import plan_of
from tests.loggers.file_logger import BrokenLogger, FileLogger

TB = {"_target_": "launcher.loggers.tensorboard.TensorBoardLogger"}
MINE = {"_target_": "tests.loggers.file_logger.FileLogger", "path": "x.jsonl"}


@pytest.mark.parametrize("value, specs", [
    ("tensorboard", (TB,)),
    (None, ()), ("none", ()), ("null", ()), (False, ()), ([], ()),
    (MINE, (MINE,)),
    (["tensorboard", MINE, "none"], (TB, MINE)),
])
def test_logger_value_names_its_loggers(value, specs):
    assert logger_specs(value) == (specs, [])


def test_an_unknown_logger_name_is_a_problem_with_did_you_mean():
    specs, problems = logger_specs(["tensorboard", "tensorbord"])
    assert specs == (TB,)
    assert problems == ["logger[1]='tensorbord' is not a logger. Did you mean tensorboard? Give tensorboard, a class "
                        "of yours by _target_ (logger[1]={_target_: my_project.logs.MyLogger}), a list of those, or "
                        "none (no logger)."]


def test_the_same_logger_twice_is_a_problem():
    """TensorBoard twice wrote two event files into one folder: every point shown twice. Two of a kind with other
    arguments are two loggers."""
    specs, problems = logger_specs(["tensorboard", "tensorboard"])
    assert specs == (TB,) and problems == ["logger[1]: the same logger as an earlier entry "
                                           "(launcher.loggers.tensorboard.TensorBoardLogger with the same arguments) "
                                           "would write every point twice. Remove one."]
    assert logger_specs([MINE, {**MINE, "path": "y.jsonl"}]) == ((MINE, {**MINE, "path": "y.jsonl"}), [])


class NeedsAPackage(FileLogger):
    requires = ("no_such_package_hl",)


@pytest.mark.parametrize("value, message", [
    ({"_target_": "no_such_module_hl.Logger"},
     r"logger\._target_=no_such_module_hl\.Logger does not import: ModuleNotFoundError"),
    ([TB, {"_target_": "tests.loggers.file_logger.NoSuch"}],
     r"logger\[1\]\._target_=tests\.loggers\.file_logger\.NoSuch does not import: AttributeError"),
    ({"_target_": "collections.OrderedDict"}, r"has no log_metrics and no close method"),
    ({**TB, "flush_sec": 3}, r"logger\.flush_sec=3: .*no argument flush_sec\. Did you mean logger\.flush_secs\?"),
    ({"_target_": "tests.loggers.file_logger.FileLogger"}, r"logger\.path is required by .*FileLogger\(\)"),
    ({"_target_": f"{__name__}.NeedsAPackage", "path": "x"},
     r"needs the Python package no_such_package_hl.*pip install no_such_package_hl, or set logger=none"),
])
def test_a_bad_logger_is_refused_naming_its_key(value, message):
    problems = check_loggers(value)
    assert len(problems) == 1 and re.search(message, problems[0]), problems


def test_shipped_and_user_loggers_pass_the_check():
    assert check_loggers("tensorboard") == [] and check_loggers([TB, MINE]) == [] and check_loggers("none") == []


def test_the_plan_carries_the_loggers(cpu_host):
    plan = plan_of(["recipe=quickstart"], cpu_host)
    assert plan.loggers == (TB,)
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))).loggers == (TB,)  # plan.json round trip
    assert plan_of(["recipe=quickstart", "logger=none"], cpu_host).loggers == ()
    assert plan_of(["recipe=quickstart", "logger=null"], cpu_host).loggers == ()


def test_records_become_train_and_eval_scalars():
    assert metrics_of({"step": 4, "loss": 0.5, "local_loss": 0.4, "samples_per_s": 100.0, "lr": 0.1, "time": 1.0,
                       "wall_s": 2.0}) == (4, {"train/loss": 0.5, "train/samples_per_s": 100.0, "train/lr": 0.1})
    assert metrics_of({"event": "eval", "step": 8, "loss": 0.3, "auc": 0.7, "accuracy": 0.6, "n": 64}) == \
        (8, {"eval/loss": 0.3, "eval/auc": 0.7, "eval/accuracy": 0.6})
    assert metrics_of({"event": "checkpoint_verified", "step": 8}) is None
    assert metrics_of({"step": 3}) is None


def test_a_failing_logger_warns_once_and_the_others_go_on(tmp_path):
    mine = FileLogger(str(tmp_path / "got.jsonl"))
    loggers = Loggers([(0, "my.Broken", BrokenLogger(fail_at=2)), (1, "my.File", mine)])
    with pytest.warns(LoggerWarning) as caught:
        for step in (1, 2, 3):
            loggers.log_metrics(step, {"train/loss": float(step)})
        loggers.close()
    assert len(caught) == 1
    assert str(caught[0].message) == ("hetero-launch: logger my.Broken failed in log_metrics at step 2 (OSError: the "
                                      "metrics service went away); it is off for the rest of the run, training goes "
                                      "on.")
    lines = [json.loads(x) for x in (tmp_path / "got.jsonl").read_text().splitlines()]
    assert [x.get("step") for x in lines] == [1, 2, 3, None] and lines[-1] == {"closed": True}
    assert loggers.dropped == [(0, 2, "log_metrics")]  # its index, the step, where


def test_a_logger_that_cannot_be_built_is_left_out(tmp_path):
    with pytest.warns(LoggerWarning, match=r"logger tests\.loggers\.file_logger\.FileLogger failed in its constructor"):
        writer = open_metrics(RankDir(tmp_path / "rank.0"), [{"_target_": "tests.loggers.file_logger.FileLogger"}], 0)
    assert isinstance(writer, LoggedMetricsWriter) and writer.loggers.names == []
    writer.write(step=1, loss=1.0)
    writer.close()
    records = [json.loads(x) for x in (tmp_path / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("event"), r["step"], r.get("logger"), r.get("in_constructor")) for r in records] == [
        ("logger_off", 0, 0, 1), (None, 1, None, None)]
    assert type(open_metrics(RankDir(tmp_path / "rank.1"), [TB], 1)) is MetricsWriter  # only rank 0 logs


def test_a_dropped_logger_is_written_down_and_the_summary_names_it(tmp_path):
    """A logger that fails is a ``logger_off`` event in rank 0's metrics.jsonl, at its step, once; the summary's
    words name its _target_ from the plan (a run's own summary: tests/integration/test_logger_runs.py)."""
    from launcher.report.rank_records import loggers_off

    specs = [{"_target_": "tests.loggers.file_logger.FileLogger", "path": str(tmp_path / "got.jsonl")},
             {"_target_": "tests.loggers.file_logger.BrokenLogger", "fail_at": 2}]
    with pytest.warns(LoggerWarning):
        writer = open_metrics(RankDir(tmp_path / "rank.0"), specs, 0)
        for step in (1, 2, 3):
            writer.step_done(step)
            writer.write(step=step, loss=1.0)
        writer.close()
    records = [json.loads(x) for x in (tmp_path / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    off = [r for r in records if r.get("event") == "logger_off"]
    assert [(r["step"], r["logger"]) for r in off] == [(2, 1)] and records.index(off[0]) == 2  # right after step 2
    assert loggers_off({"logger_off": off}, {"loggers": specs}) == [
        "logger tests.loggers.file_logger.BrokenLogger failed at step 2 and was off from then (its error: "
        "rank.0/stderr)"]
    assert loggers_off({"logger_off": [{"event": "logger_off", "step": 0, "logger": 7, "in_constructor": 1}]},
                       {"loggers": "x"}) == [
        "logger number 7 failed in its constructor and was off from then (its error: rank.0/stderr)"]
    assert loggers_off({"logger_off": [{"event": "logger_off", "step": 0, "logger": 0, "in_close": 1}]},
                       {"loggers": specs}) == [
        "logger tests.loggers.file_logger.FileLogger failed when closed after step 0 and was off from then (its error: "
        "rank.0/stderr)"]


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = open_metrics(RankDir(tmp_path / "rank.0"), [{**TB, "log_dir": str(tmp_path / "tb")}], 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoggerWarning)
        writer.write(step=1, loss=0.75, samples_per_s=10.0, lr=0.01)
        writer.write(event="eval", step=1, loss=0.5, auc=0.625)
        writer.write(step=2, loss=0.25, samples_per_s=20.0, lr=0.01)
        writer.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    got = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert got == {"train/loss": [(1, 0.75), (2, 0.25)], "train/samples_per_s": [(1, 10.0), (2, 20.0)],
                   "train/lr": [(1, pytest.approx(0.01)), (2, pytest.approx(0.01))], "eval/loss": [(1, 0.5)],
                   "eval/auc": [(1, 0.625)]}
    assert [json.loads(x)["loss"] for x in (tmp_path / "rank.0" / "metrics.jsonl").read_text().splitlines()] == \
        [0.75, 0.5, 0.25]  # the file is written as before
