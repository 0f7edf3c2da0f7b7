"""plan.json and summary.json as ``report`` (and the merge) read them: a record that does not read, or does not have
the shape its readers take (a crash, a full disk or a bad copy left it so), is damaged, with one line that says which
file and what is wrong; the report then goes on with what it can read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.records import DamagedRecord, json_type
from launcher.report.log_tail import cut_middle
from launcher.rundir import RunDir

__all__ = ["checked_plan", "checked_summary", "damaged_line", "plan_problem", "summary_problem"]

NUMBER = (int, float)
NONE = type(None)

SUMMARY_FIELDS: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "run_id": ((str,), True, "a string"),
    "status": ((str,), True, "a string"),
    "wall_s": (NUMBER, True, "a number"),
    "steps": ((int, NONE), True, "an int or null"),
    "ranks": ((list,), True, "an array"),
    "final_metrics": ((dict, NONE), False, "an object or null"),
    "eval": ((dict, NONE), False, "an object or null"),
    "reference": ((dict, NONE), False, "an object or null"),
    "validation": ((dict, NONE), False, "an object or null"),
    "early_stop": ((dict, NONE), False, "an object or null"),
    "note": ((str, NONE), False, "a string or null"),
    "skipped_metrics": ((list,), False, "an array"),
    "loggers_off": ((list,), False, "an array"),
    "not_applied": ((list,), False, "an array"),
    "node_rank": ((int, NONE), False, "an int or null"),
    "nodes": ((list, NONE), False, "an array or null"),
}
"""summary.json's keys that the report's table, plots and merge read: (JSON types, required, in words)."""

RANK_FIELDS: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "rank": ((int,), True, "an int"),
    "exit_code": ((int, NONE), True, "an int or null"),
    "signal": ((str, NONE), True, "a string or null"),
    "stopped_by_launcher": ((object,), True, "any value"),
    "last_step": ((int,), True, "an int"),
    "final_loss": ((*NUMBER, NONE), True, "a number or null"),
    "samples_per_s": ((*NUMBER, NONE), True, "a number or null"),
    "peak_bytes": ((*NUMBER, NONE), False, "a number or null"),
    "planned_peak_bytes": ((*NUMBER, NONE), False, "a number or null"),
}
"""Each of summary.json's ``ranks``."""


def _fields_problem(record: Any, fields: dict, where: str) -> str:
    """What in ``record`` (at ``where``, e.g. "ranks[1].") is not as ``fields`` say; '' when nothing."""
    if not isinstance(record, dict):
        return f"its {where.rstrip('.') or 'value'} is a JSON {json_type(record)}, not an object"
    for key, (kinds, required, words) in fields.items():
        if key not in record:
            if required:
                return f"it has no {where}{key}"
        elif not isinstance(record[key], kinds):
            return f"its {where}{key} is {cut_middle(repr(record[key]), 60)}, not {words}"
    return ""


def summary_problem(summary: Any) -> str:
    """Why ``summary`` is not a summary.json the report can show ('' when it is)."""
    why = _fields_problem(summary, SUMMARY_FIELDS, "")
    for i, rank in enumerate([] if why else summary["ranks"]):
        why = why or _fields_problem(rank, RANK_FIELDS, f"ranks[{i}].")
    if why:
        return why
    floor = (summary.get("reference") or {}).get("entropy_floor")
    if floor is not None and not isinstance(floor, NUMBER):
        return f"its reference.entropy_floor is {cut_middle(repr(floor), 60)}, not a number"
    early = summary.get("early_stop") or {}
    if early.get("best") is not None and not (isinstance(early["best"], NUMBER)
                                              and {"stopped", "metric", "best_step", "stopped_at"} <= set(early)):
        return "its early_stop is not as the launcher writes it (best, metric, best_step, stopped, stopped_at)"
    lists = [("skipped_metrics", str), ("loggers_off", str), ("not_applied", object), ("nodes", dict)]
    odd = next((k for k, kind in lists if not all(isinstance(v, kind) for v in summary.get(k) or ())), None)
    return f"an item of its {odd} is not {'a string' if dict(lists)[odd] is str else 'an object'}" if odd else ""


def plan_problem(plan: dict) -> str:
    """Why ``plan`` (a JSON object) is not a plan.json the report can take its ranks from ('' when it is)."""
    ranks = plan.get("ranks")
    if not isinstance(ranks, list):
        return "it has no ranks" if ranks is None else f"its ranks is a JSON {json_type(ranks)}, not an array"
    for i, r in enumerate(ranks):
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int):
            return f"its ranks[{i}] is {cut_middle(repr(r), 60)}, not an object with an int rank"
    return ""


def checked_plan(run_dir: RunDir) -> tuple[dict | None, str]:
    """(plan.json, '') when it reads as a plan; (None, why) when it is damaged."""
    try:
        plan = run_dir.read_plan()
    except DamagedRecord as e:
        return None, str(e)
    why = plan_problem(plan)
    return (None, why) if why else (plan, "")


def checked_summary(run_dir: RunDir) -> tuple[dict | None, str]:
    """(summary.json, '') when it reads as a summary; (None, '') when there is none; (None, why) when it is
    damaged."""
    try:
        summary = run_dir.read_summary()
    except DamagedRecord as e:
        return None, str(e)
    why = "" if summary is None else summary_problem(summary)
    return (None, why) if why else (summary, "")


def damaged_line(path: Path, why: str, then: str) -> str:
    """One line for the console: which file is damaged, what is wrong, what the report does instead."""
    return f"damaged: {path}: {why}; {then}"
