"""Pipelines on torch.distributed.pipelining and BatchNorm in bf16, against one process, through the composability
harness (bench/composability.py: one launched job trains every plan through the worker's own code; one 1-rank job
trains the references with the same parts, minus the layout).

- gpt cut into stages under each schedule (1F1B, GPipe, interleaved 1F1B with two stages per rank), its head tied to
  the token embedding across stages (the copies' gradients are summed before each step): the one-process losses.
- resnet, the seeds' two stages with BatchNorm, recompute of layer1-4 and momentum SGD: the one-process losses in
  fp32 and, BatchNorm in bf16 (which used to crash at the first batch norm), in bf16 on FSDP2.
- BatchNorm in bf16 under data parallelism on each part that takes bf16 (DeepSpeed, FSDP2). A BatchNorm normalises
  over each rank's own micro-batch (torch DDP's semantics), so no dp run equals one process; at the same layout the
  parts agree: DeepSpeed and DDP in fp32 exactly, DeepSpeed and FSDP2 in bf16 within bf16's rounding (a bound from
  the format and the steps). With parallel.sync_batchnorm every BatchNorm normalises over the dp group's micro-batch:
  dp 2 equals one process per step, in fp32 (1e-5) and in bf16 (within the rounding).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import composability  # noqa: E402

pytestmark = pytest.mark.integration


def check(result: dict, falls: float | None = None) -> list[dict]:
    """Every combination within its tolerance of one process; its loss fell by ``falls`` when given."""
    print(composability.table(result))
    rows = result["rows"]
    assert not result["refused"], result["refused"]
    for r in rows:
        assert r["worst"] <= r["tolerance"], (r["key"], r["losses"], r["reference"])
        assert falls is None or r["losses"][-1] < r["losses"][0] - falls, r
    return rows


SCHEDULES = {
    "3 blocks": ["model.layers=3"],  # embedding, block.0-2, head: five layers, enough for four stages
    "1f1b": ["parallel.pipeline_stages=2"],
    "gpipe": ["parallel.pipeline_stages=2", "parallel.schedule=gpipe"],
    "interleaved": ["parallel.pipeline_stages=2", "parallel.schedule=interleaved_1f1b", "parallel.stages_per_rank=2"],
}


def test_each_schedule_with_a_head_tied_across_stages_matches_one_process(tmp_path):
    combos = [("3 blocks", s) for s in ("1f1b", "gpipe", "interleaved")]
    rows = check(composability.run(["gpt"], 3, tmp_path, SCHEDULES, combos, world=2))  # gpt's loss moves ~0.3 %
    # a step at this size: its per-step losses, held to 1e-5, are what shows a schedule right
    assert [r["parts"] for r in rows] == ["ddp+pipeline"] * 3


RESNET = {
    "bf16": ["precision=bf16"],
    "no pipeline": ["parallel.pipeline_stages=1"],
    "fsdp": ["parallel.data_parallel=fsdp"],
}


STAGES = [(), ("bf16",)]
"""() is resnet's default: the seeds' stages, recompute of layer1-4, fp32 (dp 1: each micro-batch is whole)."""
BATCHNORM = [("no pipeline",), ("no pipeline", "deepspeed"), ("bf16", "no pipeline"), ("bf16", "no pipeline", "fsdp"),
             ("no pipeline", "sync"), ("bf16", "no pipeline", "fsdp", "sync")]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> dict:
    """One harness run for both resnet tests (its 1-rank reference job and its 2-rank job cost ~20 s): the stages'
    combinations and BatchNorm's, 5 steps each. A plan's first steps do not depend on how many follow (the rank
    trains it step by step, its schedule is the plan's), so the stages' test reads the first 3 as a 3-step run."""
    intents = {**RESNET, "deepspeed": ["parallel.data_parallel=deepspeed"], "sync": ["parallel.sync_batchnorm=true"]}
    result = composability.run(["resnet"], 5, tmp_path_factory.mktemp("resnet"), intents, [*STAGES, *BATCHNORM],
                               world=2)
    print(composability.table(result))
    return result


def _rows_of(result: dict, combos: list[tuple[str, ...]], steps: int | None = None) -> dict:
    """``result`` with the rows of ``combos`` only, in their order, cut to their first ``steps`` steps."""
    rows = {tuple(r["combo"]): r for r in result["rows"]}
    cut = []
    for combo in combos:
        r = rows[combo]
        if steps is not None and r["status"] == "trained":
            losses, reference = r["losses"][:steps], r["reference"][:steps]
            r = {**r, "losses": losses, "reference": reference, "worst": composability.worst(losses, reference)}
        cut.append(r)
    return {**result, "rows": cut}


def test_resnet_stages_in_fp32_and_bf16_match_one_process(resnet):
    rows = check(_rows_of(resnet, STAGES, steps=3), falls=0.02)
    assert [r["parts"] for r in rows] == ["recompute+ddp+pipeline", "recompute+fsdp+pipeline"]


U = 2.0 ** -8
"""bf16's unit roundoff: 8 significant bits, one rounding moves a value by at most 2^-8 relative."""


def within_rounding(losses: list[float], reference: list[float], per_step: float) -> bool:
    """Step s within 2u (the reported loss rounded once on each side: it is computed from bf16 logits) plus
    ``per_step`` × u for every update before it (the roundings of the gradients that update carries)."""
    return all(abs(a - b) / abs(b) <= (2 + per_step * s) * U for s, (a, b) in enumerate(zip(losses, reference)))


def test_batchnorm_in_bf16_on_deepspeed_and_fsdp_and_synced_over_dp_as_one_process(resnet):
    """One 2-rank job, dp 2 (resnet without its stages): BatchNorm over each rank's micro-batch (DDP's semantics) on
    ddp, deepspeed, and in bf16 on deepspeed and fsdp; and parallel.sync_batchnorm, in fp32 and in bf16 on fsdp,
    against one process on the whole micro-batch.

    bf16 bounds from the format, not from a run: the same layout on two parts (fsdp against deepspeed, unsynced) or
    on two layouts (synced dp 2 against one process, fsdp both) computes the same statistics; only where sums are
    rounded differs. At step 0 the weights are the same and the reported losses are one rounding apart on each side
    (2u); each update adds the roundings of the gradient it applies: 2u per step where both accumulate the same way
    (one rounding on each side), 6u between fsdp and deepspeed (FSDP2 also rounds the sum of the 4 micro-batches'
    gradients in bf16, 4 more roundings; DeepSpeed's ZeRO-0 accumulates them in fp32)."""
    rows = _rows_of(resnet, BATCHNORM)["rows"]
    ddp, deepspeed, ds_bf16, fsdp_bf16, synced, synced_bf16 = (r["losses"] for r in rows)
    assert [r["parts"] for r in rows] == ["recompute+ddp", "recompute+deepspeed", "recompute+deepspeed",
                                          "recompute+fsdp", "recompute+sync_batchnorm+ddp",
                                          "recompute+sync_batchnorm+fsdp"]
    assert composability.worst(deepspeed, ddp) <= 1e-6  # the same layout, the same BatchNorm statistics
    assert rows[0]["worst"] > 1e-3  # each rank's own statistics: not one process (measured 3.7e-2)
    assert rows[4]["worst"] <= 1e-5, (synced, rows[4]["reference"])  # synced: one process (measured 2.0e-7)
    assert within_rounding(synced_bf16, rows[5]["reference"], per_step=2), (synced_bf16, rows[5]["reference"])
    assert within_rounding(fsdp_bf16, ds_bf16, per_step=6), (fsdp_bf16, ds_bf16)
    for bf16 in (ds_bf16, fsdp_bf16, synced_bf16):
        assert bf16[-1] < bf16[0] - 0.1, bf16  # it trains
