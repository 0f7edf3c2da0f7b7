"""placement.modules on real ranks (issue 47): the seed's network (mnist_mlp) with every Dense layer on the host
equals the same run with every layer on the device per step, and one process; a host layer beside ZeRO-2 on the
device part, and wide_deep's MLP on the host beside host tables, equal their all-device runs; the host run is killed
after a checkpoint and resumes to the same losses (the host modules' weights and optimizer states are in it); a
user's model from YAML with a submodule on the host trains, and each rank measures its bytes on the host; placement=auto
with a device too small for the whole network puts its largest layer on the host and trains within the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.usercode.readme_project import write_project

pytestmark = pytest.mark.integration

MNIST = ["recipe=mnist_mlp", "trainer.steps=8", "trainer.log_every=1", "data.samples=512", "data.eval_samples=64"]
ON_HOST = "+placement.modules={dense*: host}"  # MindSpore's sample: every Dense layer on the host


def _losses(run: Path, rank: int = 0) -> dict[int, float]:
    """Per step, the loss rank ``rank`` logged, over every attempt (a restart logs the steps after its checkpoint)."""
    out = {}
    for metrics in sorted(run.glob(f"attempt.*/rank.{rank}/metrics.jsonl")) + [run / f"rank.{rank}" / "metrics.jsonl"]:
        for m in map(json.loads, metrics.read_text().splitlines()):
            if "event" not in m:
                out[m["step"]] = m["loss"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hosted")
    project = write_project(tmp / "project")
    (project / "conf" / "recipe" / "my_ctr_host.yaml").write_text(
        (project / "conf" / "recipe" / "my_ctr.yaml").read_text().replace("recipe: {name: my_ctr}",
                                                                           "recipe: {name: my_ctr_host}")
        + "placement:\n  modules: {mlp.0: host}\n")
    wide = ["recipe=wide_deep", "trainer.steps=8", "trainer.log_every=1", "placement.host_device_mix=1",
            "model.rows_per_table=2000", "batch.global_size=256"]
    jobs = {
        "host": (tmp, [*MNIST, ON_HOST, "trainer.checkpoint_every=4", "debug.fail_rank=1", "debug.fail_step=6",
                       "launcher.max_restarts=1"]),
        "device": (tmp, MNIST),
        "one": (tmp, [*MNIST, ON_HOST, "cluster.nproc_per_node=1"]),
        "zero2_host": (tmp, [*MNIST, "zero.stage=2", "recompute=[all]", "+placement.modules={dense1: host}"]),
        "fsdp_host": (tmp, [*MNIST, "zero.stage=3", "parallel.data_parallel=fsdp", "+placement.modules={dense1: host}"]),
        "bf16_host": (tmp, [*MNIST, "precision=bf16", "+placement.modules={dense1: host}"]),
        "bf16_device": (tmp, [*MNIST, "precision=bf16"]),
        "pipeline_host": (tmp, [*MNIST, "parallel.pipeline_stages=2", "batch.micro_batches=2",
                                "+placement.modules={dense1: host, dense3: host}"]),
        "auto": (tmp, [*MNIST, "placement=auto", "cluster.device_memory_gb=0.004"]),
        "tables_host": (tmp, [*wide, "+placement.modules={mlp: host}"]),
        "tables_device": (tmp, wide),
        "user": (project, ["--config-dir", "conf", "recipe=my_ctr_host", "trainer.steps=6", "cluster.nproc_per_node=2"]),
    }
    out = {}
    for name, (cwd, args) in jobs.items():
        res = run_cli([*args, f"output.run_name={name}"], cwd)
        assert res.returncode == 0, (name, res.stdout[-3000:] + res.stderr[-3000:])
        out[name] = cwd / "log_output" / name
    return out


def _close(a: dict[int, float], b: dict[int, float], tol: float) -> None:
    assert sorted(a) == sorted(b) and a, (a, b)
    worst = max(abs(a[k] - b[k]) for k in a)
    assert worst <= tol, (worst, a, b)


def test_every_dense_layer_on_the_host_equals_the_device_and_one_process(runs):
    _close(_losses(runs["host"]), _losses(runs["device"]), 1e-6)
    _close(_losses(runs["host"]), _losses(runs["one"]), 1e-5)
    plan = json.loads((runs["host"] / "plan.json").read_text())
    assert [m["name"] for m in plan["placement"]["modules"]] == ["dense1", "dense2", "dense3"]
    summary = json.loads((runs["host"] / "summary.json").read_text())
    assert [a["status"] for a in summary["attempts"]] == ["failed", "ok"]  # killed after step 6, resumed from 4
    assert summary["attempts"][1]["resumed_from"].endswith("step4")
    for rank in (0, 1):
        held = json.loads((runs["host"] / f"rank.{rank}" / "memory.json").read_text())["host_modules"]
        assert held["params"] == 4 * sum(m["params"] for m in plan["placement"]["modules"]) == held["grads"]
        assert held["devices"] == ["cpu"] and held["modules"] == ["dense1", "dense2", "dense3"]


def test_a_host_layer_beside_zero2_and_recompute_beside_fsdp_and_an_mlp_beside_host_tables(runs):
    parts = [p["name"] for p in json.loads((runs["zero2_host"] / "plan.json").read_text())["parts"]]
    assert parts == ["recompute", "deepspeed"], parts
    # Against the all-device run on DDP: DeepSpeed ZeRO-2 (recompute too) and FSDP2 with every layer on the device
    # give it exactly here (0.0 over these 8 steps, measured by hand), so one device run stands for all three.
    _close(_losses(runs["zero2_host"]), _losses(runs["device"]), 1e-6)
    assert [p["name"] for p in json.loads((runs["fsdp_host"] / "plan.json").read_text())["parts"]] == ["fsdp"]
    _close(_losses(runs["fsdp_host"]), _losses(runs["device"]), 1e-6)  # FSDP2 shards the rest
    host, device = _losses(runs["bf16_host"]), _losses(runs["bf16_device"])  # the host layer computes in fp32
    assert sorted(host) == sorted(device) and max(abs(host[k] - device[k]) / device[k] for k in host) <= 2e-2
    plan = json.loads((runs["tables_host"] / "plan.json").read_text())
    assert {t["name"]: t["location"] for t in plan["placement"]["tables"]} == {"deep_embedding": "host",
                                                                               "wide_embedding": "host"}
    assert [m["name"] for m in plan["placement"]["modules"]] == ["mlp"]
    _close(_losses(runs["tables_host"]), _losses(runs["tables_device"]), 1e-6)


def test_a_submodule_of_a_users_model_from_yaml(runs):
    plan = json.loads((runs["user"] / "plan.json").read_text())
    assert plan["placement"]["modules"] == [{"name": "mlp.0", "params": 2368, "state_floats": 2, "io_floats": 36 + 64,
                                             "location": "host"}]  # Linear(2 * 16 + 4, 64)
    summary = json.loads((runs["user"] / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["final_loss"] < summary["first_loss"]
    for rank in (0, 1):
        held = json.loads((runs["user"] / f"rank.{rank}" / "memory.json").read_text())["host_modules"]
        assert (held["params"], held["optimizer"]) == (4 * 2368, 2 * 4 * 2368)  # Adam's two states, on the host


def test_placement_auto_trains_with_the_largest_layer_on_the_host_within_the_device_budget(runs):
    plan = json.loads((runs["auto"] / "plan.json").read_text())
    assert [m["name"] for m in plan["placement"]["modules"]] == ["dense1"]
    summary = json.loads((runs["auto"] / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["final_loss"] < summary["first_loss"]
    usable = plan["budget"]["device"] * (1 - plan["budget"]["reserve"])
    for rank in (0, 1):  # a CPU host's "device" is host memory: what is held is the tensors the ranks measured there
        memory = json.loads((runs["auto"] / f"rank.{rank}" / "memory.json").read_text())
        device = memory["device"]["params"] + memory["device"]["optimizer"]
        assert 0 < 2 * device <= usable, (device, usable)  # weights and their gradients (SGD: no state)
        assert memory["host_modules"]["params"] == 4 * (784 * 512 + 512)  # dense1 on the host


def test_each_pipeline_stage_trains_the_host_modules_it_holds(runs):
    """2 stages (flatten, dense1 | relu1 ... dense3), dense1 and dense3 on the host: each stage's rank holds and steps
    its own, and the losses are the data-parallel device run's (the same 32 samples a step, split otherwise)."""
    _close(_losses(runs["pipeline_host"]), _losses(runs["device"]), 1e-5)
    plan = json.loads((runs["pipeline_host"] / "plan.json").read_text())
    stages = {s["index"]: s["layers"] for s in plan["pipeline"]["stages"]}
    for rank, module in ((0, "dense1"), (1, "dense3")):
        assert module in stages[rank]
        held = json.loads((runs["pipeline_host"] / f"rank.{rank}" / "memory.json").read_text())["host_modules"]
        assert held["modules"] == [module]
