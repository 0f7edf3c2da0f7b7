"""summary.json and the end-of-run tables, built from what the ranks left in the run dir (also after a crash)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def read_metrics(rank_dir: Path) -> list[dict[str, Any]]:
    """The rank's metrics.jsonl records; a torn last line (the rank died mid-write) is skipped."""
    path = rank_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def last_step(rank_dir: Path) -> int:
    try:
        return int((rank_dir / "last_step").read_text())
    except (OSError, ValueError):
        return 0


def signal_name(exit_code: int | None) -> str | None:
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def build_summary(run_dir: Path, plan: dict, rank_exits: list[dict], status: str, wall_s: float) -> dict:
    """rank_exits: [{rank, exit_code, stopped_by_launcher}] for every rank (exit_code None if unknown)."""
    ranks = []
    for e in rank_exits:
        rank_dir = run_dir / f"rank.{e['rank']}"
        steps = [m for m in read_metrics(rank_dir) if "event" not in m]
        ranks.append(
            {
                "rank": e["rank"],
                "exit_code": e["exit_code"],
                "signal": signal_name(e["exit_code"]),
                "stopped_by_launcher": e.get("stopped_by_launcher", False),
                "last_step": last_step(rank_dir),
                "final_loss": steps[-1]["loss"] if steps else None,
                "samples_per_s": steps[-1]["samples_per_s"] if steps else None,
            }
        )
    rank0 = read_metrics(run_dir / "rank.0")
    steps0 = [m for m in rank0 if "event" not in m]
    evals = [m for m in rank0 if m.get("event") == "eval"]
    return {
        "status": status,
        "run_id": run_dir.name,
        "recipe": plan.get("recipe"),
        "world_size": plan.get("world_size"),
        "steps": plan.get("steps"),
        "completed_steps": min((r["last_step"] for r in ranks), default=0),
        "first_loss": steps0[0]["loss"] if steps0 else None,
        "final_loss": steps0[-1]["loss"] if steps0 else None,
        "samples_per_s": steps0[-1]["samples_per_s"] if steps0 else None,
        "wall_s": round(wall_s, 2),
        "ranks": ranks,
        "eval": {k: v for k, v in evals[-1].items() if k not in ("event", "time", "wall_s")} if evals else {},
    }


def write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def summary_table(summary: dict) -> Table:
    t = Table(title=f"{summary['run_id']}: {summary['status']} in {summary['wall_s']:.1f} s")
    for col in ("rank", "exit code", "last step", "final loss", "samples/s"):
        t.add_column(col, justify="right")
    for r in summary["ranks"]:
        code = "-" if r["exit_code"] is None else str(r["exit_code"])
        if r["signal"]:
            code += f" ({r['signal']}{', stopped by launcher' if r['stopped_by_launcher'] else ''})"
        t.add_row(
            str(r["rank"]),
            code,
            f"{r['last_step']}/{summary['steps']}",
            "-" if r["final_loss"] is None else f"{r['final_loss']:.5f}",
            "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}",
        )
    if summary.get("eval"):
        t.caption = "eval: " + ", ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary["eval"].items())
    return t


def failure_report(run_dir: Path, summary: dict, failed_rank: int | None, tail_lines: int) -> Group:
    """Who failed, how, the rank's error and the tail of its stderr between banners."""
    parts = []
    for r in summary["ranks"]:
        if r["rank"] != failed_rank:
            continue
        how = f"exit code {r['exit_code']}"
        if r["signal"]:
            how = f"signal {r['signal']}"
            if r["signal"] == "SIGKILL":
                how += " (killed from outside: likely the host ran out of memory; check `dmesg` for oom-kill)"
        rank_dir = run_dir / f"rank.{r['rank']}"
        lines = (rank_dir / "stderr").read_text(errors="replace").splitlines() if (rank_dir / "stderr").exists() else []
        body = Text()
        where = f" at step {r['last_step'] + 1} of {summary['steps']}" if summary["steps"] else ""
        body.append(f"rank {r['rank']} failed with {how}{where}.\n")
        message = _error_message(rank_dir / "error.json")
        if message:
            body.append(f"error: {message}\n", style="bold red")
        body.append(f"---- Begin global rank {r['rank']} STDERR (last {tail_lines} lines of {rank_dir / 'stderr'}) ----\n")
        body.append("\n".join(lines[-tail_lines:]) + "\n")
        body.append(f"---- End global rank {r['rank']} STDERR ----")
        parts.append(Panel(body, title=f"rank {r['rank']} failed", border_style="red"))
    stopped = [str(r["rank"]) for r in summary["ranks"] if r["stopped_by_launcher"]]
    if stopped:
        parts.append(Text(f"stopped by the launcher: rank {', '.join(stopped)}; logs and metrics are in {run_dir}"))
    return Group(*parts)


def _error_message(path: Path) -> str:
    try:
        err = json.loads(path.read_text())
        return err["message"]["message"] if isinstance(err.get("message"), dict) else str(err.get("message", ""))
    except (OSError, ValueError, KeyError, TypeError):
        return ""
