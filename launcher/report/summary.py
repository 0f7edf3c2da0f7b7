"""summary.json and the end-of-run tables, built from what the ranks left in the run dir (also after a crash)."""

from __future__ import annotations

import json
import signal

from rich.console import Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launcher.codec import from_plain
from launcher.errors import printable
from launcher.plan.peak import MemoryPlan
from launcher.plan.script_keys import not_applied_in
from launcher.report.log_tail import LINE_CHARS, MESSAGE_CHARS, cut_middle, log_tail
from launcher.report.rank_records import hashing_summary, loggers_off, number, validation_lines, validation_summary
from launcher.rundir import RankDir, RunDir, is_step

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
    ranks, skipped = [], []
    for e in rank_exits:
        rank_dir = run_dir.rank(e["rank"])
        steps, _, odd = _records(rank_dir)
        if odd:
            skipped.append(f"rank {e['rank']}: {odd}")
        beat = rank_dir.read_heartbeat()
        ranks.append(
            {
                "rank": e["rank"],
                "exit_code": e["exit_code"],
                "signal": signal_name(e["exit_code"]),
                "stopped_by_launcher": e.get("stopped_by_launcher", False),
                "first_failure": e.get("first_failure", False),
                "stalled": e.get("stalled", False),
                "lost_peer": e.get("lost_peer", False),
                "last_step": _rank_last_step(beat, steps),
                "logged": bool(steps),
                "rss_bytes": number(beat.get("rss")),
                "host_available_bytes": number(beat.get("host_available")),
                **_peak_vs_plan(rank_dir, plan),
                "final_loss": steps[-1].get("loss") if steps else None,
                "samples_per_s": steps[-1].get("samples_per_s") if steps else None,
            }
        )
        if e.get("blame"):
            ranks[-1]["blame"] = e["blame"]
    steps0, events, _ = _records(run_dir.rank(min((e["rank"] for e in rank_exits), default=0)))  # this node's first
    evals = events.get("eval", [])
    final_loss = steps0[-1].get("loss") if steps0 else None
    reference = dict(plan.get("reference") or {})
    floor, uniform = reference.get("entropy_floor"), reference.get("uniform_loss")
    # Measured on the held-out evaluation when there is one (the last training loss is one noisy batch).
    measured = evals[-1].get("loss") if evals else final_loss
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
    summary.update(validation_summary(events, plan))
    hashing = hashing_summary(run_dir, rank_exits)
    if hashing:
        summary["hashing"] = hashing
    if plan.get("kind") == "script" and not any(r["logged"] for r in ranks):
        summary["note"] = NOT_LOGGED
    off = loggers_off(events, plan)
    if off:
        summary["loggers_off"] = off
    not_applied = not_applied_in(plan, parts)
    if not_applied:
        summary["not_applied"] = not_applied
    if skipped:
        summary["skipped_metrics"] = skipped
    return summary


def odd_record(m: object) -> str:
    """Why a metrics.jsonl record is not one a reader may take as it is ('' when it is): a JSON object whose step is
    an int >= 0 and whose values are numbers (or null: a NaN), but for an event's name."""
    if not isinstance(m, dict):
        return f"it is not a JSON object: {printable(cut_middle(repr(m), 80))}"
    step = m.get("step")
    if not is_step(step):
        return f"its step {printable(cut_middle(repr(step), 80))} is not an int >= 0"
    for k, v in m.items():
        if k == "event" and isinstance(v, str):
            continue
        if v is not None and not isinstance(v, (int, float)):
            return f"its {printable(cut_middle(repr(k), 80))} is not a number: {printable(cut_middle(repr(v), 80))}"
    return ""


def read_records(rank_dir: RankDir) -> tuple[list[dict], str]:
    """(the records of a rank's metrics.jsonl that a reader may take as they are, in order; a note of the lines
    skipped): a line that does not read (torn: its rank died mid-write; not UTF-8) or is not what runtime.log or a
    recipe's loop writes (odd_record) is skipped, and the note says how many and why the first was ('' when none
    was)."""
    lines, bad = rank_dir.metrics_lines()
    good = []
    for number, m in lines:
        why = odd_record(m)
        if why:
            bad.append((number, why))
        else:
            good.append(m)
    if not bad:
        return good, ""
    number, why = min(bad)
    if number == 0:  # the whole file
        return good, f"{rank_dir.metrics} skipped: {why}"
    return good, f"{len(bad)} line(s) of {rank_dir.metrics} skipped; the first, line {number}, because {why}"


