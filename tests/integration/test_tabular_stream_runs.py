"""data=tabular over a directory of Criteo-shaped Parquet files (bench/criteo_parquet.py), streamed by row group on 2
ranks: a run that failed after step 8 (checkpoints every 4), resumed from step 4, logs the same per-step losses for
steps 5-8 as the failed run did: the resume lands mid shuffle window and crosses an epoch's end (5 micro-batches per
rank and epoch, windows of 3), found from the footers' row counts without replaying the stream. The resumed run then
evaluates the held-out row groups."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from criteo_parquet import write_criteo_parquet  # noqa: E402

from tests.conftest import read_summary, run_cli  # noqa: E402

pytestmark = pytest.mark.integration


def _losses(rank_dir) -> dict[int, float]:
    records = [json.loads(line) for line in (rank_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in records if "event" not in m}


def test_a_parquet_directory_trains_on_2_ranks_and_resumes_exactly(tmp_path):
    write_criteo_parquet(tmp_path / "clicks", 4000, group=500, groups_per_file=3)  # 8 row groups in 3 files
    common = ["recipe=wide_deep", "data=tabular", "data.path=clicks", "data.label=label", "data.positive=1",
              "data.hash_buckets=1000", "data.test_fraction=0.25", "data.shuffle_rows=768", "trainer.epochs=0",
              "trainer.steps=8", "trainer.checkpoint_every=4", "trainer.log_every=1", "cluster.nproc_per_node=2"]
    failed = run_cli([*common, "debug.fail_rank=1", "debug.fail_step=8"], tmp_path)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert "3,000 train rows in 6 row groups, 1,000 eval rows in 2" in " ".join(failed.stdout.split())
    before = (tmp_path / "log_output" / "latest").resolve()
    resumed = run_cli([*common, "trainer.resume=latest"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = (tmp_path / "log_output" / "latest").resolve()
    for rank in (0, 1):
        again, first = _losses(after / f"rank.{rank}"), _losses(before / f"rank.{rank}")
        assert sorted(again) == [5, 6, 7, 8] and all(again[s] == first[s] for s in again), (rank, again, first)
    s = read_summary(tmp_path)
    assert s["status"] == "ok" and s["eval"]["n"] == 1000 and 0 < s["eval"]["auc"] < 1
