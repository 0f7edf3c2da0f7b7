"""The run dir's records at both ends of a run, whichever backend starts its ranks: the new run dir with the run's
files (``start_run_dir``), and at the end summary.json, junit.xml and the printed reports (``report_run``). The local
path (launcher/launch/__init__.py) and the elastic agent (launcher/launch/elastic_agent.py) both call them."""

from __future__ import annotations

import signal
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from launcher.backends import backend
from launcher.errors import ConfigError
from launcher.launch.record import (RESERVED_BYTES, checkpoint_target, link_checkpoint_dir, release_space,
                                    reserve_space, write_run_files)
from launcher.plan import RunPlan
from launcher.plan.ranks import on_node
from launcher.rundir import RunDir, create_run_dir, point_latest

__all__ = ["report_run", "start_run_dir", "write_records"]


def start_run_dir(cfg: DictConfig, plan: RunPlan) -> RunDir:
    """A new run dir with the run's files, and ``latest`` pointing at it; ConfigError (and no half-made run dir) when
    they cannot be written (a full disk)."""
    log_dir = Path(cfg.output.log_dir)
    checkpoints = checkpoint_target(cfg.trainer.checkpoint_dir)  # its own ConfigError, before any run dir exists
    run_dir = create_run_dir(log_dir, cfg.output.run_name, plan.name)
    try:
        link_checkpoint_dir(run_dir, checkpoints)
        write_run_files(run_dir, cfg, plan)
        if not cfg.dry_run:
            reserve_space(run_dir)  # for summary.json and junit.xml, should the disk fill up meanwhile
        point_latest(log_dir, run_dir)
    except OSError as e:
        import shutil

        shutil.rmtree(run_dir.path, ignore_errors=True)
        kept = " (a run keeps 1 MiB there for its last records from its start)" if run_dir.reserved == Path(
            e.filename or "") else ""
        raise ConfigError(f"output.log_dir={log_dir}: the run's files cannot be written there ({e.strerror or e}"
                          f"{f': {e.filename}' if e.filename else ''}){kept}. Free space on that file system, or set "
                          f"output.log_dir to another one.") from None
    return run_dir


def write_records(run_dir: RunDir, summary: dict, tail_lines: int, console: Console) -> bool:
    """summary.json and junit.xml; False (after saying so) when the disk refuses them: the summary is then only on
    the console."""
    from launcher.report.junit import write_junit

    free = release_space(run_dir)
    if 0 <= free < RESERVED_BYTES:  # the disk filled up: what the ranks wrote stops where it did
        summary["disk_full"] = {"path": str(run_dir.path), "free_bytes": free}
        console.print(f"[red]the disk of {escape(str(run_dir.path))} filled up during the run ({free:,} bytes free "
                      f"at its end): rank output, metrics and checkpoints stop where it did, and a rank that failed "
                      f"may have had no room to say why. summary.json is written into the space kept for it from "
                      f"the start; free space on that file system for the next run.[/red]", soft_wrap=True)
    try:
        run_dir.write_summary(summary)
        write_junit(run_dir, summary, tail_lines)
        return True
    except OSError as e:
        console.print(f"[red]the run's records cannot be written: {escape(e.strerror or str(e))}"
                      f"{escape(f' ({e.filename})') if e.filename else ''}. The summary below is all there is of "
                      f"this run's end; free space on that file system for the next.[/red]", soft_wrap=True)
        return False


def report_run(cfg: DictConfig, plan: RunPlan, run_dir: RunDir, attempts: list, wall_s: float, console: Console,
            nodes=None) -> int:
    """summary.json, junit.xml and the printed tables and reports of the run's last attempt (and the list of
    attempts); returns the launcher's exit code."""
    from launcher.report.runs import resumed_from
    from launcher.report.summary import (backend_report, build_summary, failure_report, hang_report,
                                         remote_failure_report, summary_table)

    last = attempts[-1]
    outcome = last.outcome
    summary = build_summary(run_dir, plan.to_dict(), last.exits, last.status, wall_s)
    summary["first_failed_rank"] = last.first_failed
    if getattr(plan, "resume_from", ""):
        summary["resumed_from"] = resumed_from(plan.resume_from)  # the checkpoint, path and step
    if nodes is not None:
        summary["node_rank"] = nodes.node_rank
        summary["nodes"] = [{**h, "ranks": [r.rank for r in on_node(plan.ranks, h["node"])]} for h in nodes.hosts]
        if last.remote_failure is not None:
            summary["first_failure"] = last.remote_failure
            if last.remote_failure.get("lost"):
                summary["lost_hosts"] = last.remote_failure["lost"]
    if outcome.stall is not None:
        summary["hang"] = outcome.stall.to_dict()
    if outcome.signal is not None:
        summary["interrupted_by"] = signal.Signals(outcome.signal).name
    if len(attempts) > 1 or cfg.launcher.max_restarts > 0:
        summary["attempts"] = [a.record() for a in attempts]
    unrecorded = ([e["rank"] for e in last.exits if not run_dir.rank(e["rank"]).exit.exists()]
                  if backend(cfg.cluster.launch).program else [])
    if unrecorded:
        summary["backend_log"] = str(run_dir.backend_log)
    written = write_records(run_dir, summary, cfg.output.stderr_tail, console)
    console.print(summary_table(summary))
    if outcome.signal is not None:
        console.print(f"[yellow]interrupted by {signal.Signals(outcome.signal).name}: every rank was stopped; logs, "
                      f"metrics and checkpoints so far are in {run_dir.path}[/yellow]")
    if outcome.stall is not None:
        console.print(hang_report(run_dir, summary, outcome.stall))
    elif last.remote_failure is not None:
        console.print(remote_failure_report(summary, last.remote_failure))
    elif unrecorded and last.status == "failed" and (last.first_failed is None or last.first_failed in unrecorded):
        console.print(backend_report(run_dir, unrecorded, backend(cfg.cluster.launch).program, cfg.output.stderr_tail))
    elif last.first_failed is not None:
        console.print(failure_report(run_dir, summary, last.first_failed, cfg.output.stderr_tail))
    if written:
        console.print(f"summary: {run_dir.summary} (plots: hetero-launch report {run_dir.path})")
    if last.status == "ok":
        return 0 if written else 1
    return 128 + outcome.signal if outcome.signal is not None else 1
