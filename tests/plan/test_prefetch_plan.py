"""placement.prefetch in the plan (no process started): auto gathers host tables one micro-batch ahead on CPU ranks,
a value is refused with its key and a fix when it is no depth or would do nothing, and the plan says how each
table is looked up and why."""

import pytest
from rich.console import Console

from launcher.errors import ConfigError
from launcher.plan import HostFacts
from launcher.plan.parallel import ParallelDims
from launcher.plan.prefetch import why_not
from launcher.report.plan_view import plan_tree
from tests.conftest import plan_of

HOST = ["recipe=wide_deep", "placement.host_device_mix=1"]
GPU = HostFacts(hostname="g", cpu_count=8, accelerators=2, extensions_dir="/x")


def _text(plan) -> str:
    console = Console(width=400, record=True)
    console.print(plan_tree(plan))
    return console.export_text()


def test_a_depth_prefetches_host_tables_and_auto_stays_off_saying_why(cpu_host):
    plan = plan_of([*HOST, "placement.prefetch=1"], cpu_host)
    assert plan.placement.prefetch == 1
    assert ("table lookups: deep_embedding, wide_embedding: rows gathered 1 micro-batch ahead on a background "
            "thread (placement.prefetch=1)") in _text(plan)
    assert plan_of([*HOST, "placement.prefetch=3"], cpu_host).placement.prefetch == 3
    auto = plan_of(HOST, cpu_host)  # measured nowhere to win yet: off, with the measurement
    assert auto.placement.prefetch == 0 and "placement.prefetch=auto is 0 on CPU ranks: measured no faster here" in _text(
        auto)
    serial = plan_of([*HOST, "placement.prefetch=0"], cpu_host)
    assert serial.placement.prefetch == 0 and "table lookups: when the forward asks (placement.prefetch=0)" in _text(
        serial)
    assert [t.name for t in plan.peak.terms if "prefetch" in t.name or "deferred" in t.name] == [
        "deep_embedding prefetch", "deep_embedding deferred writes", "wide_embedding prefetch",
        "wide_embedding deferred writes"]  # the queued rows and the writes kept past the step, in the memory model
    assert not [t for t in serial.peak.terms if "prefetch" in t.name]


def test_a_host_table_beside_ps_and_device_tables_is_prefetched_alone(cpu_host):
    plan = plan_of(["recipe=wide_deep", "+placement.tables.deep_embedding=host",
                    "+placement.tables.wide_embedding=ps", "placement.prefetch=1"], cpu_host)
    assert plan.placement.prefetch == 1
    assert plan.placement.prefetch_words.startswith("deep_embedding: rows gathered")
    assert plan.placement.prefetch_words.endswith("; wide_embedding when the forward asks")


@pytest.mark.parametrize("overrides,why", [
    (["placement.ps=true"], "no table of this run has a copy on each rank's host"),
    (["recipe=wide_deep"], "no table of this run has a copy on each rank's host"),
    ([*HOST, "zero.stage=3"], "FSDP2 sharding over 2 ranks gathers parameters in the forward"),
])
def test_where_prefetch_cannot_apply_auto_is_off_with_the_reason_and_a_depth_is_refused(overrides, why, cpu_host):
    overrides = overrides if overrides[0].startswith("recipe=") else ["recipe=wide_deep", *overrides]
    plan = plan_of(overrides, cpu_host)
    assert plan.placement.prefetch == 0 and why in plan.placement.prefetch_words
    with pytest.raises(ConfigError, match=rf"placement.prefetch=2 would do nothing: {why}.*Set placement.prefetch=0"):
        plan_of([*overrides, "placement.prefetch=2"], cpu_host)


def test_auto_is_off_on_cuda_until_it_has_run_there_and_one_turns_it_on():
    plan = plan_of([*HOST, "cluster.device=cuda"], GPU)
    assert plan.placement.prefetch == 0 and "has not run on a GPU yet" in plan.placement.prefetch_words
    assert plan_of([*HOST, "cluster.device=cuda", "placement.prefetch=1"], GPU).placement.prefetch == 1


@pytest.mark.parametrize("value", ["-1", "9", "1.5", "true", "null", "abc", "[1]"])
def test_a_value_that_is_no_depth_is_refused_with_the_key_and_the_fix(value, cpu_host):
    with pytest.raises(ConfigError, match=r"placement.prefetch=.* must be auto, 0 .* 1 to 8 .*Set placement.prefetch"):
        plan_of([*HOST, f"placement.prefetch={value}"], cpu_host)


def test_pipeline_stages_tensor_parallel_and_zero3_say_why_they_are_not_prefetched(cpu_host):
    placement = plan_of(HOST, cpu_host).placement
    assert why_not(placement, ParallelDims(dp=1, pp=2, tp=1, world_size=2), 0).startswith(
        "the run has 2 pipeline stages: the schedule runs a step's micro-batches itself")
    assert why_not(placement, ParallelDims(dp=1, pp=1, tp=2, world_size=2), 0).startswith(
        "tensor parallel (parallel.tp=2) gathers parameters in the forward")
    assert why_not(placement, ParallelDims(dp=2, pp=1, tp=1, world_size=2), 3).startswith("ZeRO-3 gathers")
    assert why_not(placement, ParallelDims(dp=2, pp=1, tp=1, world_size=2), 2) == ""


def test_where_fbgemm_is_installed_the_plan_says_why_its_optimizers_tables_stay_on_the_store_kernels(cpu_host):
    """HostFacts.table_fbgemm (launcher.native.fbgemm_choice) is said for the tables whose optimizer FBGEMM also has
    (the registry's ``fbgemm``), and only where it is installed."""
    import dataclasses

    from launcher import native

    why = "fbgemm_gpu 9.9 installed, not used: measured slower"
    host = dataclasses.replace(cpu_host, table_kernels="C kernels (cc)", table_fbgemm=why)
    both = plan_of([*HOST, "tables.deep_embedding.optimizer=rowwise_adagrad", "tables.wide_embedding.optimizer=sgd"],
                   host).placement.kernels_words
    assert both.endswith(f"on C kernels (cc); deep_embedding, wide_embedding: {why}")
    one = plan_of([*HOST, "tables.deep_embedding.optimizer=adagrad"], host).placement.kernels_words  # wide: ftrl
    assert one.endswith(f"; deep_embedding: {why}")
    assert why not in plan_of(HOST, host).placement.kernels_words  # lazy Adam and FTRL: FBGEMM has neither
    assert why not in plan_of([*HOST, "tables.wide_embedding.optimizer=sgd"], dataclasses.replace(
        host, table_fbgemm="")).placement.kernels_words
    installed = native.fbgemm_choice()  # this host's own answer: said where the package is, and nothing else
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or a build that does not load next to this torch
        assert installed == "" or installed.startswith("fbgemm_gpu ")
    else:
        assert installed.startswith("fbgemm_gpu ") and "not used" in installed
