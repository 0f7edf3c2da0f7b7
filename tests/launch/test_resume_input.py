"""trainer.resume names a run; what it cannot resume from is bad input (exit 2, the key named), found before any
process starts."""

import dataclasses
import json
import shutil

import pytest

from launcher.cli import main
from launcher.errors import ConfigError
from launcher.facts.preflight import check_checkpoint_files, check_resume
from launcher.manifest import file_record, list_files
from launcher.parallel.choose import checkpoint_layout
from launcher.rundir import CheckpointDir, RunDir
from tests.conftest import plan_of


def _run(tmp_path, capsys, *overrides):
    code = main(["recipe=quickstart", f"output.log_dir={tmp_path / 'logs'}", *overrides])
    return code, capsys.readouterr().err


def test_resume_of_something_that_is_not_a_run_dir(tmp_path, capsys):
    code, err = _run(tmp_path, capsys, f"trainer.resume={tmp_path}")
    assert code == 2 and "trainer.resume=" in err and "is not a run dir" in err
    code, err = _run(tmp_path, capsys, "trainer.resume=latest")  # a log dir with no run yet: no advice to use latest
    err = " ".join(err.split())
    assert code == 2 and f"trainer.resume=latest: output.log_dir={tmp_path / 'logs'} holds no run to resume" in err
    assert "Start the run without trainer.resume" in err and "or latest for" not in err


def test_resume_of_a_sweep_names_its_jobs(tmp_path, capsys):
    """After a sweep, log_dir/latest is the sweep: "holds no run to resume" had been said of it, and "not a run dir"
    of the sweep's folder; its jobs are the run dirs one level down."""
    sweep = tmp_path / "logs" / "sweep-1"
    for job in ("0", "1"):
        (sweep / job).mkdir(parents=True)
        (sweep / job / "plan.json").write_text(json.dumps({"recipe": "quickstart"}))
    (sweep / "sweep.json").write_text("{}")
    (tmp_path / "logs" / "latest").symlink_to("sweep-1")
    for given in ("latest", str(sweep)):
        code, err = _run(tmp_path, capsys, f"trainer.resume={given}")
        err = " ".join(err.split())
        shown = tmp_path / "logs" / "latest" if given == "latest" else sweep
        assert code == 2 and (f"trainer.resume={given}: {shown} is a sweep (sweep-1), whose jobs are the run dirs "
                              f"under it (0, 1). Give the job to resume, e.g. trainer.resume={shown / '1'}.") in err


def test_resume_of_a_run_without_a_complete_checkpoint(tmp_path, capsys):
    run = tmp_path / "logs" / "old"
    (run / "checkpoints" / "step4").mkdir(parents=True)  # killed while saving: no checkpoint.json
    (run / "plan.json").write_text(json.dumps({"recipe": "quickstart"}))
    code, err = _run(tmp_path, capsys, f"trainer.resume={run}")
    assert code == 2 and "has no complete checkpoint" in err
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["old"]  # no run dir was made


def test_resume_and_resume_from_together(tmp_path, capsys):
    code, err = _run(tmp_path, capsys, "trainer.resume=latest", "trainer.resume_from=x")
    assert code == 2 and "give one" in err


def _written(run: RunDir, step: int, manifest: bool = True) -> tuple[CheckpointDir, dict]:
    """A checkpoint of two ranks as Trainer.save lays it out (checkpoint.json with its manifest, or one written
    before manifests)."""
    ckpt = run.checkpoint(step)
    (ckpt.path / "model").mkdir(parents=True)
    (ckpt.path / "model" / "__0_0.distcp").write_bytes(b"m" * 100)
    for r in (0, 1):
        ckpt.trainer(r).write_bytes(b"t" * 10)
    meta = {"step": step}
    if manifest:
        meta["files"] = {rel: file_record(ckpt.path / rel) for rel in list_files(ckpt.path)}
    ckpt.meta.write_text(json.dumps(meta))
    return ckpt, meta