def _records(rank_dir: RankDir) -> tuple[list[dict], dict[str, list[dict]], str]:
    """(the step records, the event records by event name (eval, val, early_stop, ...), a note of the lines
    skipped: read_records) of a rank's metrics.jsonl."""
    steps, events = [], {}
    records, note = read_records(rank_dir)
    for m in records:
        if "event" not in m:
            steps.append(m)
        else:
            events.setdefault(m["event"], []).append(m)
    return steps, events, note


def _peak_vs_plan(rank_dir: RankDir, plan: dict) -> dict:
    """{"peak_bytes": what the rank measured (rank.N/memory.json), "planned_peak_bytes": the memory model's figure
    for it}: a CPU rank's resident peak, a GPU rank's max_memory_reserved; None each when not there."""
    planned = from_plain(MemoryPlan, plan["peak"]).measured_as if plan.get("peak") else ("rss", None)
    try:
        measured = json.loads(rank_dir.memory.read_text()).get("peak", {}).get(planned[0])
    except (OSError, ValueError, AttributeError, RecursionError):
        measured = None
    return {"peak_bytes": number(measured), "planned_peak_bytes": planned[1]}


def _rank_last_step(beat: dict, steps: list[dict]) -> int:
    """The last step of a rank's heartbeat (rank.N/last_step), else of its last step record, else 0."""
    if is_step(beat.get("step")):
        return beat["step"]
    return steps[-1]["step"] if steps else 0


