"""Placement intents compile to per-table locations, ZeRO-Offload keys, and host/device accounting."""

import pytest

from launcher.errors import ConfigError
from tests.conftest import plan_of
from launcher.parallel import engine_config


def _tables(plan):
    return {t.name: t for t in plan.placement.tables}


def test_default_wide_deep_tables_are_sparse_on_the_device(cpu_host):
    plan = plan_of(["recipe=wide_deep"], cpu_host)
    t = _tables(plan)
    assert plan.placement.sparse_tables
    assert (t["deep_embedding"].optimizer, t["deep_embedding"].location) == ("lazy_adam", "device")
    assert (t["wide_embedding"].optimizer, t["wide_embedding"].location) == ("ftrl", "device")
    assert plan.memory.host.tables == 0 and plan.memory.device.tables > 0


def test_host_device_mix_puts_every_table_and_its_state_on_the_host(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.host_device_mix=1"], cpu_host)
    assert {t.location for t in plan.placement.tables} == {"host"}
    rows = 26 * 10_000
    assert plan.memory.host.tables == rows * (16 + 1) * 4
    assert plan.memory.host.table_states == 2 * plan.memory.host.tables  # lazy Adam 2 moments, FTRL n and z
    assert plan.memory.device.tables == 0 and plan.memory.device.params > 0  # dense network stays on the device
    assert plan.placement.optimizer_location == "device" and plan.engine == "ddp" and engine_config(plan) is None


def test_per_table_override(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.host_device_mix=1", "+placement.tables.wide_embedding=device"], cpu_host)
    t = _tables(plan)
    assert t["deep_embedding"].location == "host" and t["wide_embedding"].location == "device"


def test_unknown_table_gets_did_you_mean(cpu_host):
    with pytest.raises(ConfigError, match=r"placement.tables.deep_embeding: recipe wide_deep has no table deep_embeding\. Did you mean placement.tables.deep_embedding\?"):
        plan_of(["recipe=wide_deep", "+placement.tables.deep_embeding=host"], cpu_host)


def test_optimizer_on_cpu_offloads_and_picks_zero2(cpu_host):
    plan = plan_of(["recipe=wide_deep", "optimizer.target=CPU"], cpu_host)
    assert plan.zero_stage == 2 and any("zero.stage 0 -> 2" in n for n in plan.notes)
    z = engine_config(plan)["zero_optimization"]
    assert z == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    assert engine_config(plan)["zero_force_ds_cpu_optimizer"] is False  # torch's fused Adam steps the host partition
    assert plan.memory.host.optimizer > 0 and plan.memory.device.optimizer == 0
    assert plan.ds_ops == ("deepspeed_shm_comm",)


def test_deepspeed_cpu_adam_impl_needs_its_op(cpu_host):
    plan = plan_of(["recipe=wide_deep", "optimizer.target=CPU", "optimizer.cpu_impl=deepspeed", "zero.stage=1"], cpu_host)
    assert plan.zero_stage == 1 and "zero_force_ds_cpu_optimizer" not in engine_config(plan)
    assert "cpu_adam" in plan.ds_ops


def test_offload_params_with_zero3_bf16(cpu_host):
    plan = plan_of(["recipe=wide_deep", "zero.stage=3", "placement.offload_params=true", "precision=bf16"], cpu_host)
    z = engine_config(plan)["zero_optimization"]
    assert z["offload_param"] == {"device": "cpu", "pin_memory": False} and engine_config(plan)["bf16"] == {"enabled": True}
    assert plan.memory.host.params == -(-plan.memory.dense_params * 2 // 2)  # bf16 partition of dp=2
    assert plan.memory.device.params == 0


def test_a_table_field_its_optimizer_does_not_read_is_said(cpu_host):
    """tables.<name>.<field> set for an optimizer that has no such setting was ignored without a word (the dense
    optimizer's are refused: optimizer.*); a note, since switching a recipe's table to another optimizer leaves the
    recipe's fields behind, which the user never set."""
    def said(*overrides):
        return [n for n in plan_of(["recipe=wide_deep", *overrides], cpu_host).notes if "does not read" in n]

    assert said() == []
    assert said("tables.deep_embedding.l1=0.5") == [
        "tables.deep_embedding.l1=0.5: tables.deep_embedding.optimizer=lazy_adam does not read l1; it takes lr, betas, "
        "eps"]
    assert said("tables.deep_embedding.optimizer=sgd", "tables.deep_embedding.eps=0.1") == [
        "tables.deep_embedding.eps=0.1: tables.deep_embedding.optimizer=sgd does not read eps; it takes lr"]
    assert [n.split(":")[0] for n in said("tables.wide_embedding.optimizer=sgd")] == [
        "tables.wide_embedding.l1=1e-08", "tables.wide_embedding.l2=1e-08",
        "tables.wide_embedding.initial_accumulator=1.0"]


def test_placement_ps_that_moves_no_table_is_said(cpu_host):
    """placement.ps=true on a model without tables, or beside a placement.tables entry for every table, did nothing
    without a word (host_device_mix=1 had its note)."""
    def said(*overrides):
        return [n for n in plan_of(overrides, cpu_host).notes if n.startswith("placement.ps=true")]

    assert said("recipe=quickstart", "placement.ps=true") == [
        "placement.ps=true: recipe quickstart has no embedding tables; nothing moves to the host"]
    assert said("recipe=wide_deep", "placement.ps=true", "+placement.tables.deep_embedding=host",
                "+placement.tables.wide_embedding=device") == [
        "placement.ps=true: every table of recipe wide_deep has its own placement.tables entry, which it keeps; "
        "placement.ps=true moves none"]
    assert said("recipe=wide_deep", "placement.ps=true") == []


def test_pin_memory_auto_follows_cuda():
    from launcher.plan import HostFacts

    gpu = HostFacts(hostname="g", cpu_count=8, accelerators=2, extensions_dir="/x")
    plan = plan_of(["recipe=wide_deep", "optimizer.target=CPU"], gpu)
    assert engine_config(plan)["zero_optimization"]["offload_optimizer"]["pin_memory"] is True


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["tables.deep_embedding.optimizer=dense"], r"tables deep_embedding are dense and wide_embedding are sparse"),
        (["placement.mode=Auto"], r"placement.mode=Auto is not one of manual, auto. Did you mean placement.mode=auto\?"),
        (["placement.mode=automatic"], r"placement.mode=automatic is not one of manual, auto"),  # planned as manual
        (["tables.deep_embedding.optimizer=adadelta"], r"tables.deep_embedding.optimizer=adadelta is not one of lazy_adam, sparse_adam, ftrl, sgd, momentum, adagrad, rowwise_adagrad, dense"),
        (["+placement.tables.deep_embedding=gpu"], r"placement.tables.deep_embedding=gpu must be host, device or ps"),
        (["tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense", "placement.host_device_mix=1"],
         r"placement.host_device_mix=1 needs sparse tables"),
        (["optimizer.target=CPU", "optimizer.cpu_impl=deepspeed", "optimizer.name=momentum"],
         r"optimizer.cpu_impl=deepspeed runs DeepSpeedCPUAdam, which needs optimizer.name=adam or adamw"),
        (["zero.stage=2", "placement.offload_params=true"], r"placement.offload_params=true needs zero.stage=3"),
        (["tables.wide_embedding.lr_power=0.5"], r"tables.wide_embedding.lr_power=0.5 must be a finite number <= 0"),
        (["optimizer.target=GPU"], r"optimizer.target=GPU must be device or CPU"),
    ],
)
def test_placement_refusals(overrides, message, cpu_host):
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", *overrides], cpu_host)


def test_dense_tables_train_inside_the_engine(cpu_host):
    plan = plan_of(["recipe=wide_deep", "tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense"], cpu_host)
    assert not plan.placement.sparse_tables and {t.location for t in plan.placement.tables} == {"engine"}
    assert plan.placement.dense_params == plan.memory.params
