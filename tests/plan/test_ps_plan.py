"""Parameter-server mode in the plan (no process started): placement.ps / placement.tables.<name>=ps split a table's
rows over the ranks of its pipeline stage, the memory model counts one block per rank (one copy per job), the
refusals name the key and the fix, and placement=auto splits the tables when a copy per rank does not fit a host."""

import pytest
from rich.console import Console

from launcher.errors import ConfigError
from launcher.plan import LaunchPlan
from launcher.plan.placement import plan_tables, takes_tables_out
from launcher.plan.ps import rows_per_rank
from launcher.report.plan_view import placement_table
from launcher.schema import TableConfig
from tests.conftest import plan_of

ROWS = 26 * 10_000  # wide_deep's default: 26 fields × 10,000 rows, one table of each kind
BIG = ["recipe=wide_deep", "cluster.device=cuda", "cluster.launch=elastic", "cluster.rdzv_endpoint=node0:29400",
       "cluster.nnodes=4", "cluster.nproc_per_node=8", "cluster.device_memory_gb=80", "cluster.host_memory_gb=1024",
       "model.rows_per_table=37500000", "model.embed_dim=256"]
"""docs/placement.md's ~1 TB of tables (issue 22): 975 M rows × 256 for deep_embedding, a copy per rank needs 3 TB."""


def _tables(plan):
    return {t.name: t for t in plan.placement.tables}


def _terms(plan):
    return {t.name: t for t in plan.peak.terms}


@pytest.mark.parametrize("ranks", [2, 4])
def test_ps_splits_every_table_over_the_ranks_and_counts_one_block_per_rank(ranks, cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.ps=true", f"cluster.nproc_per_node={ranks}"], cpu_host)
    deep, wide = _tables(plan)["deep_embedding"], _tables(plan)["wide_embedding"]
    assert (deep.location, deep.shards, wide.location, wide.shards) == ("host", ranks, "host", ranks)
    block = -(-ROWS // ranks)
    assert rows_per_rank(deep) == block
    assert plan.memory.host.tables == block * (16 + 1) * 4 and plan.memory.device.tables == 0
    assert plan.memory.host.table_states == 2 * plan.memory.host.tables  # lazy Adam's m and v, FTRL's n and z
    whole = ROWS * (16 + 1) * 4
    assert abs(plan.memory.host.tables * ranks - whole) <= ranks * 17 * 4  # ≈ total / world: one copy per job
    t = _terms(plan)
    assert t["deep_embedding table"].bytes == block * 16 * 4
    assert t["deep_embedding table"].source.startswith(f"ps: 1/{ranks} of 260,000 × 16 fp32")
    assert t["deep_embedding exchange"].where == "host" and t["deep_embedding exchange"].phase == "step"
    assert LaunchPlan.from_dict(plan.to_dict()).placement == plan.placement  # plan.json keeps the shards


def test_a_replicated_table_beside_a_ps_one(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.ps=true", "+placement.tables.wide_embedding=host"], cpu_host)
    t = _tables(plan)
    assert (t["deep_embedding"].shards, t["wide_embedding"].shards) == (2, 1)
    assert t["wide_embedding"].location == "host"
    named = plan_of(["recipe=wide_deep", "+placement.tables.deep_embedding=ps"], cpu_host)
    t = _tables(named)
    assert (t["deep_embedding"].location, t["deep_embedding"].shards) == ("host", 2)
    assert (t["wide_embedding"].location, t["wide_embedding"].shards) == ("device", 1)


def test_with_pipeline_stages_a_table_is_split_over_its_stage(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.ps=true", "cluster.nproc_per_node=4", "parallel.pipeline_stages=2",
                    "batch.micro_batches=2"], cpu_host)
    assert {t.shards for t in plan.placement.tables} == {2}


def test_on_one_rank_ps_is_a_whole_copy_and_says_so(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.ps=true", "cluster.nproc_per_node=1"], cpu_host)
    assert {(t.location, t.shards) for t in plan.placement.tables} == {("host", 1)}
    assert any("on a group of 1 rank" in n and "holds every row anyway" in n for n in plan.notes)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["placement.ps=true", "tables.deep_embedding.optimizer=dense", "tables.wide_embedding.optimizer=dense"],
         r"placement.ps=true splits each table's rows over the ranks, which needs sparse tables \(lazy_adam or ftrl\); "
         r"the tables are dense. Set tables.<name>.optimizer=lazy_adam, or placement.ps=false."),
        (["+placement.tables.deep_embedding=ps", "tables.deep_embedding.optimizer=dense",
          "tables.wide_embedding.optimizer=dense"],
         r"placement.tables.deep_embedding=ps with tables.deep_embedding.optimizer=dense: a dense table trains inside "
         r"the engine on the device. Set tables.deep_embedding.optimizer=lazy_adam \(or ftrl\) to split its rows"),
        (["placement.ps=true", "tables.deep_embedding.optimizer=sparse_adam"],
         r"placement.ps=true with tables.deep_embedding.optimizer=sparse_adam: the table store cannot split torch's "
         r"SparseAdam state over the ranks .* Set tables.deep_embedding.optimizer=lazy_adam: the same update"),
        (["+placement.tables.deep_embedding=ps", "tables.deep_embedding.optimizer=sparse_adam"],
         r"placement.tables.deep_embedding=ps with tables.deep_embedding.optimizer=sparse_adam"),
        (["+placement.tables.deep_embedding=pss"],
         r"placement.tables.deep_embedding=pss must be host, device or ps \(rows split over the ranks' host memory\)\. "
         r"Did you mean placement.tables.deep_embedding=ps\?"),
    ],
)
def test_ps_refusals(overrides, message, cpu_host):
    with pytest.raises(ConfigError, match=message):
        plan_of(["recipe=wide_deep", *overrides], cpu_host)


