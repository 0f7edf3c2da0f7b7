"""docs/your_model.md's "Bring your own model" project (written to a folder outside the repository, verbatim) trained on
real ranks: host tables vs device tables, the optimizer on the CPU vs on the device, 2 ranks vs 1 process; and its
runtime.prepare() script under hetero-launch and under plain torchrun."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.parallel.ddp import FLAT
from tests.conftest import run_cli
from tests.integration.test_placement_runs import assert_close, assert_where_the_plan_says, losses
from tests.usercode.readme_project import write_project

pytestmark = pytest.mark.integration
SHORT = ["trainer.steps=20", "trainer.log_every=1", "trainer.checkpoint_every=-1", "cluster.nproc_per_node=2"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return write_project(tmp_path_factory.mktemp("my_project"), extra=True)


def train(project: Path, name: str, overrides: list[str]) -> Path:
    res = run_cli(["--config-dir", "conf", "recipe=my_ctr", *SHORT, f"output.run_name={name}", *overrides], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = project / "log_output" / name
    want = 1 if "cluster.nproc_per_node=1" in overrides else 2
    assert json.loads((run / "plan.json").read_text())["world_size"] == want
    return run


@pytest.fixture(scope="module")
def host_tables(project):
    # with a validation split (val_data), scored every 5 steps: it changes no step of training
    return train(project, "host", ["placement.host_device_mix=1", "eval.every=5",
                                   "+val_data={_target_: my_ctr.data.Clicks, n: 600, users: 100000, items: 1000, "
                                   "seed: 2}"])


def test_host_tables_match_device_tables(project, host_tables):
    device = train(project, "device", ["+placement.tables.user_emb=device", "+placement.tables.item_emb=device"])
    plan = json.loads((host_tables / "plan.json").read_text())
    assert {t["name"]: t["location"] for t in plan["placement"]["tables"]} == {"user_emb": "host", "item_emb": "host"}
    assert_where_the_plan_says(host_tables)
    assert_where_the_plan_says(device)
    assert_close(losses(device), losses(host_tables), rel=1e-6)
    summary = json.loads((host_tables / "summary.json").read_text())
    assert summary["final_loss"] < summary["first_loss"] and 0.5 < summary["eval"]["auc"] <= 1
    records = [json.loads(line) for line in (host_tables / "rank.1" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in records if m.get("event") == "val"] == [5, 10, 15, 20]  # val_data, every 5 steps
    assert [m["step"] for m in records if m.get("event") == "eval"] == [20]  # eval_data once, at the end
    assert summary["validation"]["n"] == 600 and summary["eval"]["n"] == 5000


def test_optimizer_on_cpu_matches_the_device_optimizer(project):
    device = train(project, "as_written", [])
    cpu = train(project, "cpu", ["optimizer.target=CPU"])
    assert json.loads((cpu / "rank.0" / "memory.json").read_text())["offload"]["optimizer"]
    assert [p["name"] for p in json.loads((cpu / "plan.json").read_text())["parts"]] == ["deepspeed"]
    assert_close(losses(device), losses(cpu), rel=1e-4)


def test_two_ranks_match_one_process(project, host_tables):
    odd = "eval_data.n=4999"  # 2 ranks are dealt 2,500 items each: the padded one is run, not scored
    one = train(project, "one", ["placement.host_device_mix=1", "cluster.nproc_per_node=1", odd])
    assert_close(losses(one), losses(host_tables), rel=1e-5)
    # a layer built and never called: torch DDP would stop at the second step; the flat all-reduce trains as one does
    unused = train(project, "unused", ["placement.host_device_mix=1", "model._target_=my_ctr.extra.Unused", odd])
    assert json.loads((unused / "plan.json").read_text())["parts"][0]["config"]["implementation"] == FLAT
    assert_close(losses(one), losses(unused), rel=1e-5)
    evals = [json.loads((run / "summary.json").read_text())["eval"] for run in (one, unused)]
    assert evals[0]["n"] == evals[1]["n"] == 4999, evals
    assert all(abs(evals[0][k] - evals[1][k]) <= 1e-5 for k in ("loss", "auc", "logloss", "accuracy")), evals


def run_script(project: Path, name: str, overrides: list[str]) -> dict:
    res = run_cli(["script=train_ctr.py", f"output.run_name={name}", "cluster.nproc_per_node=2", *overrides], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = project / "log_output" / name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["final_loss"] < summary["first_loss"]
    return json.loads((run / "rank.1" / "prepared.json").read_text())


def test_prepare_trains_the_scripts_tables_on_the_host(project):
    built = run_script(project, "script_host", ["placement.host_device_mix=1"])
    assert built["parts"] == ["ddp"] and built["engine_params"] == 36 * 64 + 64 + 64 + 1
    tables = {n: {k: v for k, v in t.items() if k != "rows_held"} for n, t in built["tables"].items()}
    assert tables == {n: {"location": "host", "optimizer": "lazy_adam", "lr": 0.001, "torch_device": "cpu",
                          "shards": 1} for n in ("user_emb", "item_emb")}


def test_prepare_gets_zero_offload(project):
    built = run_script(project, "script_offload", ["optimizer.target=CPU"])
    assert built["parts"] == ["deepspeed"] and built["zero_stage"] == 2 and built["offload_optimizer"]
    assert {t["location"] for t in built["tables"].values()} == {"engine"}


def test_the_same_script_runs_under_plain_torchrun(project):
    env = {k: v for k, v in os.environ.items() if k != "HL_RUN_DIR"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "train_ctr.py"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logged = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [r["step"] for r in logged][:2] == [20, 40] and logged[-1]["loss"] < logged[0]["loss"]


SCHEDULED = """
import torch
from launcher import runtime
from my_ctr.model import Net

