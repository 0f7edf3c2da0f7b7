"""``hetero-launch report <run_dir>``: the summary table, loss.png and throughput.png, also for a failed run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from launcher.report.damage import checked_plan, checked_summary, damaged_line
from launcher.report.runs import is_dry_run, latest_trained
from launcher.report.summary import build_summary, read_records, summary_table
from launcher.rundir import RunDir, SweepDir


def load_summary(run_dir: RunDir, plan: dict | None, damaged: list[str]) -> tuple[dict | None, bool]:
    """(summary.json, or (when the launcher died before writing it, or it is damaged) one rebuilt from the ranks'
    records, its status saying which; whether it was rebuilt). The ranks are the plan's, or (``plan`` None: its
    plan.json is damaged) the rank.<N>/ folders there; None when there are none. A plan whose fields do not read
    (another shape) is left out of the rebuilt summary, and ``damaged`` gets a line that says so."""
    summary, why = checked_summary(run_dir)
    if summary is not None:
        return summary, False
    # why: empty or cut short (a disk that filled up while an older version wrote it in place), another shape
    status = f"unknown (summary.json is damaged: {why}; rebuilt from the ranks' records)" if why else \
        launcher_state(run_dir)
    ranks = [r["rank"] for r in plan["ranks"]] if plan is not None else run_dir.ranks_on_disk()
    if plan is None and not ranks:
        return None, True
    exits = [{"rank": r, "exit_code": None} for r in ranks]
    try:
        return build_summary(run_dir, plan or {}, exits, status, 0.0), True
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a field of plan.json that has another shape
        damaged.append(damaged_line(run_dir.plan, f"a field the summary reads has another shape ({type(e).__name__}: "
                                    f"{e})", "the summary is rebuilt without it"))
        return build_summary(run_dir, {}, exits, status, 0.0), True


def launcher_state(run_dir: RunDir) -> str:
    """The status of a run dir without a summary: its launcher still runs, or it died without writing one."""
    import socket

    if is_dry_run(run_dir):
        return "dry run (dry_run=true wrote this plan: nothing was started or trained)"
    try:
        record = run_dir.read_json(run_dir.launcher)
        host, pid = str(record["host"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown (no summary.json: the launcher did not finish)"
    if host == socket.gethostname():
        try:
            alive = b"launcher" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            alive = False
        if alive:
            return f"running (no summary.json yet: its launcher, pid {pid}, still runs)"
        return (f"lost (no summary.json: its launcher, pid {pid} on {host}, is gone: killed by a signal it cannot "
                f"catch, SIGKILL or the OOM killer; its ranks died with it)")
    return f"unknown (no summary.json; its launcher ran on {host}, pid {pid})"


def write_plots(run_dir: RunDir, summary: dict, skipped: list[str]) -> list[Path]:
    """loss.png and throughput.png from the ranks' metrics.jsonl, each only when some rank logged what it shows (a run
    whose ranks never started has neither); ``skipped`` gets a note per rank whose file had lines that do not read
    (read_records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["rank"] for r in summary["ranks"]]
    records = {}
    for r in ranks:
        records[r], note = read_records(run_dir.rank(r))
        if note:
            skipped.append(f"rank {r}: {note}")
    steps = {r: [m for m in recs if "event" not in m] for r, recs in records.items()}
    losses = {r: [m for m in recs if m.get("loss") is not None] for r, recs in steps.items()}  # a script may log none
    evals = [m for m in records.get(0, []) if m.get("event") == "eval" and m.get("loss") is not None]
    title = f"{summary['run_id']} ({summary['status']})"
    rates = {r: [m for m in recs if "samples_per_s" in m] for r, recs in steps.items()}  # a script may not give it
    written = []
    if any(losses.values()) or evals:
        written.append(_loss_plot(plt, run_dir, summary, losses, evals, title))
    if any(rates.values()):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r, recs in rates.items():
            if recs:
                ax.plot([m["step"] for m in recs], [m["samples_per_s"] for m in recs], marker=".", lw=1,
                        label=f"rank {r}")
        ax.set(xlabel="step", ylabel="samples/s (all ranks together)", title=f"throughput — {title}", ylim=(0, None))
        written.append(_save(plt, fig, ax, run_dir.plot("throughput")))
    return written


