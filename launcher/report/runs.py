"""Which run dir or checkpoint a command means: ``latest`` after a dry run (the newest run that trained, for
trainer.resume=latest and ``report``), and the checkpoint a run resumed from (its path and step)."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.rundir import CheckpointDir, RunDir, read_record


def is_dry_run(run_dir: RunDir) -> bool:
    """Whether a dry run (dry_run=true) wrote this run dir: a plan, nothing started or trained."""
    record = read_record(run_dir.launcher)
    return isinstance(record, dict) and bool(record.get("dry_run"))


def newest_trained(log_dir: Path) -> RunDir | None:
    """The newest run dir of log_dir that a run (not a dry run) made, by when its launcher started."""
    found = []
    for path in log_dir.iterdir() if log_dir.is_dir() else ():
        run = RunDir(path)
        if path.name == "latest" or path.is_symlink() or not run.plan.is_file() or is_dry_run(run):
            continue
        try:
            found.append((float(json.loads(run.launcher.read_text())["started"]), run))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(found, key=lambda f: f[0])[1] if found else None


def latest_trained(path: Path) -> tuple[Path, str]:
    """``path`` as trainer.resume=latest and ``report`` read it: when it is a log dir's ``latest`` link to a dry run,
    the newest run that trained instead, with a line that says so ('' otherwise)."""
    if path.name != "latest" or not path.is_symlink() or not is_dry_run(RunDir(path)):
        return path, ""
    trained = newest_trained(path.parent)
    if trained is None:
        return path, ""
    return trained.path, (f"{path} is a dry run ({path.resolve().name}): taking the newest run that trained, "
                          f"{trained.path}")


def resumed_from(path: str) -> dict:
    """The checkpoint a run resumed from: its path and step (its checkpoint.json's; None if unreadable)."""
    try:
        step = int(json.loads(CheckpointDir(Path(path)).meta.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        step = None
    return {"path": str(path), "step": step}
