"""``hetero-launch report <run_dir>``: the summary table, loss.png and throughput.png, also for a failed run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from launcher.report.summary import build_summary, summary_table
from launcher.rundir import RunDir, SweepDir


def load_summary(run_dir: RunDir) -> dict:
    """summary.json, or (when the launcher itself died) one rebuilt from the ranks' records."""
    summary = run_dir.read_summary()
    if summary is not None:
        return summary
    plan = run_dir.read_plan()
    exits = [{"rank": r["rank"], "exit_code": None} for r in plan["ranks"]]
    return build_summary(run_dir, plan, exits, "unknown (no summary.json: the launcher did not finish)", 0.0)


def write_plots(run_dir: RunDir, summary: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["rank"] for r in summary["ranks"]]
    records = {r: run_dir.rank(r).read_metrics() for r in ranks}
    steps = {r: [m for m in recs if "event" not in m] for r, recs in records.items()}
    evals = [m for m in records.get(0, []) if m.get("event") == "eval"]
    title = f"{summary['run_id']} ({summary['status']})"
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r, recs in steps.items():
        if recs:
            ax.plot([m["step"] for m in recs], [m.get("local_loss", m["loss"]) for m in recs], lw=1, alpha=0.8,
                    label=f"rank {r} (its own batches)")
    if steps.get(0):
        ax.plot([m["step"] for m in steps[0]], [m["loss"] for m in steps[0]], color="black", lw=2,
                label="mean over ranks")
    floor = (summary.get("reference") or {}).get("entropy_floor")
    if floor is not None:
        ax.axhline(floor, ls="--", color="gray", label=f"entropy floor {floor:.3f} (the best any model can do)")
    if evals:
        ax.scatter([m["step"] for m in evals], [m["loss"] for m in evals], marker="D", s=50, color="red", zorder=5,
                   label="eval loss (held-out)")
        last = evals[-1]
        if "auc" in last:
            extra = f", bayes {last['bayes_auc']:.4f}" if "bayes_auc" in last else ""
            ax.annotate(f"AUC {last['auc']:.4f}{extra}", (last["step"], last["loss"]), textcoords="offset points",
                        xytext=(-10, 12), ha="right", color="red")
    ax.set(xlabel="step", ylabel="training loss", title=f"loss — {title}")
    written.append(_save(plt, fig, ax, run_dir.plot("loss")))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r, recs in steps.items():
        recs = [m for m in recs if "samples_per_s" in m]  # a script's runtime.log may not give it
        if recs:
            ax.plot([m["step"] for m in recs], [m["samples_per_s"] for m in recs], marker=".", lw=1, label=f"rank {r}")
    ax.set(xlabel="step", ylabel="samples/s (all ranks together)", title=f"throughput — {title}", ylim=(0, None))
    written.append(_save(plt, fig, ax, run_dir.plot("throughput")))
    return written


def _save(plt, fig, ax, path: Path) -> Path:
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(path: Path, console: Console) -> int:
    run_dir = RunDir(path)
    if not run_dir.plan.exists() and SweepDir(path).json.exists():
        console.print(f"[red]hetero-launch report: {path} is a sweep; its table is in {SweepDir(path).json}. Report "
                      f"one of its jobs, e.g. {path}/0.[/red]")
        return 2
    if not run_dir.plan.exists():
        console.print(f"[red]hetero-launch report: {path} is not a run dir (no plan.json). "
                      f"Give one under log_output/, e.g. log_output/latest.[/red]")
        return 2
    summary = load_summary(run_dir)
    console.print(summary_table(summary))
    if run_dir.read_plan().get("kind") == "script":
        console.print("a script run has no metrics to plot")
        return 0
    for path in write_plots(run_dir, summary):
        console.print(f"wrote {path}")
    return 0