def _loss_plot(plt, run_dir: RunDir, summary: dict, losses: dict[int, list[dict]], evals: list[dict],
               title: str) -> Path:
    """loss.png: each rank's own loss, the mean over ranks, the entropy floor and the held-out evaluations."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r, recs in losses.items():
        if recs:
            ax.plot([m["step"] for m in recs], [m.get("local_loss", m["loss"]) for m in recs], lw=1, alpha=0.8,
                    label=f"rank {r} (its own batches)")
    if losses.get(0):
        ax.plot([m["step"] for m in losses[0]], [m["loss"] for m in losses[0]], color="black", lw=2,
                label="mean over ranks")
    floor = (summary.get("reference") or {}).get("entropy_floor")
    if floor is not None:
        ax.axhline(floor, ls="--", color="gray", label=f"entropy floor {floor:.3f} (the best any model can do)")
    if evals:
        ax.scatter([m["step"] for m in evals], [m["loss"] for m in evals], marker="D", s=50, color="red", zorder=5,
                   label="eval loss (held-out)")
        last = evals[-1]
        if last.get("auc") is not None:  # (null: a NaN)
            extra = f", bayes {last['bayes_auc']:.4f}" if last.get("bayes_auc") is not None else ""
            ax.annotate(f"AUC {last['auc']:.4f}{extra}", (last["step"], last["loss"]), textcoords="offset points",
                        xytext=(-10, 12), ha="right", color="red")
    ax.set(xlabel="step", ylabel="training loss", title=f"loss — {title}")
    return _save(plt, fig, ax, run_dir.plot("loss"))


def _save(plt, fig, ax, path: Path) -> Path:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(path: Path, console: Console) -> int:
    """The summary table and plots of one run dir; a damaged record (plan.json, summary.json, a rank's metrics.jsonl)
    is one line that says which and what is wrong, and the report goes on with the rest. 2 when it is no run dir,
    or nothing of it can be shown."""
    path, note = latest_trained(path)
    if note:
        console.print(note)
    run_dir = RunDir(path)
    if not run_dir.plan.exists() and SweepDir(path).json.exists():
        console.print(f"[red]hetero-launch report: {path} is a sweep; its table is in {SweepDir(path).json}. Report "
                      f"one of its jobs, e.g. {path}/0.[/red]")
        return 2
    if not run_dir.plan.exists():
        console.print(f"[red]hetero-launch report: {path} is not a run dir (no plan.json). "
                      f"Give one under log_output/, e.g. log_output/latest.[/red]")
        return 2
    plan, plan_why = checked_plan(run_dir)
    damaged = [damaged_line(run_dir.plan, plan_why, "the report goes on without it")] if plan_why else []
    summary, rebuilt = load_summary(run_dir, plan, damaged)
    for line in damaged:
        console.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
    if summary is None:
        why = checked_summary(run_dir)[1]
        summary_is = f"is damaged ({escape(why)})" if why else "is missing"
        console.print(f"[red]hetero-launch report: nothing of {escape(str(path))} can be shown: its plan.json is "
                      f"damaged ({escape(plan_why)}), its summary.json {summary_is}, "
                      f"and it has no rank.<N>/ folder to rebuild a summary from. Copy the run dir again from where "
                      f"the run wrote it, or report another run.[/red]", soft_wrap=True)
        return 2
    console.print(summary_table(summary))
    if (plan or {}).get("kind") == "script":
        console.print("a script run has no metrics to plot")
        return 0
    skipped: list[str] = []
    try:
        written = write_plots(run_dir, summary, skipped)
    except OSError as e:  # a run dir this user cannot write (a copy of another's)
        console.print(f"[red]hetero-launch report: the plots cannot be written into {escape(str(run_dir.path))} "
                      f"({escape(e.strerror or str(e))}). Copy the run dir somewhere you can write and report the "
                      f"copy.[/red]", soft_wrap=True)
        return 1
    if not rebuilt:  # (a rebuilt summary's table names them already)
        for line in skipped:
            console.print(f"[yellow]skipped: {escape(line)}[/yellow]", soft_wrap=True)
    for path in written:
        console.print(f"wrote {path}")
    if not written:
        console.print("no rank logged a step or an evaluation: nothing to plot (no loss.png, no throughput.png)")
    return 0
