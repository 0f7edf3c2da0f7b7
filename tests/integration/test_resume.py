"""Resume and restart: a run that failed after step 8 (checkpoints every 4), resumed from its newest complete
checkpoint (step 4), logs the same per-step losses for steps 5-8 as the failed run did before it failed: model,
optimizer states, tables and their optimizers, data position and RNG all came back (fp32, <= 1e-6 relative). A DCP
checkpoint (the torch-native parts) resumes on another layout: saved on FSDP over dp 4, resumed on dp 2; saved with
tensor parallel 2, resumed with tp 1. DeepSpeed's own checkpoint resumes on its layout only (refused otherwise)."""

import json
import shutil
import socket

import pytest

from tests.conftest import read_summary, run_cli

pytestmark = pytest.mark.integration

STEPS = ["trainer.steps=8", "trainer.checkpoint_every=4", "trainer.log_every=1", "eval.batches=0"]
FAIL_AFTER_STEP_8 = ["debug.fail_rank=1", "debug.fail_step=8"]  # logged, then raised: no final checkpoint


def _losses(rank_dir) -> dict[int, float]:
    records = [json.loads(line) for line in (rank_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m["loss"] for m in records if "event" not in m}


def _assert_same(resumed: dict[int, float], uninterrupted: dict[int, float]) -> None:
    assert sorted(resumed) == [5, 6, 7, 8], resumed  # from the step after the checkpoint on
    worst = max(abs(resumed[s] - uninterrupted[s]) / abs(uninterrupted[s]) for s in resumed)
    print(f"resumed vs uninterrupted, steps 5-8: worst relative difference {worst:.2e}")
    assert worst <= 1e-6, (resumed, uninterrupted)


@pytest.mark.parametrize("launch", ["local", pytest.param("mpi", marks=pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="mpirun is not installed (Debian: apt-get install openmpi-bin)"))])
def test_a_restart_goes_on_from_the_newest_checkpoint_as_if_nothing_happened(tmp_path, launch):
    """quickstart (DDP): launcher.max_restarts=1 restarts the failed job in the same run dir (its new store on the
    same explicit port: the old one is gone first), with the ranks of this host or under mpirun."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = run_cli(["recipe=quickstart", *STEPS, *FAIL_AFTER_STEP_8, "launcher.max_restarts=1",
                   f"cluster.master_port={port}", f"cluster.launch={launch}"], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = (tmp_path / "log_output" / "latest").resolve()
    summary = read_summary(tmp_path)
    assert summary["status"] == "ok"
    assert [(a["attempt"], a["status"], a["first_failed_rank"]) for a in summary["attempts"]] == [
        (0, "failed", 1), (1, "ok", None)]
    assert summary["attempts"][1]["resumed_from"].endswith("checkpoints/step4")
    first = run / "attempt.0"  # the failed attempt's logs, kept
    assert "injected failure" in (first / "rank.1" / "stderr").read_text()
    assert (first / "rank.0" / "stdout").is_file() and json.loads((first / "plan.json").read_text())["resume_from"] == ""
    _assert_same(_losses(run / "rank.0"), _losses(first / "rank.0"))
    assert "restart 1 of 1 from" in res.stdout


def test_resume_latest_brings_back_host_tables_and_their_optimizers(tmp_path):
    """wide_deep: FTRL / LazyAdam tables on the host (placement.host_device_mix=1), DeepSpeed ZeRO-2 beside."""
    common = ["recipe=wide_deep", "smoke=true", "placement.host_device_mix=1", "zero.stage=2", *STEPS]
    failed = run_cli([*common, *FAIL_AFTER_STEP_8], tmp_path)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    before = (tmp_path / "log_output" / "latest").resolve()
    resumed = run_cli([*common, "trainer.resume=latest"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = (tmp_path / "log_output" / "latest").resolve()
    assert after != before  # a new run dir; the old one is untouched
    assert json.loads((after / "plan.json").read_text())["resume_from"] == str(before / "checkpoints" / "step4")
    _assert_same(_losses(after / "rank.0"), _losses(before / "rank.0"))
    # Another layout is refused before anything starts, naming what differs and why (DeepSpeed's own files).
    other = run_cli([*common, f"trainer.resume_from={before}/checkpoints/step4", "cluster.nproc_per_node=1"], tmp_path)
    assert other.returncode == 2 and "world_size 2 (now 1)" in other.stderr, other.stderr
    assert "DeepSpeed's checkpoint files hold each rank's own partitions" in other.stderr


def test_resume_from_a_run_dir_brings_back_zero_offload_state(tmp_path):
    """gpt with ZeRO-Offload (the optimizer and its fp32 states on the CPU), resumed by its run dir."""
    common = ["recipe=gpt", "smoke=true", "optimizer.target=CPU", *STEPS]
    failed = run_cli([*common, *FAIL_AFTER_STEP_8, "output.run_name=first"], tmp_path)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    resumed = run_cli([*common, "trainer.resume=log_output/first"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = (tmp_path / "log_output" / "latest").resolve()
    assert [p["name"] for p in json.loads((after / "plan.json").read_text())["parts"]] == ["deepspeed"]
    _assert_same(_losses(after / "rank.0"), _losses(tmp_path / "log_output" / "first" / "rank.0"))


@pytest.mark.parametrize("first, then", [
    (["cluster.nproc_per_node=4", "zero.stage=3", "parallel.data_parallel=fsdp"],
     ["cluster.nproc_per_node=2", "zero.stage=3", "parallel.data_parallel=fsdp"]),
    (["cluster.nproc_per_node=4", "parallel.tp=2"], ["cluster.nproc_per_node=2"]),
    (["cluster.nproc_per_node=2"], ["cluster.nproc_per_node=2", "parallel.pipeline_stages=2"]),
], ids=["fsdp_dp4_to_dp2", "tp2_to_tp1", "whole_to_2_stages"])
def test_a_dcp_checkpoint_resumes_on_another_layout(tmp_path, first, then):
    """gpt: the checkpoint at step 4 of a run on 4 ranks (FSDP2 shards over dp 4; or dp 2 × tp 2, the attention and
    MLP split over tp) loads on 2 ranks (FSDP2 over dp 2; or plain DDP, tp 1), and one of the whole model loads into
    2 pipeline stages (the last stage holds the tied head under its own name, whose Adam state was saved under both):
    DCP reshards the saved tensors by their names and global shapes. The global batch (8) and its micro-batches are
    the same, so the data position is."""
    common = ["recipe=gpt", "smoke=true", *STEPS]
    failed = run_cli([*common, *first, *FAIL_AFTER_STEP_8, "output.run_name=first"], tmp_path)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    resumed = run_cli([*common, *then, "trainer.resume=log_output/first"], tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    after = (tmp_path / "log_output" / "latest").resolve()
    plan = json.loads((after / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["dims"]["tp"] == 1
    _assert_same(_losses(after / "rank.0"), _losses(tmp_path / "log_output" / "first" / "rank.0"))
