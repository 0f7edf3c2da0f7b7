"""trainer.grad_clip clips the same global gradient norm on every data-parallel part: torch DDP, FSDP2 (DTensor
shards), DeepSpeed ZeRO-0 (its gradient_clipping) and ZeRO-2 with CPU offload brought as a DeepSpeedExamples-style
ds_config.json (deepspeed.config=), a 2-stage pipeline with gpt's tied head and tensor parallel, each against one
process. The clip bites: the logged norm before clipping is above it at every step."""

import json
from pathlib import Path

import pytest

from tests.integration.test_engines import assert_close, losses, parts, run

pytestmark = pytest.mark.integration

CLIP = 0.05
GPT = ["recipe=gpt", "smoke=true", "trainer.steps=4", "trainer.log_every=1", "trainer.checkpoint_every=-1",
       "eval.batches=0"]

DS_CONFIG = {  # as DeepSpeedExamples writes them (ZeRO-2, CPU offload with pinned memory, clipping, buckets)
    "train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 2000,
    "gradient_clipping": CLIP,
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
    "wall_clock_breakdown": False,
}


def norms(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["grad_norm"] for r in records if "event" not in r and "grad_norm" in r}


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    return run(tmp_path_factory.mktemp("clip"), "one", [*GPT, "cluster.nproc_per_node=1", f"trainer.grad_clip={CLIP}"])


def test_the_clip_bites_in_one_process(one):
    n = norms(one)
    assert sorted(n) == [1, 2, 3, 4] and min(n.values()) > 2 * CLIP, n  # every step's norm is clipped


@pytest.mark.parametrize("name, overrides", [
    ("ddp", ["parallel.data_parallel=ddp"]),
    ("fsdp", ["parallel.data_parallel=fsdp", "zero.stage=2"]),  # DTensor shards over dp
    ("deepspeed0", ["parallel.data_parallel=deepspeed"]),
    ("pipeline", ["parallel.pipeline_stages=2", "batch.micro_batches=1"]),  # tied head on both stages
    ("tensor_parallel", ["parallel.tp=2"]),  # DTensor shards (and replicas) over tp
])
def test_parts_clip_as_one_process(one, tmp_path, name, overrides):
    two = run(tmp_path, name, [*GPT, "cluster.nproc_per_node=2", f"trainer.grad_clip={CLIP}", *overrides])
    assert_close(losses(one), losses(two), rel=1e-5)
    if name != "deepspeed0":  # DeepSpeed's fp32 ZeRO-0 clips without keeping the norm
        assert_close(norms(one), norms(two), rel=1e-5)


def test_deepspeed_json_zero2_offload_clips_as_one_process(one, tmp_path):
    """The acceptance run of deepspeed.config: the file's ZeRO-2, offload and clipping become the plan's intents,
    its bucket and overlap keys pass through, and the steps are one process's."""
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    two = run(tmp_path, "ds", [*GPT, "cluster.nproc_per_node=2", f"deepspeed.config={tmp_path / 'ds_config.json'}"])
    assert parts(two) == ["deepspeed"]
    written = json.loads((two / "ds_config.json").read_text())
    z = written["zero_optimization"]
    assert z["stage"] == 2 and z["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert z["overlap_comm"] is True and z["reduce_bucket_size"] == 2e8 and written["gradient_clipping"] == CLIP
    assert_close(losses(one), losses(two), rel=1e-5)
    assert_close(norms(one), norms(two), rel=1e-5)