torch.manual_seed(0)
model = Net(users=1000, items=100)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer = runtime.prepare(model, optimizer)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
batch = (torch.randint(0, 1000, (8,)), torch.randint(0, 100, (8,)), torch.randn(8, 4))
for _ in range(3):
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(*runtime.move(*batch)), torch.ones(8))
    runtime.backward(loss)
    optimizer.step()
    scheduler.step()
state = runtime.state_dict()
runtime.load_state_dict(state)
tables = {k: list(v["weight"].shape) for k, v in (state["tables"] or {}).items()}
print("RESULT", [g["lr"] for g in optimizer.param_groups], sum(p.numel() for p in model.parameters()), tables)
"""


def test_prepare_keeps_the_users_optimizer_for_schedulers_and_saves_the_tables(project):
    (project / "scheduled.py").write_text(SCHEDULED)
    res = run_cli(["script=scheduled.py", "output.run_name=scheduled", "cluster.nproc_per_node=1",
                   "placement.host_device_mix=1"], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = project / "log_output" / "scheduled"
    out = (run / "rank.0" / "stdout").read_text()
    # StepLR halves the SGD lr 3 times; the engine trains 2,433 dense parameters; the tables (by name) are in the state
    assert "RESULT [0.0625] 2433 {'item_emb': [100, 16], 'user_emb': [1000, 16]}" in out, out
    built = json.loads((run / "rank.0" / "prepared.json").read_text())
    # the tables keep the user's optimizer: row-sparse SGD at SGD's lr (issue 20: it was lazy Adam at 1e-3)
    assert {(t["optimizer"], t["lr"]) for t in built["tables"].values()} == {("sgd", 0.5)}
    [note] = built["table_notes"]
    assert "follow your SGD: sgd (row-sparse, lr 0.5) — exact: torch's SGD update on the rows looked up" in note, note


def test_a_pipeline_of_the_users_model_matches_one_process(project):
    """Two stages of a model of the user's whose first child takes three inputs: the same losses as one process, and
    the held-out AUC of its 0/1 labels through the pipeline."""
    write_project(project, extra=True)
    staged = ["model._target_=my_ctr.extra.Staged", "trainer.steps=8", "batch.micro_batches=2"]
    one = train(project, "staged_one", [*staged, "cluster.nproc_per_node=1"])
    pipe = train(project, "staged_pipe", [*staged, "parallel.pipeline_stages=2"])
    plan = json.loads((pipe / "plan.json").read_text())
    assert [p["name"] for p in plan["parts"]] == ["ddp", "pipeline"] and plan["eval_metrics"] == "binary"
    assert_close(losses(one), losses(pipe), rel=1e-6)
    evals = [json.loads((run / "summary.json").read_text())["eval"] for run in (one, pipe)]
    assert abs(evals[0]["auc"] - evals[1]["auc"]) <= 1e-6 and evals[1]["n"] == evals[0]["n"], evals


def test_a_resume_after_the_models_code_changed_is_refused_before_launch(tmp_path):
    """The model's YAML is the same, its code is not: the checkpoint's DCP metadata lacks the new layer's tensors.
    Checked against the model built on meta before launch, where every rank failed reading the checkpoint; the tables
    trained outside the parts are saved apart and are not asked of it."""
    project = write_project(tmp_path)
    train(project, "saved", ["placement.host_device_mix=1", "trainer.steps=4", "trainer.checkpoint_every=2"])
    resume = ["--config-dir", "conf", "recipe=my_ctr", *SHORT, "placement.host_device_mix=1", "dry_run=true",
              "trainer.resume_from=log_output/saved/checkpoints/step4"]
    assert run_cli(resume, project).returncode == 0
    model = project / "my_ctr" / "model.py"
    model.write_text(model.read_text().replace("nn.Linear(hidden, 1))", "nn.ReLU(), nn.Linear(hidden, 1))"))
    res = run_cli(resume, project)
    assert res.returncode == 2 and "Traceback" not in res.stderr + res.stdout
    assert ("trainer.resume_from=log_output/saved/checkpoints/step4: the model's code changed since the checkpoint was "
            "saved: the model now holds mlp.3.weight, mlp.3.bias, which the checkpoint does not.") in " ".join(
        res.stderr.split()), res.stderr