def test_a_damaged_checkpoint_names_its_file_and_the_newest_earlier_intact_one(tmp_path):
    run = RunDir(tmp_path / "run")
    _written(run, 2, manifest=False)
    old, _ = _written(run, 4)
    changed, _ = _written(run, 6)
    ckpt, meta = _written(run, 8)
    check_checkpoint_files(ckpt, meta, "trainer.resume=latest")  # intact
    ckpt.trainer(1).unlink()
    changed.trainer(0).write_bytes(b"x" * 10)  # step 6 is damaged too: step 4 is the newest intact one
    with pytest.raises(ConfigError) as e:
        check_checkpoint_files(ckpt, meta, "trainer.resume=latest")
    assert (f"trainer.resume=latest: the checkpoint {ckpt.path} is damaged: trainer.1.pt is missing (10 bytes "
            f"expected). Its ranks would fail reading it. Resume from the newest earlier checkpoint that is intact, "
            f"step 4: trainer.resume_from={old.path}.") in str(e.value)
    for damaged in (old, changed):
        shutil.rmtree(damaged.path / "model")
    with pytest.raises(ConfigError, match=f"step 2: trainer.resume_from={run.checkpoint(2).path}"):
        check_checkpoint_files(ckpt, meta, "trainer.resume=latest")  # one written before manifests: no damage seen
    run.checkpoint(2).trainer(0).unlink()
    with pytest.raises(ConfigError, match="No earlier checkpoint of this run is intact: give another checkpoint, or "
                                          "start afresh without trainer.resume"):
        check_checkpoint_files(ckpt, meta, "trainer.resume=latest")


def test_a_checkpoint_written_before_manifests_resumes_when_its_trainer_file_is_there(tmp_path):
    ckpt, meta = _written(RunDir(tmp_path), 4, manifest=False)
    ckpt.trainer(1).unlink()  # not known to be needed: a run on another layout reads trainer.0.pt
    check_checkpoint_files(ckpt, meta, "trainer.resume_from=x")
    ckpt.trainer(0).unlink()
    with pytest.raises(ConfigError, match="trainer.resume_from=x: the checkpoint .* is damaged: trainer.0.pt is "
                                          "missing. Its ranks"):
        check_checkpoint_files(ckpt, meta, "trainer.resume_from=x")


def test_the_loaders_settings_are_not_part_of_what_a_checkpoint_resumes_on(tmp_path, cpu_host):
    """loader.num_workers=auto picks the workers by timing a read, so the run that saved and the one that resumes may
    differ (CI's suite, under load): workers change how the items are read, not which or in what order. A checkpoint
    whose checkpoint.json still lists the loader's settings (written before they were left out) resumes too; the
    data itself still counts."""
    plan = plan_of(["recipe=quickstart", "trainer.steps=8"], cpu_host)
    data = {**plan.data, "loader": {"num_workers": 0, "pin_memory": False}}
    saved_by = dataclasses.replace(plan, data={**data, "loader": {"num_workers": 2, "pin_memory": False}})
    ckpt, meta = _written(RunDir(tmp_path / "run"), 4)
    for written in (checkpoint_layout(saved_by), {**checkpoint_layout(saved_by), "data": saved_by.data}):
        ckpt.meta.write_text(json.dumps({**meta, **written}))
        check_resume(dataclasses.replace(plan, data=data, resume_from=str(ckpt.path)))
    other = dataclasses.replace(plan, data={**data, "samples": -1}, resume_from=str(ckpt.path))
    with pytest.raises(ConfigError, match=r"saved with data.samples \d+ \(now -1\)\. Resume with") as e:
        check_resume(other)  # the key that differs, not both whole mappings
    assert "num_workers" not in str(e.value)
    with pytest.raises(ConfigError, match=rf"trainer.resume=latest \(its checkpoint {ckpt.path}\): saved with data"):
        check_resume(other, "trainer.resume=latest")  # the key the user gave, not the one the launcher set


def test_a_table_saved_with_another_optimizer_is_refused_and_an_older_checkpoint_still_resumes(tmp_path, cpu_host):
    """A table's optimizer names the states saved with it: another one crashed every rank (a lazy_adam checkpoint's
    moments missing for ftrl) or dropped them without a word (lazy_adam's into sgd). A checkpoint written before the
    table optimizers were recorded resumes as before."""
    plan = plan_of(["recipe=wide_deep", "smoke=true", "trainer.steps=8"], cpu_host)
    ckpt, meta = _written(RunDir(tmp_path / "run"), 4)
    ckpt.meta.write_text(json.dumps({**meta, **checkpoint_layout(plan)}))
    other = plan_of(["recipe=wide_deep", "smoke=true", "trainer.steps=8", "tables.deep_embedding.optimizer=sgd",
                     f"trainer.resume_from={ckpt.path}"], cpu_host)
    with pytest.raises(ConfigError, match=r"saved with tables.deep_embedding.optimizer lazy_adam \(now sgd\)\. "):
        check_resume(other)
    older = {k: v for k, v in checkpoint_layout(plan).items() if k != "table_optimizers"}
    ckpt.meta.write_text(json.dumps({**meta, **older}))
    check_resume(dataclasses.replace(plan, resume_from=str(ckpt.path)))
