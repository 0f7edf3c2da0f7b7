"""A user's data read through DataLoader workers and as a stream, on real ranks: a map-style Dataset with a random
augmentation read by 2 workers on 2 ranks matches one process reading it on its training thread; an IterableDataset
on 2 ranks with a worker each matches one process, and a run resumed from its step-4 checkpoint gives the
uninterrupted run's losses for steps 5-8."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.test_placement_runs import assert_close
from tests.usercode.loader_project import write_project

pytestmark = pytest.mark.integration
COMMON = ["trainer.log_every=1", "eval.max_batches=2"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("my_loaders"))


def train(project: Path, recipe: str, name: str, *overrides: str) -> tuple[Path, dict[int, float]]:
    res = run_cli(["--config-dir", "conf", f"recipe={recipe}", *COMMON, f"output.run_name={name}", *overrides],
                  project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = project / "log_output" / name
    records = map(json.loads, (run / "rank.0" / "metrics.jsonl").read_text().splitlines())
    return run, {r["step"]: r["loss"] for r in records if "event" not in r}


def test_workers_on_two_ranks_read_what_one_process_reads(project):
    run, workers = train(project, "slow", "workers", "trainer.steps=6", "trainer.checkpoint_every=-1",
                         "cluster.nproc_per_node=2", "loader.num_workers=2")
    _, alone = train(project, "slow", "alone", "trainer.steps=6", "trainer.checkpoint_every=-1",
                     "cluster.nproc_per_node=1", "loader.num_workers=0")
    assert_close(list(workers.values()), list(alone.values()), rel=1e-5)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["data"]["loader"]["num_workers"] == 2
    assert any(n.startswith("loader: 2 workers per rank") for n in plan["notes"]), plan["notes"]


def test_a_stream_trains_as_one_process_and_resumes_exactly(project):
    run, straight = train(project, "stream", "stream", "trainer.steps=8", "trainer.checkpoint_every=4",
                          "cluster.nproc_per_node=2", "loader.num_workers=1")
    _, alone = train(project, "stream", "stream_alone", "trainer.steps=8", "trainer.checkpoint_every=-1",
                     "cluster.nproc_per_node=1", "loader.num_workers=0")
    assert_close(list(straight.values()), list(alone.values()), rel=1e-5)
    _, resumed = train(project, "stream", "stream_resumed", "trainer.steps=8", "trainer.checkpoint_every=-1",
                       "cluster.nproc_per_node=2", "loader.num_workers=1",
                       f"trainer.resume_from={run}/checkpoints/step4")
    assert sorted(resumed) == [5, 6, 7, 8]
    assert [resumed[s] for s in (5, 6, 7, 8)] == [straight[s] for s in (5, 6, 7, 8)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8 and "auc" in summary["eval"]
