"""Sweeps (``-m``, Hydra's multirun with its basic sweeper's semantics) and ``check``: many jobs, planned first.

Every job is composed and planned before the first one starts, so a bad value in job 5 fails the sweep in the
first second. Then the jobs run in turn, each in its own run dir under one sweep dir (``<log_dir>/<sweep_id>/<n>/``,
``<log_dir>/latest`` -> the sweep); a failed job does not stop the others; the sweep ends with a table and
``sweep.json`` and exits 1 if any job failed (128 + the signal when interrupted: the jobs after it do not start).
``check`` plans the jobs and starts nothing: with no recipe given, every recipe there is."""

from __future__ import annotations

import itertools
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from launcher.config import compose_config
from launcher.errors import ConfigError, first_line
from launcher.launch.planning import plan_run
from launcher.plan import RunPlan
from launcher.rundir import RunDir, SweepDir, create_sweep_dir, point_latest


@dataclass
class Job:
    number: int
    overrides: list[str]
    """The job's own overrides, as the sweep expanded them."""
    cfg: DictConfig
    plan: RunPlan


def expand_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep, as Hydra's basic sweeper makes them: the cartesian product of every swept override
    (key=a,b / range(0,3) / choice(...)), read by Hydra's public override parser; the first override of a key sets
    its place in each job, a later one of the same key its values."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise ConfigError(f"could not expand the sweep: {first_line(e)}. {SWEEP_FORMS}") from None
    values: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if not o.is_sweep_override():
            values[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            try:
                values[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            except HydraException:  # glob() lists a group's options through a sweeper's config loader
                raise ConfigError(f"could not expand the sweep: {o.input_line}. {SWEEP_FORMS}") from None
        else:
            raise ConfigError(f"could not expand the sweep: {o.input_line} is a range to search, not a list of "
                              f"values. {SWEEP_FORMS}")
    return [list(job) for job in itertools.product(*values.values())]


SWEEP_FORMS = ("A sweep takes key=a,b, key=range(0,3) or key=choice(a,b) (interval() and glob() need a sweeper "
               "plugin, which a sweep here does not use).")


def every_recipe(config_dir: str | None) -> list[str]:
    from launcher.config import user_recipes
    from launcher.recipes import RECIPES

    return [*sorted(RECIPES), *user_recipes(config_dir)]


def plan_jobs(jobs: list[list[str]], config_dir: str | None, sweep_dir: Path | None = None) -> list[Job]:
    """Compose and plan every job (in a sweep dir: job n's run dir is <sweep_dir>/<n>); ConfigError naming the job
    of each problem, before anything starts."""
    planned, problems = _plan_each(jobs, config_dir, sweep_dir)
    if problems:
        raise ConfigError(problems)
    return planned


def _plan_each(jobs: list[list[str]], config_dir: str | None, sweep_dir: Path | None = None,
               estimate: bool = True) -> tuple[list[Job], list[str]]:
    """(the jobs that plan, the problems of the others, each naming its job): one bad job never stops the rest."""
    from launcher.facts.host import probe_host  # at call time, as cli.py does: one place to stand a host in for

    host = probe_host()
    planned, problems = [], []
    for n, overrides in enumerate(jobs):
        where = [f"output.log_dir={sweep_dir}", f"output.run_name={n}"] if sweep_dir is not None else []
        try:
            cfg = compose_config([*overrides, *where], config_dir)
            plan, _ = plan_run(cfg, host, config_dir, estimate)
        except ConfigError as e:
            problems += [f"job {n} ({' '.join(overrides)}): {p}" for p in e.problems]
            continue
        planned.append(Job(n, overrides, cfg, plan))
    return planned, problems + _shared_checkpoint_dirs(planned)


def _shared_checkpoint_dirs(jobs: list[Job]) -> list[str]:
    """Jobs given one trainer.checkpoint_dir: the second would write over the first's checkpoints (and be refused,
    after the first trained, by launch/record.py check_checkpoint_dir_free)."""
    first: dict[Path, int] = {}
    problems = []
    for j in jobs:
        folder = j.cfg.trainer.checkpoint_dir
        where = Path(folder).resolve() if folder else None
        if where in first:
            problems.append(f"job {j.number} ({' '.join(j.overrides)}): trainer.checkpoint_dir={folder} is job "
                            f"{first[where]}'s too, whose checkpoints it would write over. Give each job its own "
                            f"folder (e.g. sweep over trainer.checkpoint_dir too), or leave it unset: each job's run "
                            f"dir keeps its checkpoints.")
        elif where is not None:
            first[where] = j.number
    return problems


def check_jobs(overrides: list[str], config_dir: str | None, console: Console) -> int:
    """``hetero-launch check``: plan every job, start nothing; 0 when all plan, else 2 with every problem (after the
    table of the jobs that do plan: a broken recipe in the folder does not hide the others)."""
    t0 = time.monotonic()
    if not any(o.split("=")[0].lstrip("+") in ("recipe", "script") for o in overrides):
        overrides = [f"recipe={','.join(every_recipe(config_dir))}", *overrides]
    expanded = expand_jobs(overrides)
    jobs, problems = _plan_each(expanded, config_dir, estimate=False)
    if problems and not jobs:
        raise ConfigError(problems)
    bad = len(expanded) - len(jobs)
    failed = f"; {bad} {'does' if bad == 1 else 'do'} not (below)" if problems else ""
    table = Table(title=f"check: {len(jobs)} job(s) plan{failed}, nothing started ({time.monotonic() - t0:.2f} s)")
    for col in ("job", "overrides", "engine", "ranks", "steps"):
        table.add_column(col)
    for j in jobs:
        table.add_row(str(j.number), " ".join(j.overrides), getattr(j.plan, "engine", "script"),
                      str(j.plan.world_size), str(j.plan.steps or "-"))
    console.print(table)
    if problems:
        raise ConfigError(problems)
    return 0


def run_sweep(overrides: list[str], config_dir: str | None, console: Console) -> int:
    """``hetero-launch -m ...``: plan every job, then run them in turn (or write their dry runs)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException  # what SIGTERM raises (launch_run)

    from launcher.launch import launch_run, write_dry_run

    t0 = time.monotonic()
    jobs_overrides = expand_jobs(overrides)
    for key in ("output.run_name", "output.log_dir"):
        values = {o.split("=", 1)[1] for job in jobs_overrides for o in job if o.lstrip("+").startswith(key + "=")}
        if key == "output.run_name" and values:
            raise ConfigError("output.run_name with -m: each job's run dir is <sweep dir>/<job number>. Drop "
                              "output.run_name (output.log_dir picks where the sweep dir goes).")
        if len(values) > 1:
            raise ConfigError(f"output.log_dir takes one value in a sweep (got {', '.join(sorted(values))}): all "
                              f"jobs go into one sweep dir. Give one output.log_dir.")
    try:
        log_dir = Path(compose_config(jobs_overrides[0], config_dir).output.log_dir)
    except ConfigError:  # job 0 is bad: plan_jobs below reports it with every other job's problems
        log_dir = Path("log_output")
    made_log_dir = not log_dir.exists()
    sweep = create_sweep_dir(log_dir)
    try:
        jobs = plan_jobs(jobs_overrides, config_dir, sweep.path)  # every job checked before the first starts
    except ConfigError:
        sweep.path.rmdir()  # still empty: a sweep that never started leaves nothing behind
        if made_log_dir:
            log_dir.rmdir()
        raise
    console.print(f"sweep {sweep.path}: {len(jobs)} job(s), all planned")
    point_latest(log_dir, sweep)
    results = []
    try:
        for j in jobs:
            console.rule(f"job {j.number}/{len(jobs) - 1}: {' '.join(j.overrides)}")
            started = time.monotonic()
            if j.cfg.dry_run:
                run_dir, code = write_dry_run(j.cfg, j.plan), 0
            else:
                code = launch_run(j.cfg, j.plan, console)
                run_dir = RunDir(sweep.path / str(j.number))
            results.append(_result(j, run_dir, code, time.monotonic() - started))
            if code > 128:  # interrupted by a signal (130 Ctrl-C, 143 SIGTERM)
                break
    except (KeyboardInterrupt, SignalException) as e:  # between jobs (a job's own run handles it: 128 + signal)
        code = 128 + (e.sigval if isinstance(e, SignalException) else signal.SIGINT)
        console.print("[yellow]interrupted: the jobs after this one do not start[/yellow]")
        results.append({"job": jobs[len(results)].number, "overrides": jobs[len(results)].overrides,
                        "status": "interrupted", "exit_code": code})
    for j in jobs[len(results):]:
        results.append({"job": j.number, "overrides": j.overrides, "status": "not run", "exit_code": None})
    failed = [r for r in results if r["exit_code"] != 0]
    signalled = [r["exit_code"] for r in results if (r["exit_code"] or 0) > 128]
    code = signalled[0] if signalled else (1 if failed else 0)
    sweep.write({"sweep_id": sweep.name, "status": "ok" if code == 0 else "failed", "exit_code": code,
                 "wall_s": round(time.monotonic() - t0, 2), "jobs": results})
    console.print(_table(sweep, results, time.monotonic() - t0))
    console.print(f"sweep: {sweep.json}")
    return code


def _result(job: Job, run_dir: RunDir, code: int, wall: float) -> dict:
    summary = run_dir.read_summary() or {}
    return {"job": job.number, "overrides": job.overrides, "run_dir": str(run_dir.path), "exit_code": code,
            "status": summary.get("status", "dry run" if job.cfg.dry_run else "failed"),
            "final_loss": summary.get("final_loss"), "eval": summary.get("eval") or {}, "wall_s": round(wall, 2)}


def _table(sweep: SweepDir, results: list[dict], wall: float) -> Table:
    t = Table(title=f"sweep {sweep.path.name}: {sum(r['exit_code'] == 0 for r in results)}/{len(results)} ok "
                    f"in {wall:.1f} s")
    for col in ("job", "overrides", "status", "final loss", "eval", "wall s"):
        t.add_column(col)
    for r in results:
        ev = r.get("eval") or {}
        metric = f"auc {ev['auc']:.4f}" if "auc" in ev else (f"loss {ev['loss']:.4f}" if "loss" in ev else "-")
        loss = r.get("final_loss")
        t.add_row(str(r["job"]), " ".join(r["overrides"]), r["status"], "-" if loss is None else f"{loss:.4f}",
                  metric, f"{r.get('wall_s', 0):.1f}" if r.get("wall_s") is not None else "-")
    return t