def _built_parts(run_dir: RunDir, plan: dict, rank_exits: list[dict]) -> list[str]:
    """The parallel parts the run trained with: a recipe's plan's; a script's, what its runtime.prepare() built
    (rank.N/prepared.json), none when the script did not call it."""
    if plan.get("kind") != "script":
        return [p["name"] for p in _parts(plan)]
    for e in rank_exits:
        try:
            return list(run_dir.read_json(run_dir.rank(e["rank"]).prepared)["parts"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
    return []


def summary_table(summary: dict) -> Table:
    t = Table(title=f"{summary['run_id']}: {summary['status']} in {summary['wall_s']:.1f} s")
    for col in ("rank", "exit code", "last step", "final loss", "samples/s", "peak memory (plan)"):
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
            _peak_words(r),
        )
    lines = [f"{what}: " + ", ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())
             for what, d in (("metrics", summary.get("final_metrics")), ("eval", summary.get("eval")),
                             ("reference", summary.get("reference"))) if d] + validation_lines(summary)
    notes = (([summary["note"]] if summary.get("note") else []) + summary.get("skipped_metrics", [])
             + summary.get("loggers_off", [])
             + [f"not applied: {n}" for n in summary.get("not_applied", ())])
    t.caption = "\n".join(lines + [f"note: {escape(n)}" for n in notes]) or None  # escape: a note quotes records
    return t


def _peak_words(r: dict) -> str:
    got, plan = r.get("peak_bytes"), r.get("planned_peak_bytes")
    if got is None:
        return "-" if plan is None else f"- ({plan / 1e6:,.0f} MB)"
    if not plan:
        return f"{got / 1e6:,.0f} MB"
    return f"{got / 1e6:,.0f} MB ({plan / 1e6:,.0f}, {got / plan - 1:+.0%})"


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
            how += f" from outside the launcher: likely the out-of-memory killer ({memory}check `dmesg` for oom-kill)"
    where = f" after step {r['last_step']} of {summary['steps']}" if summary["steps"] else ""
    if r.get("stalled"):
        how = "a hang: it made no progress and the launcher's watchdog stopped it"
    rank_dir = run_dir.rank(r["rank"])
    tail = (f"---- Begin global rank {r['rank']} STDERR (last {tail_lines} lines of {rank_dir.stderr}) ----\n"
            + "\n".join(log_tail(rank_dir.stderr, tail_lines))
            + f"\n---- End global rank {r['rank']} STDERR ----")
    message = printable(cut_middle(rank_dir.error_message(), MESSAGE_CHARS))
    if r["exit_code"] == 0:  # named all the same (blame): it left while the others still needed it
        if not where and r.get("logged"):
            where = f" after step {r['last_step']}"
        return f"rank {r['rank']} left first: it exited 0{where} while other ranks still ran.", message, tail
    return f"rank {r['rank']} failed with {how}{where}.", message, tail


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
        if r.get("blame"):
            body.append(f"\nwhy this rank: {r['blame']}")
        parts.append(Panel(body, title=f"rank {r['rank']} {'left first' if r['exit_code'] == 0 else 'failed'}",
                           border_style="red"))
    others = [r for r in summary["ranks"]
              if r["rank"] != failed_rank and not r["stopped_by_launcher"] and r["exit_code"] not in (0, None)]
    for lost, words in ((True, f"failed after rank {failed_rank}, having lost it as a peer"),
                        (False, "failed of its own too (its error is not the loss of a peer)")):
        after = [f"{r['rank']} ({r['signal'] or 'exit code ' + str(r['exit_code'])})" for r in others
                 if r.get("lost_peer", True) == lost]  # a summary from before lost_peer: as it said then
        if after:
            parts.append(Text(f"{words}: rank {', '.join(after)}"))
    stopped = [str(r["rank"]) for r in summary["ranks"] if r["stopped_by_launcher"]]
    if stopped:
        parts.append(Text(f"stopped by the launcher: rank {', '.join(stopped)}; logs and metrics are in {run_dir.path}"))
    parts.append(Text("last step of each rank: " + ", ".join(f"rank {r['rank']} {r['last_step']}"
                                                             for r in summary["ranks"])))
    return Group(*parts)


def remote_failure_report(summary: dict, failure: dict) -> Panel:
    """A rank on another node failed first (cluster.launch=elastic): what that node said, and what happened here; or
    a host was lost (launcher/launch/liveness.py): which, and how long it was silent."""
    if failure.get("lost"):  # (the error names the hosts, their addresses and ranks)
        title = "the rendezvous store is lost" if failure.get("store_lost") else "host lost: " + ", ".join(
            h["hostname"] for h in failure["lost"])
        return Panel(Text(failure["error"], style="bold red"), title=title, border_style="red")
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
    lines = log_tail(run_dir.backend_log, tail_lines) if run_dir.backend_log.exists() else ["(no backend.log)"]
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
    if stall.first_step:
        when, since, key = "before its first step", " since the ranks started", "a first step's multiple of launcher.watchdog_s"
    else:
        when, since, key = f"after step {min(stall.steps.get(r, 0) for r in stall.ranks)}", "", "launcher.watchdog_s"
    body = Text(f"rank {named} hung {when} of {summary['steps']}: no progress for {stall.idle_s:.1f} s{since} ({key}: "
                f"the limit was {stall.limit_s:.1f} s); named by {stall.why}.\n")
    for rank, state in stall.states.items():
        saving = f", writing a checkpoint for {stall.saving[rank]:.1f} s" if rank in stall.saving else ""
        body.append(f"rank {rank}: last step {stall.steps.get(rank, 0)}, process {state}{saving}\n")
    parts = [Panel(body, title=f"rank {named} hung", border_style="red")]
    for rank, stacks in stall.stacks.items():
        lines = stacks.strip().splitlines()
        text = ("\n".join(printable(cut_middle(line, LINE_CHARS)) for line in lines[-STACK_LINES:]) if lines
                else "(no stacks: the rank did not answer; stopped, or blocked outside Python)")
        parts.append(Panel(Text(text), title=f"rank {rank} Python stacks (all in {run_dir.rank(rank).stderr})",
                           border_style="yellow"))
    parts.append(Text(f"every rank was stopped; logs and metrics are in {run_dir.path}"))
    return Group(*parts)
