"""trainer.resume names a run; what it cannot resume from is bad input (exit 2, the key named), found before any
process starts."""

import json

from launcher.cli import main


def _run(tmp_path, capsys, *overrides):
    code = main(["recipe=quickstart", f"output.log_dir={tmp_path / 'logs'}", *overrides])
    return code, capsys.readouterr().err


def test_resume_of_something_that_is_not_a_run_dir(tmp_path, capsys):
    code, err = _run(tmp_path, capsys, f"trainer.resume={tmp_path}")
    assert code == 2 and "trainer.resume=" in err and "is not a run dir" in err
    code, err = _run(tmp_path, capsys, "trainer.resume=latest")
    assert code == 2 and "trainer.resume=latest" in err and "logs/latest is not a run dir" in err


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
