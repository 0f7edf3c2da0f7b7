"""Parameter-server mode (placement.ps=true) in launched runs of wide_deep, against replicated host tables
(placement.host_device_mix=1) at the same global batch: the same loss every step on 2 and on 4 ranks (fp32, 1e-5
relative), each rank holding 1/world of the tables' bytes, and a checkpoint saved on 4 ranks resumed on 2 giving the
losses the 4 ranks went on with (1e-6), as does a checkpoint of the replicated run resumed on 4 sharded ranks. Tables
built by blocks (placement.ps_init=blocks: never whole) start alike on 2 and 4 ranks and train alike. Seven runs
share the assertions."""

import json
import os
import shutil

import pytest

from launcher.cli import main
from tests.conftest import run_cli
from tests.integration.test_resume import FAIL_AFTER_STEP_8, STEPS, _assert_same, _losses

pytestmark = pytest.mark.integration

COMMON = ["recipe=wide_deep", "smoke=true", "model.rows_per_table=1000", *STEPS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ps")
    jobs = {
        "replicated": ["placement.host_device_mix=1", "cluster.nproc_per_node=2"],
        "ps2": ["placement.ps=true", "cluster.nproc_per_node=2"],
        "ps4": ["placement.ps=true", "cluster.nproc_per_node=4", *FAIL_AFTER_STEP_8],
        "resumed": ["placement.ps=true", "cluster.nproc_per_node=2", "trainer.resume=log_output/ps4"],
        "from_replicated": ["placement.ps=true", "cluster.nproc_per_node=4",
                            "trainer.resume_from=log_output/replicated/checkpoints/step4"],
        "blocks2": ["placement.ps=true", "placement.ps_init=blocks", "cluster.nproc_per_node=2"],
        "blocks4": ["placement.ps=true", "placement.ps_init=blocks", "cluster.nproc_per_node=4"],
    }
    for name, extra in jobs.items():
        res = run_cli([*COMMON, *extra, f"output.run_name={name}"], cwd)
        assert res.returncode == (1 if name == "ps4" else 0), res.stdout[-3000:] + res.stderr[-3000:]
    return cwd / "log_output"


def _table_bytes(run_dir, rank: int) -> int:
    host = json.loads((run_dir / f"rank.{rank}" / "memory.json").read_text())["host"]
    return host["tables"] + host["table_states"]


def _relative(a: dict[int, float], b: dict[int, float]) -> float:
    assert sorted(a) == sorted(b) == list(range(1, 9))
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def test_sharded_tables_give_the_losses_of_replicated_ones_on_2_and_4_ranks(runs):
    replicated = _losses(runs / "replicated" / "rank.0")
    for name in ("ps2", "ps4"):
        worst = _relative(_losses(runs / name / "rank.0"), replicated)
        print(f"{name} vs replicated, steps 1-8: worst relative difference {worst:.2e}")
        assert worst <= 1e-5


def test_each_rank_holds_its_share_of_the_tables(runs):
    whole = _table_bytes(runs / "replicated", 0)
    for name, world in (("ps2", 2), ("ps4", 4)):
        plan = json.loads((runs / name / "plan.json").read_text())
        assert {t["name"]: t["shards"] for t in plan["placement"]["tables"]} == {
            "deep_embedding": world, "wide_embedding": world}
        for rank in range(world):
            assert _table_bytes(runs / name, rank) == pytest.approx(whole / world, rel=0.1)


def test_a_checkpoint_of_4_ranks_resumes_on_2(runs):
    plan = json.loads((runs / "resumed" / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["resume_from"].endswith("ps4/checkpoints/step4")
    _assert_same(_losses(runs / "resumed" / "rank.0"), _losses(runs / "ps4" / "rank.0"))


def test_a_checkpoint_of_replicated_tables_resumes_with_sharded_ones(runs):
    """DCP saved the replicated run's whole tables; the 4 sharded ranks each read their block of them."""
    _assert_same(_losses(runs / "from_replicated" / "rank.0"), _losses(runs / "replicated" / "rank.0"))


def test_tables_built_by_blocks_train_alike_on_2_and_4_ranks(runs):
    plans = [json.loads((runs / n / "plan.json").read_text()) for n in ("blocks2", "blocks4", "ps2")]
    assert [{t["built"] for t in p["placement"]["tables"]} for p in plans] == [{"blocks"}, {"blocks"}, {"whole"}]
    two, four = _losses(runs / "blocks2" / "rank.0"), _losses(runs / "blocks4" / "rank.0")
    worst = _relative(four, two)
    print(f"blocks on 4 vs 2 ranks, steps 1-8: worst relative difference {worst:.2e}")
    assert worst <= 1e-5
    assert _table_bytes(runs / "blocks4", 3) == pytest.approx(_table_bytes(runs / "replicated", 0) / 4, rel=0.1)


def test_a_damaged_ps_shard_is_found_before_a_resume(runs, tmp_path, capsys):
    """One owner's shard of the split tables truncated (a crash or a full disk during its save): the resume is refused
    before any rank starts, naming the file, as for replicated tables (issue 35)."""
    ckpt = runs / "ps4" / "checkpoints" / "step4"
    shards = sorted(p.name for p in (ckpt / "tables").glob("*.distcp"))
    assert len(shards) == 4, shards  # each of the 4 owners wrote its own rows
    copy = tmp_path / "ps4"
    shutil.copytree(runs / "ps4" / "checkpoints", copy / "checkpoints")
    shutil.copy(runs / "ps4" / "plan.json", copy / "plan.json")
    victim = copy / "checkpoints" / "step4" / "tables" / shards[2]
    size = victim.stat().st_size
    os.truncate(victim, size // 2)
    logs = tmp_path / "refused"
    code = main([*COMMON, "placement.ps=true", "cluster.nproc_per_node=2", f"trainer.resume={copy}",
                 f"output.log_dir={logs}"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"is damaged: tables/{shards[2]} is truncated" in err and f"{size} bytes expected" in err, err
    assert not logs.exists()
