"""``hetero-launch report DIR DIR ... [--into OUT]``: the run dirs of one cluster.launch=elastic run, gathered from
its nodes, merged into one run dir (copies; the sources stay as they are) that is then reported as one run.

With no shared file system each node writes only its own ranks' ``rank.<N>/`` and its own summary.json (node_rank,
nodes, this node's ranks). The merge checks first and writes nothing when a check fails (every problem at once, each
with its dir and a fix): each DIR is a run dir, all have the same plan, no rank is in two dirs, no node_rank is
given twice, and every rank of the plan is in one of them. Then OUT gets every ``rank.<N>/``, the run files of the
node_rank-0 dir (the first one given, if none says node 0), rank_env.json of all ranks, a merged summary.json and
junit.xml. Checkpoints and earlier attempts stay in each node's run dir."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from launcher.errors import ConfigError
from launcher.records import DamagedRecord, load_record
from launcher.report.damage import checked_plan, checked_summary, damaged_line
from launcher.report.junit import write_junit
from launcher.report.summary import build_summary
from launcher.rundir import RunDir, SweepDir

__all__ = ["MergeError", "NodeDir", "STATUS_ORDER", "default_out", "merged_summary", "plan_digest", "read_node_dirs",
           "report_merged", "write_merged_run"]

PER_HOST_KEYS = ("ranks", "notes")
"""Plan keys that differ between nodes of one run (each rank's env: cores, cache paths; notes on this host)."""

STATUS_ORDER = ("ok", "unknown", "interrupted", "failed", "hung")
"""The merged status is the worst node's, in this order: a hang on one node is a failure on the others (they lose a
peer), so hung names the cause; a status not listed (a rebuilt "unknown (...)") ranks as "unknown"."""

AGREED_KEYS = ("first_failed_rank", "first_failure")
"""Summary keys every node that has them should give alike; where they differ, the merged summary says so under
"disagreements" (and takes the first node's value that is not None)."""


class MergeError(ConfigError):
    """The run dirs cannot be merged; ``problems`` holds one sentence per problem, each with its dir and a fix."""

    about = "with the run dirs to merge; nothing was written."


def plan_digest(plan: dict[str, Any]) -> str:
    """What every node of one run must agree on, from plan.json (ranks and notes left out): the launchers compare
    it at the rendezvous (launch.nodes.plan_hash), the merge compares the gathered run dirs with it."""
    d = {k: v for k, v in plan.items() if k not in PER_HOST_KEYS}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def default_out(first: Path) -> Path:
    """``<first DIR>-merged``, beside it."""
    if first.name in ("", ".", ".."):
        first = first.resolve()
    return first.parent / f"{first.name}-merged"


@dataclass(frozen=True)
class NodeDir:
    """One node's run dir as read for the merge."""

    run_dir: RunDir
    plan: dict[str, Any]
    summary: dict[str, Any]
    node_rank: int | None
    """From summary.json (None for a run dir without one and without an unambiguous node in the plan)."""
    ranks: tuple[int, ...]
    """The plan's ranks this dir holds: in its summary, or with a rank.<N>/ here."""
    damaged: str = ""
    """Why its summary.json is damaged (it was then rebuilt from its ranks' records), '' when it is not."""


def _node_dir(run_dir: RunDir) -> NodeDir:
    """DamagedRecord for a plan.json that does not read as a plan; a damaged summary.json is rebuilt, as a missing
    one."""
    plan, why = checked_plan(run_dir)
    if plan is None:
        raise DamagedRecord(run_dir.plan, why)
    planned = [r["rank"] for r in plan["ranks"]]
    here = [r for r in planned if run_dir.rank(r).path.is_dir()]
    summary, damaged = checked_summary(run_dir)
    if summary is None:  # the node's launcher did not finish: rebuilt from its ranks' records, as `report` does
        exits = [{"rank": r, "exit_code": None} for r in here]
        status = (f"unknown (summary.json is damaged: {damaged}; rebuilt from the ranks' records)" if damaged
                  else "unknown (no summary.json: the launcher did not finish)")
        summary = build_summary(run_dir, plan, exits, status, 0.0)
        nodes = {r["node_rank"] for r in plan.get("ranks", []) if r["rank"] in here and "node_rank" in r}
        node_rank = nodes.pop() if len(nodes) == 1 else None
    else:
        node_rank = summary.get("node_rank")
    ranks = sorted(set(here) | {r["rank"] for r in summary.get("ranks", []) if r["rank"] in planned})
    return NodeDir(run_dir, plan, summary, node_rank, tuple(ranks), damaged)


def _not_a_run_dir(path: Path) -> str:
    fix = "Give the run dir each node wrote, copied here, e.g. scp -r node1:log_output/latest node1-run."
    if not path.exists():
        return f"{path}: no such dir. {fix}"
    if SweepDir(path).json.exists():
        return f"{path} is a sweep, not a run dir. Give the run dir of one of its jobs from each node, e.g. {path}/0."
    return f"{path} is not a run dir (no plan.json). {fix}"


def _plan_differs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = sorted((set(a) | set(b)) - set(PER_HOST_KEYS))
    return [k for k in keys if json.dumps(a.get(k), sort_keys=True) != json.dumps(b.get(k), sort_keys=True)]


def _where(rank_list: list[int], nodes: list[dict[str, Any]], plan: dict[str, Any]) -> str:
    """Which node should hold these ranks: from the summaries' "nodes" (address and hostname), else the plan."""
    parts = []
    for node in nodes:
        held = [r for r in rank_list if r in node.get("ranks", [])]
        if held:
            host = node.get("hostname") or "?"
            parts.append(f"node {node['node']} ({host}, {node.get('addr', '?')}) holds rank "
                         f"{', '.join(map(str, held))} in its log_output/<run>/: copy it here, e.g. scp -r "
                         f"{node.get('addr', host)}:log_output/latest node{node['node']}-run, and add that dir")
    if not parts:
        by_node: dict[Any, list[int]] = {}
        for r in plan.get("ranks", []):
            if r["rank"] in rank_list:
                by_node.setdefault(r.get("node_rank", "?"), []).append(r["rank"])
        parts = [f"node {n} holds rank {', '.join(map(str, rs))} in its log_output/<run>/: copy that node's run dir "
                 f"here and add it" for n, rs in sorted(by_node.items(), key=lambda kv: str(kv[0]))]
    return "; ".join(parts)


def read_node_dirs(paths: list[Path], out: Path | None = None) -> list[NodeDir]:
    """Each dir read and checked against the others, by node_rank (node 0 first; a dir with none last, in the order
    given); MergeError with every problem at once."""
    problems: list[str] = []
    if out is not None and (out.exists() or out.is_symlink()):
        problems.append(f"--into {out}: exists, and run dirs are never overwritten. Give another --into, or remove "
                        f"{out} first.")
    nodes: list[NodeDir] = []
    for path in paths:
        run_dir = RunDir(path)
        if not run_dir.plan.is_file():
            problems.append(_not_a_run_dir(path))
            continue
        try:
            nodes.append(_node_dir(run_dir))
        except DamagedRecord as e:
            problems.append(f"{e.path} is damaged: {e}. Copy the node's run dir again.")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # a plan field of another shape
            problems.append(f"{path}: its plan.json does not read as a plan ({type(e).__name__}: {e}). Copy the "
                            f"node's run dir again.")
    if nodes:
        ref = nodes[0]
        for node in nodes[1:]:
            if node.run_dir.path.resolve() == ref.run_dir.path.resolve():
                continue  # given twice: named below, as ranks in two dirs
            if plan_digest(node.plan) != plan_digest(ref.plan):
                problems.append(
                    f"{node.run_dir.path}: its plan differs from {ref.run_dir.path}'s (in "
                    f"{', '.join(_plan_differs(ref.plan, node.plan))}): not the same run. Give the run dirs of one "
                    f"run, written by the same command on every node.")
        seen_rank: dict[int, Path] = {}
        seen_node: dict[int, Path] = {}
        for node in nodes:
            twice = [r for r in node.ranks if r in seen_rank]
            for other in dict.fromkeys(seen_rank[r] for r in twice):
                rs = [r for r in twice if seen_rank[r] == other]
                problems.append(f"rank {', '.join(map(str, rs))} is in both {other} and {node.run_dir.path}: each "
                                f"rank is written by one node. Give each node's run dir once.")
            for r in node.ranks:
                seen_rank.setdefault(r, node.run_dir.path)
            if node.node_rank is not None:
                if node.node_rank in seen_node:
                    problems.append(f"{seen_node[node.node_rank]} and {node.run_dir.path} both say node_rank "
                                    f"{node.node_rank} (summary.json): one node's run dir given twice, or two of its "
                                    f"runs. Give each node's run dir of this run once.")
                seen_node.setdefault(node.node_rank, node.run_dir.path)
        missing = [r["rank"] for r in ref.plan.get("ranks", []) if r["rank"] not in seen_rank]
        if missing:
            known = next((n.summary["nodes"] for n in nodes if n.summary.get("nodes")), [])
            problems.append(f"rank {', '.join(map(str, missing))} of the plan (world_size "
                            f"{ref.plan.get('world_size')}) is in none of the given dirs: "
                            f"{_where(missing, known, ref.plan)}.")
    if problems:
        raise MergeError(problems)
    return sorted(nodes, key=lambda n: (n.node_rank is None, n.node_rank or 0))  # by node_rank, then as given


def merged_summary(nodes: list[NodeDir], run_id: str) -> dict[str, Any]:
    """One summary.json for the whole run, from the nodes' (node_rank 0's first): every rank, the worst status, the
    longest wall time, the agreed first failure (disagreements named), and where it came from."""
    first = nodes[0].summary
    merged = {k: v for k, v in first.items() if k != "node_rank"}
    ranks = sorted((r for n in nodes for r in n.summary.get("ranks", []) if r["rank"] in n.ranks),
                   key=lambda r: r["rank"])
    merged.update(
        run_id=run_id,
        status=max((n.summary["status"] for n in nodes),
                   key=lambda s: STATUS_ORDER.index(s if s in STATUS_ORDER else "unknown")),
        ranks=ranks,
        completed_steps=min((r["last_step"] for r in ranks if type(r.get("last_step")) is int), default=0),
        wall_s=max((n.summary["wall_s"] for n in nodes if isinstance(n.summary.get("wall_s"), (int, float))),
                   default=0.0),
    )
    nodes_list = next((n.summary["nodes"] for n in nodes if n.summary.get("nodes")), None)
    if nodes_list is not None:
        merged["nodes"] = nodes_list
    disagreements = {}
    for key in AGREED_KEYS:
        said = {str(n.run_dir.path): n.summary[key] for n in nodes if key in n.summary}
        if not said:
            continue
        merged[key] = next((v for v in said.values() if v is not None), None)
        if len({json.dumps(v, sort_keys=True) for v in said.values()}) > 1:
            disagreements[key] = said
    if disagreements:
        merged["disagreements"] = disagreements
    for key in ("hang", "interrupted_by"):  # from the node where it happened
        value = next((n.summary[key] for n in nodes if n.summary.get(key)), None)
        if value is not None:
            merged[key] = value
    merged["merged_from"] = [{"dir": str(n.run_dir.path), "node_rank": n.node_rank, "status": n.summary["status"],
                              "ranks": list(n.ranks)} for n in nodes]
    damaged = [damaged_line(n.run_dir.summary, n.damaged, "rebuilt from its ranks' records") for n in nodes
               if n.damaged]
    if damaged:
        merged["damaged"] = damaged
    return merged


def write_merged_run(paths: list[Path], out: Path | None = None) -> tuple[RunDir, dict[str, Any]]:
    """Check, then copy into a new run dir OUT (default ``<first DIR>-merged``): every rank.<N>/, the node_rank-0
    dir's run files, rank_env.json of every rank, the merged summary.json and junit.xml. MergeError (nothing
    written) when a check fails; a failed copy removes OUT again."""
    out = default_out(paths[0]) if out is None else out
    nodes = read_node_dirs(paths, out)
    try:
        out.mkdir(parents=True)  # refuses one made meanwhile: never overwrite a run dir
    except FileExistsError:
        raise MergeError([f"--into {out}: exists, and run dirs are never overwritten. Give another --into."]) from None
    merged = RunDir(out)
    try:
        primary = nodes[0].run_dir
        skip = {primary.summary.name, primary.junit.name, primary.rank_env.name}  # written merged below
        for item in sorted(primary.path.iterdir()):
            if item.is_file() and item.name not in skip:
                shutil.copy2(item, out / item.name)
        rank_env: dict[str, Any] = {}
        env_damaged = []
        for node in nodes:
            for r in node.ranks:
                if node.run_dir.rank(r).path.is_dir():
                    shutil.copytree(node.run_dir.rank(r).path, merged.rank(r).path)
            if node.run_dir.rank_env.is_file():
                try:
                    env = load_record(node.run_dir.rank_env)
                    rank_env.update({k: v for k, v in env.items() if k.isdigit() and int(k) in node.ranks})
                except DamagedRecord as e:
                    env_damaged.append(damaged_line(e.path, str(e), "its ranks' environments are left out"))
        if rank_env:
            merged.write_json(merged.rank_env, dict(sorted(rank_env.items(), key=lambda kv: int(kv[0]))))
        summary = merged_summary(nodes, merged.name)
        if env_damaged:
            summary["damaged"] = [*summary.get("damaged", ()), *env_damaged]
        merged.write_summary(summary)
        write_junit(merged, summary)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # ours: made above
        raise
    return merged, summary


def report_merged(paths: list[Path], out: Path | None, console: Console) -> int:
    """Merge, then ``report`` the merged run dir as one; 2 (nothing written) when the dirs cannot be merged."""
    from launcher.report.plots import report

    try:
        merged, summary = write_merged_run(paths, out)
    except MergeError as e:
        console.print(f"[bold red]hetero-launch report:[/bold red] {escape(e.render())}", highlight=False,
                      soft_wrap=True)
        return 2
    except OSError as e:  # a file of a rank.<N>/ that cannot be read, a full disk: OUT was removed again
        console.print(f"[bold red]hetero-launch report:[/bold red] the run dirs cannot be copied into "
                      f"{escape(str(out or default_out(paths[0])))} ({escape(str(e))}); nothing was written. Make "
                      f"their files readable, or free space there, and run it again.", highlight=False, soft_wrap=True)
        return 2
    sources = ", ".join(f"{m['dir']} (node {m['node_rank'] if m['node_rank'] is not None else '?'}: rank "
                        f"{', '.join(map(str, m['ranks']))})" for m in summary["merged_from"])
    console.print(f"merged {sources} into {merged.path}", highlight=False, soft_wrap=True)
    for line in summary.get("damaged", ()):
        console.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
    for key, said in summary.get("disagreements", {}).items():
        console.print(f"[yellow]the nodes disagree on {key}: "
                      f"{escape('; '.join(f'{d}: {v}' for d, v in said.items()))}[/yellow]", soft_wrap=True)
    return report(merged.path, console)


USAGE = ("usage: hetero-launch report RUN_DIR\n"
         "       hetero-launch report RUN_DIR RUN_DIR ... [--into OUT]\n\n"
         "  one run dir (e.g. log_output/latest): its summary table, loss.png and throughput.png\n"
         "  several (cluster.launch=elastic: each node's run dir, e.g. scp -r node1:log_output/latest node1-run): "
         "checked,\n  copied into one new run dir OUT (default <first RUN_DIR>-merged, beside it; never overwritten), "
         "then reported")


def report_command(args: list[str], console: Console) -> int:
    """``hetero-launch report`` with its arguments: one run dir is reported, several are merged first."""
    into = None
    for i, a in enumerate(args):
        if a == "--into" and i + 1 < len(args):
            args, into = args[:i] + args[i + 2 :], args[i + 1]
            break
        if a.startswith("--into="):
            args, into = args[:i] + args[i + 1 :], a.split("=", 1)[1]
            break
    wrong = ("no run dir given" if not args else "--into needs a folder" if into == "" or "--into" in args else
             f"{next(a for a in args if a.startswith('-'))}: not an option of report (--into OUT is)"
             if any(a.startswith("-") for a in args) else
             "--into merges several run dirs: give two or more" if into is not None and len(args) < 2 else "")
    if wrong:
        Console(stderr=True).print(f"hetero-launch report: {wrong}.\n\n{USAGE}", highlight=False, soft_wrap=True)
        return 2
    if len(args) == 1:
        from launcher.report.plots import report

        return report(Path(args[0]), console)
    return report_merged([Path(a) for a in args], Path(into) if into else None, console)
