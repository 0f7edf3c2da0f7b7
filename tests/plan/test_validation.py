"""data.val_fraction and trainer.early_stop as planned: when each split is scored, what early stopping watches, and
every way of asking for it that cannot work refused before launch, naming the key and a fix."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError
from tests.conftest import plan_of
from tests.data.make_ctr_csv import write_ctr_csv


@pytest.fixture(scope="module")
def csv(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("val") / "ctr.csv"
    write_ctr_csv(str(path), 2000)
    return str(path)


def _tabular(csv: str, *more: str) -> list[str]:
    return ["recipe=wide_deep", "data=tabular", f"data.path={csv}", "data.label=clicked", "data.positive=yes",
            "batch.global_size=100", "cluster.nproc_per_node=2", *more]


def test_a_validation_split_is_scored_once_an_epoch_and_the_test_split_at_the_end(csv, cpu_host):
    plan = plan_of(_tabular(csv, "data.val_fraction=0.1", "trainer.epochs=3"), cpu_host)
    # 2,000 rows: 400 test, 200 validation, 1,400 train = 14 steps an epoch of 100
    assert (plan.val_every, plan.eval_every, plan.steps, plan.early_stop) == (14, 0, 42, None)
    assert any("validation: 200 samples scored once an epoch (14 steps)" in n for n in plan.notes)
    every = plan_of(_tabular(csv, "data.val_fraction=0.1", "eval.every=5"), cpu_host)
    assert (every.val_every, every.eval_every) == (5, 0)
    plain = plan_of(_tabular(csv, "eval.every=5"), cpu_host)  # no validation split: eval.every scores the test split
    assert (plain.val_every, plain.eval_every, plain.steps) == (0, 5, 80)  # data=tabular: 5 epochs of 16 steps


def test_early_stopping_resolves_its_mode_from_the_metric(csv, cpu_host):
    plan = plan_of(_tabular(csv, "data.val_fraction=0.1", "trainer.early_stop.patience=2",
                            "trainer.early_stop.metric=auc"), cpu_host)
    assert (plan.early_stop.metric, plan.early_stop.mode, plan.early_stop.patience) == ("auc", "max", 2)
    loss = plan_of(_tabular(csv, "data.val_fraction=0.1", "trainer.early_stop.patience=3",
                            "trainer.early_stop.min_delta=0.01"), cpu_host)
    assert (loss.early_stop.mode, loss.early_stop.min_delta) == ("min", 0.01)
    assert any("on the best checkpoint" in n for n in loss.notes)


@pytest.mark.parametrize("more, says", [
    (["trainer.early_stop.patience=2"], "trainer.early_stop.patience=2 needs a validation split to watch: set "
                                        "data.val_fraction"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=-1"], "trainer.early_stop.patience=-1 must be >= 0"),
    (["data.val_fraction=0.1", "trainer.early_stop.metric=auc"], "trainer.early_stop.metric=auc does nothing with "
                                                                 "trainer.early_stop.patience=0"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=2", "trainer.early_stop.metric=f1"],
     "trainer.early_stop.metric='f1' is not reported by this run's evaluation. Set trainer.early_stop.metric to "
     "one of loss, auc, accuracy, logloss"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=2", "eval.metrics=loss", "trainer.early_stop.metric=auc"],
     "(auc, accuracy and logloss need eval.metrics=binary)"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=2", "trainer.early_stop.mode=up"],
     "trainer.early_stop.mode='up' is not one of auto, min, max"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=2", "trainer.early_stop.min_delta=-0.1"],
     "trainer.early_stop.min_delta=-0.1 must be >= 0"),
    (["data.val_fraction=0.1", "trainer.early_stop.patience=2", "trainer.checkpoint_every=-1"],
     "keeps the best checkpoint, and trainer.checkpoint_every=-1 writes none"),
    (["data.val_fraction=0.85"], "data.val_fraction=0.85 must be between 0 and 1 - data.test_fraction (0.2)"),
])
def test_what_cannot_work_is_refused_naming_the_key(csv, cpu_host, more, says):
    with pytest.raises(ConfigError) as e:
        plan_of(_tabular(csv, *more), cpu_host)
    assert says in str(e.value), str(e.value)


def test_early_stopping_on_data_without_a_validation_split_is_refused(cpu_host):
    with pytest.raises(ConfigError, match="needs a validation split to watch"):
        plan_of(["recipe=wide_deep", "trainer.early_stop.patience=2"], cpu_host)


@pytest.mark.parametrize("recipe", ["quickstart", "mnist_mlp"])
def test_binary_metrics_on_labels_that_are_not_clicks_are_refused(cpu_host, recipe):
    """quickstart's regression targets, mnist_mlp's digit classes: AUC and accuracy on them would be numbers of no
    meaning (an eval that said auc=0.025 on quickstart)."""
    with pytest.raises(ConfigError, match=rf"eval.metrics=binary: .* recipe {recipe}'s are not"):
        plan_of([f"recipe={recipe}", "eval.metrics=binary"], cpu_host)
    assert plan_of([f"recipe={recipe}"], cpu_host).eval_metrics == "loss"


def test_eval_keys_that_would_do_nothing_are_refused_or_reported(cpu_host):
    """eval.batches=0 runs no evaluation: an eval.* key set beside it is said in the plan (a recipe may set them:
    wide_deep's eval.metrics); eval.every at or past the run's last step only leaves the evaluation at the end,
    which the plan says too (both went by silently)."""
    notes = plan_of(["recipe=quickstart", "trainer.steps=3", "eval.batches=0", "eval.every=1"], cpu_host).notes
    assert "eval.every=1 with eval.batches=0: no evaluation runs, so nothing reads it" in notes
    plan_of(["recipe=wide_deep", "smoke=true", "eval.batches=0"], cpu_host)  # its own eval.metrics=binary
    plan = plan_of(["recipe=quickstart", "trainer.steps=3", "eval.every=10"], cpu_host)
    assert "eval.every=10 is not below trainer.steps=3: the only evaluation is the one at the end" in plan.notes
    assert not any("eval.every" in n for n in plan_of(["recipe=quickstart", "trainer.steps=30", "eval.every=10"],
                                                       cpu_host).notes)
