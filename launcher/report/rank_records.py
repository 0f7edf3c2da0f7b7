"""What the ranks' own records add to summary.json: the hashed tables' counts (rank.N/hashing.json), the
validation split's last scores and how early stopping ended (metrics.jsonl's ``val`` and ``early_stop`` events), the
loggers that failed (``logger_off`` events)."""

from __future__ import annotations

from launcher.loggers import LOGGER_OFF
from launcher.rundir import RunDir, read_record


def hashing_summary(run_dir: RunDir, rank_exits: list[dict]) -> dict:
    """Per hashed table, its ranks' hashing.json counts summed (this node's ranks): ids looked up, distinct ids and
    rows per batch, and how many of a batch's distinct ids shared a row with another (collided) and their share."""
    total: dict[str, dict[str, int]] = {}
    for e in rank_exits:
        record = read_record(run_dir.rank(e["rank"]).hashing)
        for name, counts in (record.items() if isinstance(record, dict) else ()):
            t = total.setdefault(name, {"ids": 0, "distinct_ids_per_batch": 0, "rows_per_batch": 0, "collided": 0})
            for k in t:
                t[k] += number(counts.get(k)) or 0 if isinstance(counts, dict) else 0
    for t in total.values():
        t["collided_share"] = round(t["collided"] / t["distinct_ids_per_batch"], 6) if t["distinct_ids_per_batch"] else 0.0
    return total


def number(v: object) -> int | float | None:
    """v if it is a number (int or float), else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def validation_summary(events: dict[str, list[dict]], plan: dict) -> dict:
    """{"validation": the last validation's scores, "early_stop": how it ended} of a run with a validation split
    (from a rank's metrics.jsonl records by event, as the summary read them; {} without one). ``early_stop`` says the
    metric and mode watched, the best value and its step, whether the run stopped before trainer.steps, and at which
    step."""
    if not plan.get("val_every"):
        return {}
    vals, ended = events.get("val", []), (events.get("early_stop") or [None])[-1]
    out = {"validation": {k: v for k, v in vals[-1].items() if k not in ("event", "time", "wall_s")} if vals else {}}
    early = plan.get("early_stop")
    if early and ended is not None:
        out["early_stop"] = {"metric": early["metric"], "mode": early["mode"], "best": number(ended.get("best")),
                             "best_step": ended.get("best_step"), "stopped": bool(ended.get("stopped")),
                             "stopped_at": ended.get("step") if ended.get("stopped") else None,
                             "test_on": "the best checkpoint"}
    return out


def loggers_off(events: dict[str, list[dict]], plan: dict) -> list[str]:
    """A sentence per logger that failed in rank 0 and was dropped (its ``logger_off`` events), naming it and where
    its error is."""
    specs = plan.get("loggers") if isinstance(plan.get("loggers"), (list, tuple)) else ()
    out = []
    for m in events.get(LOGGER_OFF, []):
        at = m.get("logger")
        spec = specs[at] if isinstance(at, int) and 0 <= at < len(specs) else None
        name = spec.get("_target_") if isinstance(spec, dict) else f"number {at}"
        when = ("in its constructor" if m.get("in_constructor") else
                f"when closed after step {m['step']}" if m.get("in_close") else f"at step {m['step']}")
        out.append(f"logger {name} failed {when} and was off from then (its error: rank.0/stderr)")
    return out


def validation_lines(summary: dict) -> list[str]:
    """The end-of-run lines of a run with a validation split: its last scores, and how early stopping ended."""
    lines = []
    val = summary.get("validation")
    if val:
        lines.append("validation: " + ", ".join(f"{k}={v:.5g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in val.items()))
    e = summary.get("early_stop")
    if e and e.get("best") is not None:
        how = f"stopped at step {e['stopped_at']}" if e["stopped"] else "ran every step"
        lines.append(f"early stop: {how}; best validation {e['metric']} {e['best']:.5g} at step {e['best_step']} "
                     f"(checkpoints/best); eval above is the test split on it")
    return lines
