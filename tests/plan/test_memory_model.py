"""The memory model, the budgets and placement=auto, on plans (no process started): what each term counts, where a
plan over its budget is refused and with which numbers, and what auto chooses when the default does not fit."""

import re

import pytest

from launcher import constants as C

from launcher.errors import ConfigError
from launcher.plan import LaunchPlan
from launcher.plan.budget import GB, Budget, check_fit
from launcher.plan.peak import MemoryPlan
from launcher.units import Term
from tests.conftest import plan_of


def _terms(plan) -> dict[str, Term]:
    return {t.name: t for t in plan.peak.terms}


def test_a_peak_is_what_is_always_held_plus_the_largest_phase():
    mem = MemoryPlan(terms=(Term("a", "device", 100), Term("act", "device", 30, phase="backward"),
                            Term("tmp", "device", 50, phase="step"), Term("grad", "device", 10, phase="step"),
                            Term("rt", "host", 7)), device_type="cuda", nproc_per_node=4, launcher=5)
    assert mem.peak("device") == 100 + 60 and mem.peak("host") == 7
    assert mem.rank_peak == 7 and mem.host_total == 4 * 7 + 5  # a GPU host holds its ranks' host bytes
    cpu = MemoryPlan(terms=mem.terms, device_type="cpu", nproc_per_node=4, launcher=5)
    assert cpu.rank_peak == 167 and cpu.host_total == 4 * 167 + 5  # one memory on a CPU host


