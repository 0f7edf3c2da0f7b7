"""summary.json and the end-of-run tables, built from what the ranks left in the run dir (also after a crash)."""

from __future__ import annotations

import signal

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launcher.rundir import RunDir


def _parts(plan: dict) -> list[dict]:
    """The parallel parts of a run's plan.json (a script's are its runtime.prepare()'s)."""
    return plan.get("parts") or (plan.get("runtime") or {}).get("parts") or []


BOOKKEEPING = ("step", "loss", "local_loss", "samples_per_s", "time", "wall_s")
"""Keys of a step's metrics.jsonl record that the summary shows on their own; the others are its metrics (lr, a
script's runtime.log(acc=...))."""

NOT_LOGGED = "the script did not call runtime.log: no step or loss was recorded"


def signal_name(exit_code: int | None) -> str | None:
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def build_summary(run_dir: RunDir, plan: dict, rank_exits: list[dict], status: str, wall_s: float) -> dict:
    """rank_exits: [{rank, exit_code, stopped_by_launcher, first_failure, stalled}] for every rank (exit_code None
    if unknown)."""
    ranks = []
    for e in rank_exits:
        rank_dir = run_dir.rank(e["rank"])
        steps = [m for m in rank_dir.read_metrics() if "event" not in m]
        beat = rank_dir.read_heartbeat()
        ranks.append(
            {
                "rank": e["rank"],
                "exit_code": e["exit_code"],
                "signal": signal_name(e["exit_code"]),
                "stopped_by_launcher": e.get("stopped_by_launcher", False),
                "first_failure": e.get("first_failure", False),
                "stalled": e.get("stalled", False),
                "last_step": int(beat.get("step", 0)),
                "logged": bool(steps),
                "rss_bytes": beat.get("rss"),
                "host_available_bytes": beat.get("host_available"),
                "final_loss": steps[-1].get("loss") if steps else None,
                "samples_per_s": steps[-1].get("samples_per_s") if steps else None,
            }
        )
    rank0 = run_dir.rank(min((e["rank"] for e in rank_exits), default=0)).read_metrics()  # this node's first rank
    steps0 = [m for m in rank0 if "event" not in m]
    evals = [m for m in rank0 if m.get("event") == "eval"]
    final_loss = steps0[-1].get("loss") if steps0 else None
    reference = dict(plan.get("reference") or {})
    floor, uniform = reference.get("entropy_floor"), reference.get("uniform_loss")
    # Measured on the held-out evaluation when there is one (the last training loss is one noisy batch).
    measured = evals[-1]["loss"] if evals else final_loss
    if measured is not None and floor is not None and uniform is not None and uniform > floor:
        reference["gap_closed"] = round((uniform - measured) / (uniform - floor), 4)
    parts = _built_parts(run_dir, plan, rank_exits)
    summary = {
        "status": status,
        "run_id": run_dir.name,
        "recipe": plan.get("recipe") or plan.get("name"),
        "engine": "+".join(parts) or None,
        "parts": parts,
        "world_size": plan.get("world_size"),
        "steps": plan.get("steps"),
        "completed_steps": min((r["last_step"] for r in ranks), default=0),
        "first_loss": steps0[0].get("loss") if steps0 else None,
        "final_loss": final_loss,
        "samples_per_s": steps0[-1].get("samples_per_s") if steps0 else None,
        "final_metrics": {k: v for k, v in steps0[-1].items() if k not in BOOKKEEPING} if steps0 else {},
        "wall_s": round(wall_s, 2),
        "ranks": ranks,
        "eval": {k: v for k, v in evals[-1].items() if k not in ("event", "time", "wall_s")} if evals else {},
        "reference": reference,
    }
    if plan.get("kind") == "script" and not any(r["logged"] for r in ranks):
        summary["note"] = NOT_LOGGED
    return summary


