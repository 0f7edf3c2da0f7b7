"""``junit.xml`` in every run dir: the run's result in the form GitLab, GitHub Actions and Jenkins read.

One ``testsuite`` named after the run: a ``testcase`` for the run itself (failed unless the status is ok, with the
failure report as its message) and one per rank (failed with its exit code or signal, its error and the tail of its
stderr; ``skipped`` when the launcher stopped it after another rank failed). The exit code stays the contract."""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from launcher.report.summary import rank_failure
from launcher.rundir import SWEEP_PREFIX, RunDir


_NOT_XML = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """Text XML 1.0 can hold: ANSI colour sequences and control characters (a rank's stderr has them) removed."""
    return _NOT_XML.sub("", text)


def _run_id(run_dir: RunDir) -> str:
    """The run's id: its dir name, with the sweep's for a sweep job (``sweep-.../3``)."""
    parent = run_dir.path.resolve().parent
    return f"{parent.name}/{run_dir.name}" if parent.name.startswith(SWEEP_PREFIX) else run_dir.name


def junit_xml(run_dir: RunDir, summary: dict, tail_lines: int = 20) -> ET.ElementTree:
    ranks = summary.get("ranks", [])
    run_id = _run_id(run_dir)
    classname = f"hetero-launch.{summary.get('recipe')}.{run_id.replace('/', '.')}"
    started = datetime.fromtimestamp(run_dir.path.stat().st_mtime, tz=timezone.utc).replace(microsecond=0)
    suite = ET.Element("testsuite", name=f"hetero-launch {summary.get('recipe')} {run_id}",
                       timestamp=started.isoformat(), hostname=socket.gethostname())
    failures = skipped = 0
    run_case = ET.SubElement(suite, "testcase", classname=classname, name=f"run {run_id}",
                             time=f"{summary.get('wall_s') or 0:.3f}")
    ET.SubElement(run_case, "system-out").text = (
        f"status {summary['status']}, engine {summary.get('engine')}, world_size {summary.get('world_size')}, "
        f"steps {summary.get('completed_steps')}/{summary.get('steps')}, final loss {summary.get('final_loss')}, "
        f"eval {summary.get('eval') or {}}")
    reports = []
    for r in ranks:
        case = ET.SubElement(suite, "testcase", classname=f"{classname}.ranks", name=f"rank {r['rank']}",
                             time=f"{summary.get('wall_s') or 0:.3f}")
        if r["exit_code"] == 0 and not r.get("first_failure"):  # one that exited 0 while the others ran is named
            continue
        if r["exit_code"] is None:  # never started: the launcher failed first (e.g. building DeepSpeed's ops)
            failures += 1
            why = (f"rank {r['rank']} did not start: the launcher failed before spawning the ranks (see its output"
                   f"{' and ' + run_dir.ops_build_log.name if run_dir.ops_build_log.exists() else ''})")
            ET.SubElement(case, "failure", message=why, type="not started").text = why
            reports.append(why)
            continue
        if r.get("stopped_by_launcher") and not r.get("stalled"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"stopped by the launcher at step {r['last_step']} after another "
                                                   f"rank failed")
            continue
        failures += 1
        headline, message, tail = rank_failure(run_dir, summary, r, tail_lines)
        text = _xml_text("\n".join(x for x in (headline, f"error: {message}" if message else "", tail) if x))
        ET.SubElement(case, "failure", message=_xml_text(headline),
                      type=r["signal"] or f"exit {r['exit_code']}").text = text
        if r.get("first_failure"):
            reports.insert(0, text)
        else:
            reports.append(text)
    if summary["status"] != "ok":
        failures += 1
        headline = f"run {summary['status']}" + (f": {reports[0].splitlines()[0]}" if reports else "")
        # the first failure's report in full, the others' headlines (each rank's case has its own): bounded however
        # many ranks failed
        others = "\n".join(x.splitlines()[0] for x in reports[1:])
        text = "\n\n".join(x for x in (reports[0] if reports else "", others) if x)
        ET.SubElement(run_case, "failure", message=headline, type=summary["status"]).text = text or headline
    suite.set("tests", str(len(ranks) + 1))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suite.set("time", f"{summary.get('wall_s') or 0:.3f}")
    return ET.ElementTree(suite)


def write_junit(run_dir: RunDir, summary: dict, tail_lines: int = 20) -> None:
    tree = junit_xml(run_dir, summary, tail_lines)
    ET.indent(tree)
    tree.write(run_dir.junit, encoding="utf-8", xml_declaration=True)