def test_wide_deep_terms_count_each_table_and_its_states_exactly(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.host_device_mix=1"], cpu_host)
    t = _terms(plan)
    rows = 26 * 10_000
    assert (t["deep_embedding table"].bytes, t["deep_embedding table"].where) == (rows * 16 * 4, "host")
    assert t["deep_embedding states"].bytes == 2 * rows * 16 * 4  # lazy Adam's two moments
    assert t["wide_embedding states"].bytes == 2 * rows * 4  # FTRL's n and z
    # ranks on CPU start warm by default: a warm rank's runtime, and the forkserver counted on the host
    assert t["runtime"].basis == "constant" and t["runtime"].bytes == C.WARM_RANK_RUNTIME.value < C.RANK_RUNTIME.value
    assert t["ddp buckets"].bytes == plan.memory.device.grads  # torch DDP: a flat copy of every gradient
    assert plan.peak.forkserver == C.FORKSERVER_RUNTIME.value
    assert plan.peak.host_total == 2 * plan.peak.rank_peak + plan.peak.launcher + plan.peak.forkserver
    cold = plan_of(["recipe=wide_deep", "placement.host_device_mix=1", "launcher.warm_start=false"], cpu_host)
    assert _terms(cold)["runtime"].source == C.RANK_RUNTIME.source and "bench/memory_constants.py" in C.RANK_RUNTIME.source
    assert cold.peak.forkserver == 0 and cold.peak.host_total == 2 * cold.peak.rank_peak + cold.peak.launcher
    assert LaunchPlan.from_dict(plan.to_dict()).peak == plan.peak  # plan.json round trip


def test_activations_are_traced_with_auto_and_follow_recompute(cpu_host):
    plain = plan_of(["recipe=gpt", "recompute=[]", "placement=auto"], cpu_host)
    assert _terms(plain)["activations"].basis == "traced"
    kept = plan_of(["recipe=gpt", "recompute=[all]"], cpu_host)
    assert _terms(kept)["activations"].bytes == kept.activations["kept_bytes_with_recompute"]
    assert _terms(kept)["activations"].bytes < kept.activations["kept_bytes"]


def test_a_plan_over_the_device_capacity_is_refused_with_numbers(cpu_host):
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=wide_deep", "cluster.device_memory_gb=0.03"], cpu_host)
    msg = str(e.value)
    assert "memory: this plan needs" in msg and "of device memory per device, has 30.0 MB" in msg
    assert "placement=auto searches for a placement that fits" in msg
    fix = re.search(r"cluster.device_memory_gb=([0-9.]+) or more \(this plan's ([0-9.]+) MB\)", msg)
    assert fix, msg  # a value to type, rounded up: the size as shown (rounded down) had been refused again
    plan_of(["recipe=wide_deep", f"cluster.device_memory_gb={fix.group(1)}"], cpu_host)


def test_a_plan_over_the_host_capacity_names_how_many_ranks_a_host_holds(cpu_host):
    with pytest.raises(ConfigError, match=r"of host memory per host, has 800.0 MB.*cluster.nproc_per_node=1 \(a host "
                                          r"holds 1 rank\(s\) of"):
        plan_of(["recipe=wide_deep", "cluster.host_memory_gb=0.8"], cpu_host)


def test_over_the_budget_within_the_capacity_is_said_not_refused():
    mem = MemoryPlan(terms=(Term("x", "device", 95),), device_type="cuda", nproc_per_node=1, launcher=0)
    problems, notes = check_fit(mem, Budget(device=100, host=0, reserve=0.1, device_source="", host_source=""), True)
    assert problems == [] and "over its budget, within its capacity" in notes[0]


def test_auto_moves_the_big_table_to_the_host_when_the_device_budget_is_short(cpu_host):
    default = ["recipe=wide_deep", "cluster.device_memory_gb=0.03"]
    plan = plan_of([*default, "placement=auto"], cpu_host)
    where = {t.name: t.location for t in plan.placement.tables}
    assert where == {"deep_embedding": "host", "wide_embedding": "device"}
    assert plan.peak.peak("device") <= plan.budget.device_usable
    assert plan.auto["placement.tables"] == where and plan.auto["zero.stage"] == 0
    assert any(d.startswith("deep_embedding -> host: on the device it needs 49.9 MB (weights and states); the device "
                            "budget 27.0 MB keeps") for d in plan.decisions)
    assert any(d.startswith("runner-up: ") for d in plan.decisions)
    assert plan_of([*default, "placement=auto"], cpu_host).decisions == plan.decisions  # deterministic


def test_auto_with_room_changes_nothing(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement=auto"], cpu_host)
    assert {t.location for t in plan.placement.tables} == {"device"} and plan.engine == "ddp" and not plan.recompute


def test_auto_shards_or_offloads_the_dense_part_when_only_that_fits(cpu_host):
    base = plan_of(["recipe=gpt", "placement=auto"], cpu_host)
    need = base.peak.peak("device")
    plan = plan_of(["recipe=gpt", "placement=auto", f"cluster.device_memory_gb={need * 0.8 / 0.9 / GB}"], cpu_host)
    assert plan.peak.peak("device") <= plan.budget.device_usable < need
    assert plan.zero_stage > 0 or plan.placement.offload or plan.recompute


def test_auto_reports_a_cpu_impl_it_did_not_use_and_refuses_one_that_cannot_run(cpu_host):
    """optimizer.cpu_impl=deepspeed says what steps the optimizer if auto moves it to the host: where auto keeps it on
    the device, a note says the key was not used; with an optimizer DeepSpeedCPUAdam cannot run, it is refused
    whatever auto would choose (it could never apply)."""
    need = plan_of(["recipe=gpt", "placement=auto"], cpu_host).peak.peak("device")
    ds = ["recipe=gpt", "placement=auto", "optimizer.cpu_impl=deepspeed"]
    for share, where in ((1.0, "device"), (0.15, "host")):
        plan = plan_of([*ds, f"cluster.device_memory_gb={need * share / 0.9 / GB}"], cpu_host)
        assert plan.placement.optimizer_location == where
        unused = [n for n in plan.notes if n.startswith("optimizer.cpu_impl=deepspeed is not used")]
        assert len(unused) == (where == "device"), plan.notes
    # the choice is told at the stage the parts run: a CPU optimizer asked with ZeRO-0 runs ZeRO-2
    assert plan.zero_stage == 2 and plan.auto["zero.stage"] == 2 and "zero.stage=2; optimizer.target=CPU" in plan.notes[0]
    assert plan.decisions[0].startswith("dense: zero.stage=2 (deepspeed), optimizer on the host"), plan.decisions
    with pytest.raises(ConfigError, match="DeepSpeedCPUAdam, which needs optimizer.name=adam or adamw; got "
                                          "optimizer.name=sgd"):
        plan_of([*ds, "optimizer.name=sgd"], cpu_host)


def test_auto_when_nothing_fits_exits_with_fixes_that_carry_numbers(cpu_host):
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=wide_deep", "placement=auto", "cluster.host_memory_gb=0.8"], cpu_host)
    msg = str(e.value)
    assert "placement=auto: nothing fits. The closest layout" in msg
    assert "of host memory per host, has 800.0 MB (10% kept free: 720.0 MB)" in msg
    assert ("so a host holds 1: cluster.nproc_per_node=1, the same 2 ranks over more hosts (cluster.nnodes): with "
            "fewer ranks the tables split over fewer, and each rank needs more") in msg
    assert "the largest terms are runtime" in msg
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=wide_deep", "placement=auto", "cluster.host_memory_gb=0.5"], cpu_host)
    fix = re.search(r"each rank needs .* MB of host memory and the launcher and its forkserver 271.6 MB: "
                    r"cluster.host_memory_gb=([0-9.]+) runs one rank a host, cluster.nproc_per_node=1, the same 2 "
                    r"ranks over more hosts", str(e.value))
    assert fix, str(e.value)  # followed whole (2 hosts of one rank each), it plans: said as a value to type, rounded up
    plan_of(["recipe=wide_deep", "placement=auto", f"cluster.host_memory_gb={fix.group(1)}", "cluster.nproc_per_node=1",
             "cluster.launch=elastic", "cluster.nnodes=2", "cluster.rdzv_endpoint=127.0.0.1:29400"], cpu_host)


def test_auto_keeps_what_the_user_set(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement=auto", "zero.stage=1", "placement.host_device_mix=1"], cpu_host)
    assert plan.zero_stage == 1 and {t.location for t in plan.placement.tables} == {"host"}
    assert any(d.startswith("kept where you placed them") for d in plan.decisions)
