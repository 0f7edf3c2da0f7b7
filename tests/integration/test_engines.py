"""Data-parallel parts and topology in real runs: torch DDP, DeepSpeed ZeRO-0 and one process compute the same steps;
the mesh builds the planned groups (resume: tests/integration/test_resume.py; every other composition:
test_composability.py)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

QUIET = ["trainer.log_every=1", "trainer.checkpoint_every=-1", "eval.batches=1"]
WIDE_DEEP = ["recipe=wide_deep", "model.rows_per_table=2000", "batch.global_size=256", "trainer.steps=15", *QUIET]
GPT = ["recipe=gpt", "model.layers=1", "model.width=64", "model.heads=2", "model.seq_len=32", "trainer.steps=15",
       *QUIET]


def run(tmp_path: Path, name: str, overrides: list[str]) -> Path:
    cwd = tmp_path / name
    cwd.mkdir()
    res = run_cli(overrides, cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return (cwd / "log_output" / "latest").resolve()


def losses(run_dir: Path, rank: int = 0) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / f"rank.{rank}" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "event" not in r}


def assert_close(a: dict[int, float], b: dict[int, float], rel: float) -> None:
    assert a.keys() == b.keys() and a
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    assert worst <= rel, f"worst relative difference {worst:.3g} > {rel}: {a} vs {b}"


def plan_of_run(run_dir: Path) -> dict:
    return json.loads((run_dir / "plan.json").read_text())


def parts(run_dir: Path) -> list[str]:
    return [p["name"] for p in plan_of_run(run_dir)["parts"]]


def test_deepspeed_zero0_and_one_process_agree(tmp_path):
    """DeepSpeed's engine at ZeRO-0 with host tables computes the one-process (DDP) steps. Torch DDP on 2 ranks vs one
    process: tests/integration/test_user_recipe.py::test_two_ranks_match_one_process and the baselines of
    test_sharding_runs.py."""
    one = run(tmp_path, "one", [*WIDE_DEEP, "cluster.nproc_per_node=1"])
    assert parts(one) == ["ddp"] and not (one / "ds_config.json").exists()
    two = run(tmp_path, "two", [*WIDE_DEEP, "cluster.nproc_per_node=2", "parallel.data_parallel=deepspeed",
                                "placement.host_device_mix=1"])
    assert parts(two) == ["deepspeed"] and (two / "ds_config.json").exists()
    assert_close(losses(one), losses(two), rel=1e-5)


def test_gpt_two_ranks_and_one_process_agree(tmp_path):
    """(ZeRO-Offload against the device optimizer: wide_deep in test_placement_runs.py and your own model in
    test_user_recipe.py; gpt's offload run resumes exactly in test_resume.py.)"""
    one = run(tmp_path, "one", [*GPT, "cluster.nproc_per_node=1"])
    two = run(tmp_path, "two", [*GPT, "cluster.nproc_per_node=2"])
    a = losses(one)
    assert a[15] < a[1]
    assert_close(a, losses(two), rel=1e-5)
    s = json.loads((two / "summary.json").read_text())
    ref = s["reference"]
    assert 0 < ref["entropy_floor"] < s["final_loss"] < ref["uniform_loss"] and 0 < ref["gap_closed"] < 1


def assert_mesh_groups_match_the_plan(run_dir: Path) -> None:
    """Every rank's mesh.json (coordinates and the global ranks of its pp, dp and tp groups, as torch.distributed
    sees them) is what the plan computed (tests/integration/test_sharding_runs.py runs it on a dp 2 × tp 2 run)."""
    plan = plan_of_run(run_dir)
    for r in plan["ranks"]:
        mesh = json.loads((run_dir / f"rank.{r['rank']}" / "mesh.json").read_text())
        assert mesh["coords"] == r["coords"]
        c = r["coords"]
        groups = {dim: [q["rank"] for q in plan["ranks"]
                        if all(q["coords"][o] == c[o] for o in ("pp", "dp", "tp") if o != dim)]
                  for dim in ("pp", "dp", "tp")}
        assert mesh["groups"] == groups