def _built_parts(run_dir: RunDir, plan: dict, rank_exits: list[dict]) -> list[str]:
    """The parallel parts the run trained with: a recipe's plan's; a script's, what its runtime.prepare() built
    (rank.N/prepared.json), none when the script did not call it."""
    if plan.get("kind") != "script":
        return [p["name"] for p in _parts(plan)]
    for e in rank_exits:
        try:
            return list(run_dir.read_json(run_dir.rank(e["rank"]).prepared)["parts"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return []


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
            _last_step(summary, r),
            "-" if r["final_loss"] is None else f"{r['final_loss']:.5f}",
            "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}",
        )
    lines = [f"{what}: " + ", ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())
             for what, d in (("metrics", summary.get("final_metrics")), ("eval", summary.get("eval")),
                             ("reference", summary.get("reference"))) if d]
    t.caption = "\n".join(lines + ([f"note: {summary['note']}"] if summary.get("note") else [])) or None
    return t


def _last_step(summary: dict, r: dict) -> str:
    """'12/50' of a recipe's; a script's has no planned total: '12', or '-' for a rank that never logged."""
    if summary["steps"]:
        return f"{r['last_step']}/{summary['steps']}"
    return str(r["last_step"]) if r.get("logged", True) else "-"


def rank_failure(run_dir: RunDir, summary: dict, r: dict, tail_lines: int) -> tuple[str, str, str]:
    """(how it failed, its error message, the tail of its stderr between banners) for rank record ``r``."""
    how = f"exit code {r['exit_code']}"
    if r["signal"]:
        how = f"signal {r['signal']}"
        if r["signal"] == "SIGKILL" and not r["stopped_by_launcher"]:
            memory = (f"its last RSS {_gib(r['rss_bytes'])}, the host's available memory then "
                      f"{_gib(r['host_available_bytes'])}; " if r.get("rss_bytes") else "")
            how += (f" from outside the launcher: likely the out-of-memory killer ({memory}check `dmesg` for "
                    f"oom-kill)")
    where = f" after step {r['last_step']} of {summary['steps']}" if summary["steps"] else ""
    if r.get("stalled"):
        how = "a hang: it made no progress and the launcher's watchdog stopped it"
    rank_dir = run_dir.rank(r["rank"])
    lines = rank_dir.stderr.read_text(errors="replace").splitlines() if rank_dir.stderr.exists() else []
    tail = (f"---- Begin global rank {r['rank']} STDERR (last {tail_lines} lines of {rank_dir.stderr}) ----\n"
            + "\n".join(lines[-tail_lines:]) + f"\n---- End global rank {r['rank']} STDERR ----")
    return f"rank {r['rank']} failed with {how}{where}.", rank_dir.error_message(), tail


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def failure_report(run_dir: RunDir, summary: dict, failed_rank: int | None, tail_lines: int) -> Group:
    """Who failed, how, the rank's error and the tail of its stderr between banners."""
    parts = []
    for r in summary["ranks"]:
        if r["rank"] != failed_rank:
            continue
        headline, message, tail = rank_failure(run_dir, summary, r, tail_lines)
        body = Text(headline + "\n")
        if message:
            body.append(f"error: {message}\n", style="bold red")
        body.append(tail)
        parts.append(Panel(body, title=f"rank {r['rank']} failed", border_style="red"))
    after = [f"{r['rank']} ({r['signal'] or 'exit code ' + str(r['exit_code'])})" for r in summary["ranks"]
             if r["rank"] != failed_rank and not r["stopped_by_launcher"] and r["exit_code"] not in (0, None)]
    if after:
        parts.append(Text(f"failed after rank {failed_rank}, having lost it as a peer: rank {', '.join(after)}"))
    stopped = [str(r["rank"]) for r in summary["ranks"] if r["stopped_by_launcher"]]
    if stopped:
        parts.append(Text(f"stopped by the launcher: rank {', '.join(stopped)}; logs and metrics are in {run_dir.path}"))
    parts.append(Text("last step of each rank: " + ", ".join(f"rank {r['rank']} {r['last_step']}"
                                                             for r in summary["ranks"])))
    return Group(*parts)


def remote_failure_report(summary: dict, failure: dict) -> Panel:
    """A rank on another node failed first (cluster.launch=elastic): what that node said, and what happened here."""
    node = next((n for n in summary.get("nodes", []) if n["node"] == failure.get("node")), {})
    how = f"signal {failure['signal']}" if failure.get("signal") else f"exit code {failure.get('exit_code')}"
    body = Text(f"rank {failure['rank']} on node {failure.get('node')} ({node.get('addr', '?')}) failed first, with "
                f"{how} after step {failure.get('last_step')} of {summary['steps']}; this node's ranks "
                f"({', '.join(str(r['rank']) for r in summary['ranks'])}) were stopped. Its logs are in that node's "
                f"run dir.\n")
    if failure.get("error"):
        body.append(f"error: {failure['error']}\n", style="bold red")
    return Panel(body, title=f"rank {failure['rank']} failed (node {failure.get('node')})", border_style="red")


def backend_report(run_dir: RunDir, unrecorded: list[int], scheduler: str, tail_lines: int) -> Panel:
    """mpirun or srun ended while ranks had not recorded their end (never started, or their first process was
    killed): its own output, which says why."""
    try:
        lines = run_dir.backend_log.read_text(errors="replace").splitlines()[-tail_lines:]
    except OSError:
        lines = ["(no backend.log)"]
    body = Text(f"{scheduler} ended before rank(s) {', '.join(map(str, unrecorded))} recorded how they ended (never "
                f"started, or their first process was killed). Its output, the last {tail_lines} lines of "
                f"{run_dir.backend_log}:\n", style="bold red")
    body.append("\n".join(lines))
    return Panel(body, title=f"{scheduler} failed", border_style="red")


STACK_LINES = 40
"""Lines of each rank's dumped stacks the hang report shows (all of it is in the rank's stderr)."""


def hang_report(run_dir: RunDir, summary: dict, stall) -> Group:
    """Which rank(s) stalled and at what step, by which evidence, their process states and every rank's stacks."""
    named = ", ".join(str(r) for r in stall.ranks)
    body = Text(f"rank {named} hung after step {min(stall.steps.get(r, 0) for r in stall.ranks)} of "
                f"{summary['steps']}: no progress for {stall.idle_s:.1f} s (launcher.watchdog_s: the limit was "
                f"{stall.limit_s:.1f} s); named by {stall.why}.\n")
    for rank, state in stall.states.items():
        body.append(f"rank {rank}: last step {stall.steps.get(rank, 0)}, process {state}\n")
    parts = [Panel(body, title=f"rank {named} hung", border_style="red")]
    for rank, stacks in stall.stacks.items():
        lines = stacks.strip().splitlines()
        text = ("\n".join(lines[-STACK_LINES:]) if lines
                else "(no stacks: the rank did not answer; stopped, or blocked outside Python)")
        parts.append(Panel(Text(text), title=f"rank {rank} Python stacks (all in {run_dir.rank(rank).stderr})",
                           border_style="yellow"))
    parts.append(Text(f"every rank was stopped; logs and metrics are in {run_dir.path}"))
    return Group(*parts)
