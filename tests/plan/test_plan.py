"""Planning is pure, complete and JSON-serialisable; bad combinations are refused with a fix."""

import json
import subprocess
import sys

import pytest

from launcher.errors import ConfigError
from launcher.plan import HostFacts, LaunchPlan
from tests.conftest import ALL_RECIPES, plan_of
from launcher.parallel import engine_config


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_recipe_plans_on_cpu(recipe, cpu_host):
    plan = plan_of([f"recipe={recipe}"], cpu_host)
    pipeline = recipe == "resnet"  # the seeds' pipeline example: 2 stages by default
    assert plan.world_size == 2 and plan.backend == "gloo" and plan.device_type == "cpu"
    assert (plan.dims.dp, plan.dims.pp) == ((1, 2) if pipeline else (2, 1))
    b = plan.batch
    assert b.global_size == b.micro_size * b.grad_accum * plan.dims.dp
    names = [p.name for p in plan.parts]
    if pipeline:  # the seeds' example: recompute of layer1-4, two stages (torch.distributed.pipelining) over DDP
        assert names == ["recompute", "ddp", "pipeline"] and plan.pipeline.micro_batches == 4
    else:
        assert names == ["ddp"]  # plain data parallel: torch DDP
    assert engine_config(plan) is None and plan.ds_ops == ()
    assert plan.memory.params > 0
    # Round trip through JSON is exact: the worker rebuilds the same plan from plan.json.
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_rank_env(cpu_host):
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=2"], cpu_host)
    for r in plan.ranks:
        env = r.env
        assert env["RANK"] == str(r.rank) and env["LOCAL_RANK"] == str(r.local_rank)
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "0"  # 0: picked at launch
        assert env["OMP_NUM_THREADS"] == "1"  # 2 cores / 2 local ranks
        assert env["DS_ACCELERATOR"] == "cpu"
        assert env["TORCH_EXTENSIONS_DIR"] == cpu_host.extensions_dir


def test_omp_threads_divide_cores():
    host = HostFacts(hostname="h", cpu_count=16, accelerators=0, extensions_dir="/x")
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=4", "batch.micro_size=4"], host)
    assert {r.env["OMP_NUM_THREADS"] for r in plan.ranks} == {"4"}


def test_auto_nproc_uses_accelerators_and_nccl():
    host = HostFacts(hostname="h", cpu_count=16, accelerators=4, extensions_dir="/x")
    plan = plan_of(["recipe=quickstart", "batch.micro_size=4"], host)
    assert plan.world_size == 4 and plan.backend == "nccl" and plan.device_type == "cuda"
    assert [r.device for r in plan.ranks] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert "DS_ACCELERATOR" not in plan.ranks[0].env
    assert any("visible CUDA devices" in n for n in plan.notes)


def test_rank_table_is_hccl_shaped(cpu_host):
    table = plan_of(["recipe=quickstart"], cpu_host).rank_table
    assert table["version"] == "1.0" and table["status"] == "completed" and table["server_count"] == "1"
    (server,) = table["server_list"]
    assert set(server) == {"server_id", "device", "host_nic_ip"}
    assert [d["rank_id"] for d in server["device"]] == ["0", "1"]
    for d in server["device"]:
        assert set(d) == {"device_id", "device_ip", "rank_id"}
        assert all(isinstance(v, str) for v in d.values())


def test_memory_estimate_shards_with_zero(cpu_host):
    dense = ["recipe=wide_deep", "tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense"]
    m0 = plan_of(dense, cpu_host).memory.device
    m1 = plan_of([*dense, "zero.stage=1"], cpu_host).memory.device
    m3 = plan_of([*dense, "zero.stage=3"], cpu_host).memory.device
    n = plan_of(dense, cpu_host).memory.dense_params
    assert m0.params == n * 4 and m0.optimizer == n * 8  # fp32 Adam at stage 0: 2 states, no master copy
    assert m1.optimizer == n * 12 // 2 and m1.grads == m0.grads  # ZeRO-1: (2 states + fp32 master) / dp
    assert m3.params == m0.params // 2 and m3.grads == m0.grads // 2


