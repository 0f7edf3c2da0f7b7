"""Resume and restart: a run that failed after step 8 (checkpoints every 4), resumed from its newest complete
checkpoint (step 4), logs the same per-step losses for steps 5-8 as the failed run did before it failed: model,
optimizer states, tables and their optimizers, data position and RNG all came back (fp32, <= 1e-6 relative). A DCP
checkpoint (the torch-native parts) resumes on another layout: saved on FSDP over dp 4, resumed on dp 2; saved with
tensor parallel 2, resumed with tp 1. DeepSpeed's own checkpoint resumes on its layout only (refused otherwise), and a
checkpoint with a missing or truncated file is refused before launch, the file named."""

import json
import os
import shutil
import socket

import pytest

from launcher.cli import main
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


def test_resume_latest_brings_back_host_tables_and_their_optimizers(tmp_path, capsys):
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
    # the run names the checkpoint it resumed from, on the console and in its summary
    assert f"resuming from {before / 'checkpoints' / 'step4'} (step 4)" in " ".join(resumed.stdout.split())
    assert json.loads((after / "summary.json").read_text())["resumed_from"] == {
        "path": str(before / "checkpoints" / "step4"), "step": 4}
    _assert_same(_losses(after / "rank.0"), _losses(before / "rank.0"))
    # Another layout is refused before anything starts, naming what differs and why (DeepSpeed's own files).
    code = main([*common, f"trainer.resume_from={before}/checkpoints/step4", "cluster.nproc_per_node=1",
                 f"output.log_dir={tmp_path / 'other'}"])  # the CLI in this process, as for the damaged copies
    err = " ".join(capsys.readouterr().err.split())  # unwrapped
    assert code == 2 and "world_size 2 (now 1)" in err, err
    assert "DeepSpeed's checkpoint files hold each rank's own partitions" in err and not (tmp_path / "other").exists()
    _damaged_copies_are_refused_before_launch(before, common, tmp_path, capsys)


DAMAGES = [  # (file of checkpoints/step4, what happens to it, how the refusal names it)
    ("mp_rank_00_model_states.pt", "truncate", "is truncated"),  # the engine's (DeepSpeed's) model states
    ("trainer.1.pt", "delete", "is missing"),  # rank 1's progress and RNG
    ("tables/__0_0.distcp", "truncate", "is truncated"),  # the host tables and their optimizers (DCP)
]


def _damaged_copies_are_refused_before_launch(run, common, tmp_path, capsys):
    """Copies of the run's checkpoint, each with one file damaged as a crash, a full disk or a bad copy leaves it:
    the CLI (in this process) refuses each with exit 2 before a run dir or rank exists, naming the file, what is
    wrong with it and what to resume from instead (here: nothing earlier is intact)."""
    for rel, damage, how in DAMAGES:
        copy = tmp_path / "copies" / rel.replace("/", "_")
        shutil.copytree(run / "checkpoints", copy / "checkpoints")
        shutil.copy(run / "plan.json", copy / "plan.json")
        ckpt = copy / "checkpoints" / "step4"
        size = (ckpt / rel).stat().st_size
        if damage == "delete":
            (ckpt / rel).unlink()
        else:
            os.truncate(ckpt / rel, size // 2)
        key = f"trainer.resume_from={ckpt}" if rel.startswith("tables") else f"trainer.resume={copy}"
        logs = tmp_path / "refused"
        code = main([*common, key, f"output.log_dir={logs}"])
        err = " ".join(capsys.readouterr().err.split())  # unwrapped
        assert code == 2, err
        assert f"{key}: the checkpoint {ckpt} is damaged: {rel} {how}" in err, err
        assert f"{size} bytes expected" in err and "No earlier checkpoint of this run is intact" in err, err
        assert not logs.exists()  # no run dir, no rank


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
