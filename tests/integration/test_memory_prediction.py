"""The memory model's peak against what real ranks measure: each rank's resident peak (VmHWM, rank.N/memory.json
"peak") within 10 % of the plan's figure for it, for wide_deep, gpt in the compositions, a user's model and resnet
(short runs, 2 CPU ranks; the plan's activations traced: placement=auto). On CPU the peak is the whole RSS."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.usercode.readme_project import write_project

pytestmark = pytest.mark.integration

SHORT = ["trainer.steps=3", "trainer.log_every=1", "trainer.checkpoint_every=-1", "eval.batches=0", "placement=auto"]
WITHIN = 0.10
RUNS = {
    "wide_deep ddp": ["recipe=wide_deep"],
    "wide_deep host tables zero-1": ["recipe=wide_deep", "placement.host_device_mix=1", "zero.stage=1"],
    "gpt tp 2": ["recipe=gpt", "parallel.tp=2"],
    "gpt pipeline 2": ["recipe=gpt", "parallel.pipeline_stages=2"],
    "gpt fsdp zero-3": ["recipe=gpt", "zero.stage=3"],
    "gpt offload bf16": ["recipe=gpt", "optimizer.target=CPU", "precision=bf16"],
}


def peaks(run: Path) -> list[tuple[int, int]]:
    """(measured, planned) bytes of each rank, as the summary has them."""
    summary = json.loads((run / "summary.json").read_text())
    return [(r["peak_bytes"], r["planned_peak_bytes"]) for r in summary["ranks"]]


def assert_predicted(run: Path, within: float = WITHIN) -> None:
    got = peaks(run)
    assert got and all(m and p for m, p in got), got
    worst = max(abs(m / p - 1) for m, p in got)
    assert worst <= within, f"measured vs planned peak: {[(m, p, round(m / p - 1, 3)) for m, p in got]}"


@pytest.mark.parametrize("name", RUNS)
def test_the_plan_predicts_each_ranks_peak(tmp_path, name):
    res = run_cli([*RUNS[name], *SHORT], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_predicted((tmp_path / "log_output" / "latest").resolve())


def test_the_plan_predicts_a_users_model(tmp_path):
    project = write_project(tmp_path / "my_project")
    res = run_cli(["--config-dir", "conf", "recipe=my_ctr", "cluster.nproc_per_node=2", *SHORT], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_predicted((project / "log_output" / "latest").resolve())


def test_resnet_is_predicted(tmp_path):
    """A convolutional model: its first step loads oneDNN's convolutions (the plan's "conv kernels" constant)."""
    res = run_cli(["recipe=resnet", "parallel.pipeline_stages=1", *SHORT], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert_predicted((tmp_path / "log_output" / "latest").resolve())
