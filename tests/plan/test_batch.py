"""The batch solver: any two of (global, micro, accum) infer the third; the error shows the formula."""

import pytest

from launcher.plan.batch import BatchPlan, plan_batch


@pytest.mark.parametrize(
    "g, m, a, dp, want",
    [
        (256, -1, -1, 2, BatchPlan(256, 128, 1)),  # only global: accum 1
        (-1, 16, -1, 2, BatchPlan(32, 16, 1)),  # only micro
        (256, 32, -1, 2, BatchPlan(256, 32, 4)),  # infer accum
        (256, -1, 4, 2, BatchPlan(256, 32, 4)),  # infer micro
        (-1, 8, 3, 4, BatchPlan(96, 8, 3)),  # infer global
        (64, 8, 4, 2, BatchPlan(64, 8, 4)),  # all three consistent
    ],
)
def test_solves(g, m, a, dp, want):
    assert plan_batch(g, m, a, dp) == (want, [])


def test_inconsistent_triple_shows_formula_and_fix():
    plan, problems = plan_batch(10, 4, 1, 2)
    assert plan is None
    assert "global 10 != micro 4 × accum 1 × dp 2 (= 8)" in problems[0]
    assert "Set batch.global_size=8" in problems[0]


def test_indivisible_global_names_multiple():
    _, problems = plan_batch(100, -1, 3, 2)
    assert "global 100 != micro ? × accum 3 × dp 2; 100 is not a multiple of 6" in problems[0]
    assert "batch.global_size=96" in problems[0]


def test_no_size_takes_huggingface_trainers_default_per_rank():
    plan, problems = plan_batch(-1, -1, 4, 2)
    assert problems == [] and (plan.micro_size, plan.grad_accum, plan.global_size) == (8, 4, 64)


@pytest.mark.parametrize("field, value", [("global_size", 0), ("micro_size", -5)])
def test_rejects_nonpositive(field, value):
    kwargs = {"global_size": 64, "micro_size": -1, "grad_accum": -1, field: value}
    _, problems = plan_batch(dp=2, **kwargs)
    assert f"batch.{field}={value} must be a positive integer" in problems[0]
