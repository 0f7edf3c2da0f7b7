"""Placement does not change the math, and tensors really are where the plan says (real 2-rank runs)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SMALL = ["recipe=wide_deep", "model.rows_per_table=2000", "batch.global_size=256", "trainer.log_every=1",
         "trainer.checkpoint_every=-1", "eval.batches=1"]
TOLERANCE = 0.05  # measured bytes vs the plan's estimate


def run(tmp_path: Path, name: str, overrides: list[str]) -> Path:
    cwd = tmp_path / name
    cwd.mkdir()
    res = run_cli([*SMALL, *overrides], cwd)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return (cwd / "log_output" / "latest").resolve()


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "event" not in r]


def assert_close(a: list[float], b: list[float], rel: float) -> None:
    assert len(a) == len(b)
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    assert worst <= rel, f"worst relative difference {worst:.3g} > {rel}"


def assert_where_the_plan_says(run_dir: Path) -> None:
    plan = json.loads((run_dir / "plan.json").read_text())
    world = plan["world_size"]
    for rank in range(world):
        measured = json.loads((run_dir / f"rank.{rank}" / "memory.json").read_text())
        for where in ("host", "device"):
            for kind in ("params", "optimizer", "tables", "table_states"):
                want, got = plan["memory"][where][kind], measured[where][kind]
                if want == 0:
                    assert got == 0, f"rank {rank} {where} {kind}: plan 0, measured {got}"
                else:
                    assert abs(got - want) <= TOLERANCE * want, f"rank {rank} {where} {kind}: plan {want}, measured {got}"
        for name, t in measured["tables"].items():  # sparse tables: outside the engine, where planned
            assert not t["in_engine"], name
            expected = "cpu" if t["planned"] == "host" else plan["device_type"]
            assert t["torch_device"] == expected and set(t["state_devices"]) <= {expected}, (name, t)
        # DeepSpeed really switched offload on (or off) as planned.
        assert measured["offload"]["optimizer"] == (plan["placement"]["optimizer_location"] == "host")
        assert measured["offload"]["params"] == (plan["placement"]["param_location"] == "host")
        if plan["device_type"] == "cpu":
            assert set(sum(measured["devices"].values(), [])) == {"cpu"}
        else:  # on a GPU host the torch devices must follow the plan
            host_kinds = [k for k in ("params", "optimizer", "tables", "table_states") if measured["host"][k]]
            dev_kinds = [k for k in ("params", "optimizer", "tables", "table_states") if measured["device"][k]]
            assert all(measured["devices"][k] == ["cpu"] for k in host_kinds if not measured["device"][k])
            assert all(measured["devices"][k] == ["cuda"] for k in dev_kinds if not measured["host"][k])
    digests = [json.loads((run_dir / f"rank.{r}" / "tables.json").read_text()) for r in range(world)]
    assert all(d == digests[0] for d in digests), "host tables differ between ranks"


HOST_TABLES = ["placement.host_device_mix=1", "trainer.steps=50"]


@pytest.fixture(scope="module")
def host_tables_run(tmp_path_factory) -> Path:
    """wide_deep's tables on the host, 2 ranks, 50 steps: one launched run read by the placement check below and by
    the device-vs-host comparison (the same overrides each used to launch on its own)."""
    return run(tmp_path_factory.mktemp("host_tables"), "host", HOST_TABLES)


CPU_OPTIMIZER = ["cluster.nproc_per_node=2", "placement.host_device_mix=1", "trainer.steps=20", "zero.stage=2",
                 "optimizer.target=CPU"]
"""The optimizer on the CPU: ZeRO-2's offload (what optimizer.target=CPU alone plans: "zero.stage 0 -> 2")."""


@pytest.fixture(scope="module")
def cpu_optimizer_run(tmp_path_factory) -> Path:
    """Host tables and the optimizer on the CPU, 2 ranks, 20 steps: one launched run read by the placement check
    below and by the two-ranks-vs-one-process comparison (the same plan each used to launch on its own)."""
    return run(tmp_path_factory.mktemp("cpu_optimizer"), "cpu", CPU_OPTIMIZER)


SHARED = {"host_tables": "host_tables_run", "optimizer_on_cpu": "cpu_optimizer_run"}


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("host_tables", HOST_TABLES),
        ("optimizer_on_cpu", CPU_OPTIMIZER),
        ("zero3_offload_params_bf16", ["placement.host_device_mix=1", "zero.stage=3", "placement.offload_params=true",
                                       "precision=bf16", "trainer.steps=30"]),
    ],
    ids=["host_tables", "optimizer_on_cpu", "zero3_offload_params_bf16"],
)
def test_placement_runs_train_and_match_the_plan(tmp_path, request, name, overrides):
    run_dir = request.getfixturevalue(SHARED[name]) if name in SHARED else run(tmp_path, "run", overrides)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 2
    assert summary["final_loss"] < summary["first_loss"]
    assert_where_the_plan_says(run_dir)


def test_host_device_mix_does_not_change_the_math(tmp_path, host_tables_run):
    device = run(tmp_path, "device", ["placement.host_device_mix=0", "trainer.steps=50"])
    host = host_tables_run
    assert {t["location"] for t in json.loads((host / "plan.json").read_text())["placement"]["tables"]} == {"host"}
    assert json.loads((host / "rank.0" / "memory.json").read_text())["host"]["tables"] > 0
    assert json.loads((device / "rank.0" / "memory.json").read_text())["host"]["tables"] == 0
    assert_close(losses(device), losses(host), rel=1e-6)


@pytest.fixture(scope="module")
def one_process_baseline(tmp_path_factory):
    return losses(run(tmp_path_factory.mktemp("baseline"), "one", ["cluster.nproc_per_node=1", "trainer.steps=20"]))


@pytest.mark.parametrize(
    "overrides",
    [
        # ZeRO-1 and -2 without offload are the offload runs' engines minus the offload, and ZeRO-1's offload is
        # ZeRO-2's optimizer (DeepSpeedZeroOptimizer) without gradient partitioning; the suite's time goes to the runs
        # that differ. Each offload run matches the one-process run (the optimizer on the device).
        ["zero.stage=3"],
        None,  # ZeRO-2 with the optimizer on the CPU: CPU_OPTIMIZER, the placement check's run
        ["zero.stage=3", "optimizer.target=CPU", "placement.offload_params=true"],
    ],
    ids=["z3", "z2_offload", "z3_offload_all"],
)
def test_two_ranks_match_one_process(tmp_path, request, one_process_baseline, overrides):
    run_dir = request.getfixturevalue("cpu_optimizer_run") if overrides is None else run(
        tmp_path, "two", [*CPU_OPTIMIZER[:3], *overrides])
    assert_where_the_plan_says(run_dir)
    assert_close(one_process_baseline, losses(run_dir), rel=1e-4)