def test_runtime_prepare_splits_over_its_world():
    """runtime.prepare() plans a script's live tables with its world size as the group."""
    assert takes_tables_out(0, {}, {}, ps=True) and not takes_tables_out(0, {}, {})
    tables, problems, _ = plan_tables({"emb": (10, 4)}, {}, {}, 0, TableConfig(), "the model", ps=True, group_size=4)
    assert problems == [] and (tables[0].location, tables[0].shards, rows_per_rank(tables[0])) == ("host", 4, 3)


def test_the_dry_run_shows_each_tables_partition(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.ps=true", "+placement.tables.wide_embedding=host"], cpu_host)
    console = Console(width=250, record=True)
    console.print(placement_table(plan))
    text = console.export_text()
    assert "host (ps)" in text
    assert "ps: rows split over 2 ranks, 130,000 rows = 8.3 MB (+ states 16.6 MB) per rank, 49.9 MB per host" in text
    assert "a copy per rank: 1.0 MB (+ states 2.1 MB) per rank, 6.2 MB per host" in text


def test_a_host_over_its_capacity_with_copies_per_rank_names_ps(cpu_host):
    with pytest.raises(ConfigError, match=r"of host memory per host.*placement.ps=true \(each table's rows split "
                                          r"over 32 ranks: one copy per job instead of one per rank, [0-9.]+ [GT]B less "
                                          r"a host\)"):
        plan_of([*BIG, "placement.host_device_mix=1", "dry_run=true"], cpu_host)


def test_ps_is_not_offered_when_it_saves_less_than_the_host_lacks(cpu_host):
    """wide_deep's tables split over 2 ranks save ~50 MB a host, and a host of 0.5 GB lacks ~590 MB: placement.ps=true
    had been offered, and was refused next."""
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=wide_deep", "cluster.host_memory_gb=0.5"], cpu_host)
    assert "placement.ps=true" not in str(e.value) and "cluster.host_memory_gb=" in str(e.value), str(e.value)


def test_ps_makes_a_terabyte_of_tables_fit(cpu_host):
    plan = plan_of([*BIG, "placement.ps=true", "dry_run=true"], cpu_host)
    assert {t.shards for t in plan.placement.tables} == {32}
    assert plan.peak.host_total <= plan.budget.host_usable


def test_auto_splits_the_tables_a_host_cannot_copy_per_rank(cpu_host):
    plan = plan_of([*BIG, "placement=auto", "dry_run=true"], cpu_host)
    deep = _tables(plan)["deep_embedding"]
    assert (deep.location, deep.shards) == ("host", 32)
    assert plan.auto["placement.tables"]["deep_embedding"] == "ps"
    assert plan.peak.host_total <= plan.budget.host_usable and plan.peak.peak("device") <= plan.budget.device_usable
    assert any(d.startswith("deep_embedding -> ps, rows split over 32 ranks: a copy per rank needs 23.96 TB per host "
                            "(8 ranks × 3.00 TB, weights and states), the host budget is 921.60 GB; split, a rank "
                            "holds 93.60 GB") and "Runner-up: a copy per rank on the host" in d for d in plan.decisions)
    assert any("split over the ranks (ps)" in n for n in plan.notes)


def test_auto_keeps_a_table_you_placed_whole(cpu_host):
    with pytest.raises(ConfigError, match=r"placement=auto: nothing fits"):
        plan_of([*BIG, "placement=auto", "dry_run=true", "+placement.tables.deep_embedding=host"], cpu_host)


def test_auto_leaves_small_tables_whole(cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement=auto"], cpu_host)
    assert {t.shards for t in plan.placement.tables} == {1}


def test_auto_names_the_hosts_that_would_hold_the_split_tables(cpu_host):
    with pytest.raises(ConfigError, match=r"split over the ranks: 1\).*the tables split over the ranks \(ps\) hold "
                                          r"3.00 TB in all; .* so 12 hosts of 8 ranks hold them \(cluster.nnodes=12\)"):
        plan_of([*BIG, "placement=auto", "dry_run=true", "cluster.host_memory_gb=300"], cpu_host)


def test_a_ps_tables_rows_cross_the_network_in_the_step_time():
    from launcher.plan.cost import CostInput, step_time

    c = CostInput(device_type="cuda", dense_params=10**6, dp=32, nnodes=4, samples=64, state_floats=2,
                  tables=(("emb", 256, 26.0, 2),), group=32)
    host = step_time(c, 0, False, False, False, ("emb",))
    assert step_time(c, 0, False, False, False, ("emb",), ("emb",)) > host
