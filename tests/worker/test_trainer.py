"""The Trainer in one process (a real 1-rank gloo group): its state_dict carries everything the next steps depend
on, and tables follow the engine's loss scale and skipped steps."""

import copy
import json
import time

import pytest
import torch
import torch.distributed as dist

from launcher.launch.watchdog import Watchdog
from launcher.manifest import list_files, manifest_problems
from launcher.plan import TablePlan
from launcher.metrics_writer import MetricsWriter
from launcher.rundir import CheckpointDir, RunDir
from launcher.worker.mesh import build_mesh
from launcher.tables import ReplicatedTables
from launcher.worker.train import build_trainer
from tests.conftest import init_one_process_group, plan_of


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    init_one_process_group()
    yield
    dist.destroy_process_group()


def _trainer(overrides, host):
    plan = plan_of(["cluster.nproc_per_node=1", *overrides], host)
    mesh, dp = build_mesh(plan.dims, "cpu")
    return build_trainer(plan, dp, torch.device("cpu"), 0, mesh)


CASES = {
    "gpt": ["recipe=gpt", "model.layers=1", "model.width=32", "model.heads=2", "model.seq_len=16",
            "model.dropout=0.1", "batch.global_size=8"],  # dropout: the RNG state matters
    "wide_deep_host_tables": ["recipe=wide_deep", "model.rows_per_table=500", "batch.global_size=128",
                              "placement.host_device_mix=1", "batch.grad_accum=2"],
    "quickstart": ["recipe=quickstart"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trip_continues_identically(case, cpu_host):
    a = _trainer(CASES[case], cpu_host)
    for _ in range(4):
        a.train_step()
    state = copy.deepcopy(a.state_dict())  # a snapshot: the live state goes on changing
    assert state["step"] == 4 and state["data_position"] == 4 * a.plan.batch.grad_accum
    if a.tables is not None:  # lazy Adam's bias correction needs its step count
        assert state["tables"]["deep_embedding"]["optimizer"]["steps"] == 4
    after_a = [a.train_step().item() for _ in range(3)]

    b = _trainer(CASES[case], cpu_host)
    b.load_state_dict(state)
    assert b.step == 4
    after_b = [b.train_step().item() for _ in range(3)]
    assert after_b == after_a  # bit-identical: model, optimizer, tables, data position, RNG


def test_save_and_load_through_a_checkpoint_dir(tmp_path, cpu_host):
    overrides = CASES["wide_deep_host_tables"]
    a = _trainer(overrides, cpu_host)
    for _ in range(3):
        a.train_step()
    ckpt = CheckpointDir(tmp_path / "step3")
    a.save(ckpt)
    assert {p.name for p in ckpt.path.iterdir()} == {"model", "tables", "trainer.0.pt", "checkpoint.json"}
    files = json.loads(ckpt.meta.read_text())["files"]  # the manifest: every file, its bytes and CRC-32
    assert sorted(files) == list_files(ckpt.path, skip=("checkpoint.json",)) and "trainer.0.pt" in files
    assert {f.split("/")[0] for f in files} == {"model", "tables", "trainer.0.pt"}
    assert manifest_problems(ckpt.path, files) == []
    after_a = [a.train_step().item() for _ in range(3)]
    b = _trainer(overrides, cpu_host)
    b.load(ckpt)
    assert [b.train_step().item() for _ in range(3)] == after_a


def test_the_heartbeat_moves_while_a_slow_save_runs(tmp_path, cpu_host):
    """Trainer.fit's checkpoint under the rank's real heartbeat and the launcher's watchdog: an engine save that takes
    2.5 times launcher.watchdog_s keeps the heartbeat moving (state "saving"), and the watchdog names no hang."""
    t = _trainer([*CASES["quickstart"], "trainer.steps=1", "eval.batches=0"], cpu_host)
    run = RunDir(tmp_path)
    metrics = MetricsWriter(run.rank(0))
    dog = Watchdog({0: run.rank(0)}, dict, watchdog_s=0.8, period_s=0.0)
    seen = []
    save = t.engine.save

    def slow_save(ckpt):  # the engine's own save, then 2 s more (a large model on a slow disk)
        save(ckpt)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            seen.append((run.rank(0).read_heartbeat(), dog.check({0})))
            time.sleep(0.05)

    t.engine.save = slow_save
    t.fit(run, run.rank(0), metrics)
    metrics.close()
    beats = [beat for beat, _ in seen if beat]  # {} = read while being rewritten
    assert all(stall is None for _, stall in seen)
    assert {b.get("state") for b in beats} == {"saving"} and len({b["time"] for b in beats}) >= 4
    assert run.rank(0).read_heartbeat()["step"] == 1 and "state" not in run.rank(0).read_heartbeat()
    assert run.newest_checkpoint()[1] == 1


def test_progress_and_rng_load_with_weights_only(tmp_path, cpu_host):
    """trainer.<rank>.pt (step, data position, torch's and Python's RNG states) loads with weights_only=True: no
    pickled code runs when a checkpoint is read; a resumed run draws the same random numbers."""
    import random

    a = _trainer(CASES["gpt"], cpu_host)
    a.train_step()
    ckpt = CheckpointDir(tmp_path / "step1")
    a.save(ckpt)
    saved = torch.load(ckpt.trainer(0), weights_only=True)
    assert saved["step"] == 1 and saved["rng"]["python"] == random.getstate()
    want = (random.random(), torch.rand(3))
    random.seed(99)
    torch.manual_seed(99)
    b = _trainer(CASES["gpt"], cpu_host)
    b.load(ckpt)
    got = (random.random(), torch.rand(3))
    assert b.step == 1 and got[0] == want[0] and torch.equal(got[1], want[1])


@pytest.mark.parametrize("change", ["none", "engine", "table", "optimizer", "load_nothing"])
def test_verify_checkpoint_finds_a_checkpoint_that_does_not_bring_the_state_back(tmp_path, cpu_host, change):
    t = _trainer(CASES["wide_deep_host_tables"], cpu_host)
    t.train_step()
    ckpt = CheckpointDir(tmp_path / "step1")
    t.save(ckpt)
    if change == "engine":  # the live state moves on after the save: the checkpoint no longer matches it
        next(t.engine.module.parameters()).data.add_(1.0)
    elif change == "table":
        t.tables.tables["wide_embedding"].weight[3] += 1.0
    elif change == "optimizer":
        next(iter(t.engine.optimizer.state.values()))["exp_avg"].add_(1.0)
    elif change == "load_nothing":  # a load that restores nothing must not pass
        t.load = lambda ckpt: None
    if change == "none":
        t.verify_checkpoint(ckpt)
    else:
        with pytest.raises(RuntimeError, match="read back differs from the state it saved"):
            t.verify_checkpoint(ckpt)


def _table_set(weight: torch.Tensor, optimizer: str) -> ReplicatedTables:
    plan = TablePlan(name="t", rows=weight.shape[0], dim=weight.shape[1], location="host", optimizer=optimizer,
                     lr=0.1, betas=(0.9, 0.999), eps=1e-8, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1)
    return ReplicatedTables({"t": weight.clone()}, (plan,), torch.device("cpu"))


def _one_step(tables: ReplicatedTables, backward_scale: float, collect_scale: float) -> bool:
    act = tables.lookup("t", torch.tensor([1, 5, 5, 9]))
    (((act - 1.0) ** 2).sum() * backward_scale).backward()  # what an fp16 engine's backward does to the loss
    tables.collect(grad_scale=collect_scale)
    return tables.step()


def test_tables_unscale_gradients_by_the_engines_loss_scale():
    weight = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    plain, scaled, not_unscaled = (_table_set(weight, "ftrl") for _ in range(3))  # FTRL: n += g^2, scale-sensitive
    assert _one_step(plain, 1.0, 1.0) and _one_step(scaled, 1024.0, 1024.0) and _one_step(not_unscaled, 1024.0, 1.0)
    w = {k: t.tables["t"].weight for k, t in (("plain", plain), ("scaled", scaled), ("not", not_unscaled))}
    assert torch.allclose(w["plain"], w["scaled"], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(w["plain"], w["not"], rtol=1e-3)  # guards the check above
    assert not torch.equal(w["plain"], weight)


def test_tables_skip_an_overflowed_step():
    weight = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    tables = _table_set(weight, "lazy_adam")
    assert not _one_step(tables, float("inf"), 1024.0)  # the tables' own gradients overflowed
    assert torch.equal(tables.tables["t"].weight, weight) and tables.tables["t"].optimizer.steps == 0
    assert tables.skipped_steps == 1
    assert _one_step(tables, 1024.0, 1024.0) and tables.tables["t"].optimizer.steps == 1


class LossScaledEngine:
    """What an fp16 engine shows the Trainer, on CPU: gradients that carry ``loss_scale``, and a skipped step on an
    overflow. Wraps the real DDP engine; the Trainer and the tables are the real ones under test."""

    def __init__(self, inner, loss_scale: float, skip: bool) -> None:
        self.inner, self.loss_scale, self.step_skipped = inner, loss_scale, skip
        self.module, self.optimizer = inner.module, inner.optimizer

    def __call__(self, *inputs, **kwargs):
        return self.inner(*inputs, **kwargs)

    def backward(self, loss):
        self.inner.backward(loss * self.loss_scale)

    def step(self):
        if not self.step_skipped:
            self.inner.step()


def test_trainer_hands_the_loss_scale_and_skips_to_the_tables(cpu_host):
    overrides = ["recipe=wide_deep", "model.rows_per_table=500", "batch.global_size=128", "placement.host_device_mix=1"]
    reference, scaled, skipped = (_trainer(overrides, cpu_host) for _ in range(3))
    before = {n: t.weight.clone() for n, t in skipped.tables.tables.items()}
    scaled.engine = LossScaledEngine(scaled.engine, 1024.0, skip=False)
    skipped.engine = LossScaledEngine(skipped.engine, 1024.0, skip=True)
    for t in (reference, scaled, skipped):
        t.train_step()
    for name, t in reference.tables.tables.items():
        assert not torch.equal(t.weight, before[name])
        assert torch.allclose(scaled.tables.tables[name].weight, t.weight, rtol=1e-5, atol=1e-7), name
        assert torch.equal(skipped.tables.tables[name].weight, before[name]), name  # skipped with the engine
