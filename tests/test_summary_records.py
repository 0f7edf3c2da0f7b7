"""summary.json is built from what the ranks wrote, whatever they wrote: an odd metrics.jsonl record (a step that is
no int, a value that is no number, a line that is no object) is skipped and named, never a crash of the launcher."""

import io
import json

from rich.console import Console

from launcher.report.summary import build_summary, summary_table
from launcher.rundir import RunDir


def test_odd_records_and_heartbeat_are_skipped_and_named(tmp_path):
    run = RunDir(tmp_path / "run")
    rank = run.rank(0)
    rank.path.mkdir(parents=True)
    records = [{"step": 1, "loss": 2.0, "samples_per_s": 10.0, "time": 1.0},
               {"step": "epoch-1", "loss": 1.5},  # an older runtime.log took any step
               [1, 2],
               {"step": 2, "loss": "low", "acc": 0.5},
               {"step": 3, "loss": None, "acc": 0.75, "time": 3.0},  # a NaN loss, written as null
               {"event": "eval", "step": 3, "acc": 0.8},  # an evaluation without a loss
               {"step": -1, "loss": 1.0, "x" * 5000: "y" * 10**6}]
    rank.metrics.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 4, "lo')  # and a torn line
    rank.heartbeat.write_text(json.dumps({"step": "epoch-1", "rss": "big"}))
    summary = build_summary(run, {"kind": "script", "steps": 0}, [{"rank": 0, "exit_code": 0}], "ok", 1.0)
    r = summary["ranks"][0]
    assert r["last_step"] == 3 and r["final_loss"] is None and r["rss_bytes"] is None
    assert summary["final_metrics"] == {"acc": 0.75} and summary["eval"] == {"step": 3, "acc": 0.8}
    [note] = summary["skipped_metrics"]
    assert note.startswith("rank 0: 5 line(s) of ") and "the first, line 2, because its step 'epoch-1' is not an " \
        "int >= 0" in note  # (and the torn last line, counted with them)
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(summary))
    assert "note: rank 0: 5 line(s)" in out.getvalue() and len(out.getvalue()) < 5000
    json.dumps(summary, allow_nan=False)
