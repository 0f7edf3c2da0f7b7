"""Values that name the wrong key or none: a checkpoint folder that cannot be written is refused naming
trainer.checkpoint_dir (not output.log_dir) and leaves no run dir behind; a ``+key=value`` whose value its typed
section refuses is named with that value and its type, not Hydra's bare "Error merging override"."""

from __future__ import annotations

import pytest

from launcher.cli import main


@pytest.mark.parametrize("folder, why", [("/proc/hl-no-such", "No such file or directory"),
                                          ("/etc/hostname/sub", "Not a directory")])
def test_a_checkpoint_dir_that_cannot_be_written_is_named_and_no_run_dir_is_left(tmp_path, monkeypatch, capsys,
                                                                                 folder, why):
    monkeypatch.chdir(tmp_path)
    assert main(["recipe=quickstart", f"trainer.checkpoint_dir={folder}", "dry_run=true"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"trainer.checkpoint_dir={folder}: checkpoints cannot be written there ({why}" in err
    assert "output.log_dir" not in err
    assert not [p for p in (tmp_path / "log_output").glob("*") if p.name != "latest"]


def test_a_checkpoint_dir_that_holds_checkpoints_is_refused_unless_the_run_goes_on_from_one(tmp_path, monkeypatch,
                                                                                          capsys):
    """A run wrote over another's checkpoints (another recipe's too) in a trainer.checkpoint_dir given twice; only an
    elastic job's first round refused it. Resuming from one of them goes on in that folder."""
    monkeypatch.chdir(tmp_path)
    held = tmp_path / "ckpts"
    for step in (2, 4):
        (held / f"step{step}").mkdir(parents=True)
        (held / f"step{step}" / "checkpoint.json").write_text(f'{{"step": {step}}}')
    (held / "step6").mkdir()  # incomplete: not a checkpoint
    assert main(["recipe=quickstart", f"trainer.checkpoint_dir={held}", "dry_run=true"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"trainer.checkpoint_dir={held} holds checkpoints already (step 2, 4): this run would write over them. "
            f"Give each run its own folder, or go on from the newest with trainer.resume_from={held / 'step4'}.") in err
    assert not [p for p in (tmp_path / "log_output").glob("*") if p.name != "latest"]
    from launcher.launch.record import check_checkpoint_dir_free

    check_checkpoint_dir_free(str(held), str(held / "step4"))  # going on from one of them
    check_checkpoint_dir_free(str(tmp_path / "empty"), "")
    assert main(["check", "recipe=quickstart", f"trainer.checkpoint_dir={held}"]) == 2  # check refuses it too


def test_an_appended_value_of_the_wrong_type_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = "+cluster.rdzv_conf.last_call_timeout=abc"
    assert main(["recipe=quickstart", "cluster.launch=elastic", "cluster.rdzv_endpoint=127.0.0.1:29999", line]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{line}: Value 'abc' of type 'str' could not be converted to Integer" in err
    assert "Error merging override" not in err