def test_param_count_matches_the_built_model(cpu_host):
    from hydra.utils import instantiate

    from launcher.config import compose_config

    for recipe in ALL_RECIPES:
        small = ["model.rows_per_table=100"] if recipe == "wide_deep" else []
        model = instantiate(compose_config([f"recipe={recipe}", *small]).model)
        assert plan_of([f"recipe={recipe}", *small], cpu_host).memory.params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["precision=fp16"], r"precision=fp16 is not supported on CPU .* Set precision=bf16 or precision=fp32"),
        (["parallel.pipeline_stages=2", "zero.stage=2", "parallel.data_parallel=deepspeed"],
         r"parallel.data_parallel=deepspeed: DeepSpeed's engine runs the backward itself .* composes with neither "
         r"tensor parallel nor torch.distributed.pipelining \(parallel.pipeline_stages=2\)\. Set "
         r"parallel.data_parallel=auto \(it picks fsdp\)"),
        (["zero.stage=4"], r"zero.stage=4 must be 0, 1, 2 or 3"),
        (["optimizer.name=lamb"], r"optimizer.name=lamb is not one of sgd, momentum, adam, adamw"),
        (["optimizer.momentum=0.9"], r"optimizer.momentum=0.9: optimizer.name=adam \(torch.optim.Adam\) takes no "
                                     r"momentum, so the run would not read it; adam takes lr, betas, eps, weight_decay\. "
                                     r"Remove optimizer.momentum \(its default is 0.0\), or set optimizer.name to one "
                                     r"that takes it: momentum\."),
        (["optimizer.name=sgd", "optimizer.betas=[0.8,0.9]"], r"optimizer.betas=\[0.8, 0.9\]: optimizer.name=sgd .* "
                                                             r"sgd takes lr, weight_decay\. .* adam, adamw\."),
        (["optimizer.name=sgd", "optimizer.eps=1e-6"], r"optimizer.eps=1e-06: optimizer.name=sgd .* takes no eps"),
        (["optimizer.cpu_impl=deepspeed"], r"optimizer.cpu_impl=deepspeed chooses what steps the optimizer on the "
                                           r"host, and optimizer.target=device keeps it on the device, so nothing "
                                           r"would read it\. Set optimizer.target=CPU"),
        (["placement.pin_memory=true"], r"placement.pin_memory=true: pinned \(page-locked\) host memory .* this run is "
                                        r"on the CPU, where it would do nothing"),
        (["cluster.backend=nccl"], r"cluster.backend=nccl needs CUDA devices"),
        (["cluster.nproc_per_node=two"], r"cluster.nproc_per_node=two must be a positive integer or auto"),
        (["parallel.dp=3"], r"dp\(3\) \* pp\(1\) \* tp\(1\) = 3 != world_size 2 \(cluster.nnodes 1 × nproc_per_node 2\)\. Set parallel.dp=-1"),
        (["batch.global_size=10", "batch.micro_size=4"], r"global 10 != micro 4 × accum 1 × dp 2"),
        (["placement.offload_params=true"], r"placement.offload_params=true needs zero.stage=3 .* got zero.stage=0\. Set zero.stage=3"),
        (["model.rows_per_table=0"], r"model.rows_per_table=0 .* must be >= 1"),
    ],
)
def test_refused_with_key_value_and_fix(overrides, message, cpu_host):
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", *overrides], cpu_host)


def test_quickstart_data_must_cover_a_global_micro_batch(cpu_host):
    """Said once (the recipe's own check said it again in other words)."""
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=quickstart", "data.samples=8"], cpu_host)
    assert e.value.problems == ["the data has 8 training samples (data.samples=8), fewer than one global micro-batch "
                                "(batch.micro_size 16 × dp 2 = 32). Lower batch.global_size (or batch.micro_size), or "
                                "give more data (data.samples=32 or more)."]


