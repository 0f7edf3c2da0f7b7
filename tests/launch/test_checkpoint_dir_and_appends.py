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


def test_an_appended_value_of_the_wrong_type_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = "+cluster.rdzv_conf.last_call_timeout=abc"
    assert main(["recipe=quickstart", "cluster.launch=elastic", "cluster.rdzv_endpoint=127.0.0.1:29999", line]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{line}: Value 'abc' of type 'str' could not be converted to Integer" in err
    assert "Error merging override" not in err