def test_planning_imports_neither_torch_nor_deepspeed():
    code = (
        "import sys\n"
        "from launcher.config import compose_config\n"
        "from launcher.backends import BACKENDS\n"
        "from launcher.contract import Facts\n"
        "from launcher.parallel import RULES\n"
        "from launcher.plan import plan_launch, HostFacts\n"
        "from launcher.recipes import RECIPES\n"
        "for r in ('gpt', 'quickstart', 'wide_deep'):\n"
        "    facts = Facts(backends=tuple(BACKENDS.values()), parts=RULES, recipe=RECIPES[r])\n"
        "    plan_launch(compose_config([f'recipe={r}', 'zero.stage=2']), HostFacts('h', 2, 0, '/x'), facts)\n"
        "bad = [m for m in ('torch', 'deepspeed') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.lr=nan", r"optimizer.lr=nan must be a finite number > 0\."),
        ("optimizer.lr=inf", r"optimizer.lr=inf must be a finite number > 0\."),
        ("optimizer.momentum=-0.5", r"optimizer.momentum=-0.5 must be a finite number in \[0, 1\)\."),
        ("optimizer.momentum=1.5", r"optimizer.momentum=1.5 must be a finite number in \[0, 1\)\."),
        ("optimizer.eps=0", r"optimizer.eps=0.0 must be a finite number > 0\."),
        ("optimizer.betas=[0.9,1.0]", r"optimizer.betas\[1\]=1.0 must be a finite number in \[0, 1\)\."),
        ("tables.deep_embedding.lr=-1", r"tables.deep_embedding.lr=-1.0 must be a finite number > 0\."),
        ("tables.wide_embedding.lr_power=0.5", r"tables.wide_embedding.lr_power=0.5 must be a finite number <= 0\."),
        ("output.run_name=../elsewhere", r"output.run_name=../elsewhere must be one folder name inside output.log_dir"),
        ("output.run_name=a/b", r"output.run_name=a/b must be one folder name"),
        ("output.run_name=latest", r"output.run_name=latest must be one folder name"),
    ],
)
def test_hostile_numbers_and_names_are_refused(override, message, cpu_host):
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", override], cpu_host)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["recipe=quickstart", "model.hidden=0"], r"model.hidden=0 must be >= 1 \(a layer of width 0 trains nothing\)"),
        (["recipe=resnet", "model.width=0"], r"model.width=0 must be >= 1\."),
        (["recipe=wide_deep", "model.hidden=[256,0]"], r"model.hidden=\[256, 0\] .* must hold widths >= 1"),
        (["recipe=gpt", "model.width=0"], r"model.width=0 .* must be >= 1"),
    ],
)
def test_zero_width_layers_are_refused(overrides, message, cpu_host):
    with pytest.raises(ConfigError, match=message):
        plan_of(overrides, cpu_host)


def test_switching_the_optimizer_leaves_the_recipes_own_settings_aside(cpu_host):
    """quickstart's momentum 0.1 was for its momentum optimizer: optimizer.name=adam on the command line plans (the
    recipe's value stands aside); optimizer.momentum given with it is the user's and is refused."""
    plan = plan_of(["recipe=quickstart", "optimizer.name=adam"], cpu_host)
    assert plan.optimizer.name == "adam" and plan.optimizer.momentum == 0.0
    with pytest.raises(ConfigError, match=r"optimizer.momentum=0.5: optimizer.name=adam"):
        plan_of(["recipe=quickstart", "optimizer.name=adam", "optimizer.momentum=0.5"], cpu_host)


def test_debug_failure_keys_that_inject_nothing_are_reported(cpu_host):
    """debug.fail_step without debug.fail_rank (or the other way round), or after the last step, injects nothing: the
    plan says so (a sweep over debug.fail_rank=-1,1 keeps one fail_step, so it is a note, not a refusal)."""
    notes = lambda *o: [n for n in plan_of(["recipe=quickstart", "smoke=true", *o], cpu_host).notes  # noqa: E731
                        if n.startswith("debug.")]
    assert notes("debug.fail_step=5") == [
        "debug.fail_step=5: no failure is injected, as debug.fail_rank=-1 (a failure needs both: the rank and the step)"]
    assert notes("debug.fail_rank=0") == [
        "debug.fail_rank=0: no failure is injected, as debug.fail_step=-1 (a failure needs both: the rank and the step)"]
    assert notes("debug.fail_rank=0", "debug.fail_step=5") == [
        "debug.fail_step=5: no failure is injected, as the run ends at step 2"]
    assert notes("debug.fail_rank=0", "debug.fail_step=2") == notes() == []


def test_checkpoint_keys_without_effect_are_said(cpu_host):
    """trainer.checkpoint_dir with no checkpoint to hold, trainer.checkpoint_every past the last step, and smoke=true
    with checkpoints off (its note had said a checkpoint is written and read back): each said, none refused."""
    def said(*overrides):
        return [n for n in plan_of(["recipe=quickstart", *overrides], cpu_host).notes if "checkpoint" in n]

    assert said() == []
    assert said("trainer.checkpoint_every=-1", "trainer.checkpoint_dir=/tmp/hl-unused") == [
        "trainer.checkpoint_dir=/tmp/hl-unused with trainer.checkpoint_every=-1: no checkpoint is written, so nothing "
        "goes there"]
    assert said("trainer.steps=3", "trainer.checkpoint_every=100") == [
        "trainer.checkpoint_every=100 is past trainer.steps=3: the run's one checkpoint is the one at its end (as with "
        "trainer.checkpoint_every=0)"]
    assert "(no checkpoint: trainer.checkpoint_every=-1)" in said("smoke=true", "trainer.checkpoint_every=-1")[0]
    assert "(a checkpoint is written and read back)" in said("smoke=true")[0]
