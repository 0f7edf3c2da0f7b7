"""SIDE EFFECTS: make the run dir, build DeepSpeed ops once, have the backend start the ranks, supervise,
summarise."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import time

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from launcher.backends import Backend, JobConfig, backend
from launcher.errors import ConfigError, first_line
from launcher.facts.preflight import newest_intact_checkpoint
from launcher.launch.record import write_rank_env
from launcher.lifeline import LAUNCHER_SIGNALS
from launcher.launch.run_records import report_run, start_run_dir, write_records
from launcher.plan import RunPlan
from launcher.plan.ranks import on_node, rank_table
from launcher.rundir import RunDir

__all__ = ["launch_run", "write_dry_run"]


def write_dry_run(cfg: DictConfig, plan: RunPlan, argv: list[str] | None = None) -> RunDir:
    """The run dir of a dry run: every file a real run starts with (rank_env.json with the planned port), no process;
    with cluster.launch=slurm also job.sbatch, which runs argv (the command's arguments) inside an allocation."""
    run_dir = start_run_dir(cfg, plan)
    write_rank_env(run_dir, {r.rank: r.env for r in plan.ranks})
    backend(cfg.cluster.launch).write_dry_run(run_dir, plan, list(argv or []), cfg.output.log_dir)
    return run_dir


def _raise_signal(signum: int, _frame) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


def _bind_store(plan: RunPlan):
    """The launcher's rendezvous store on the planned address and port; a port in use or an address this host cannot
    bind is bad input (exit 2), found before the run dir or any rank exists (the plan checked the address already:
    launch/planning.py check_local_address)."""
    from torch.distributed import DistNetworkError

    from launcher.launch.store import host_store

    env = plan.ranks[0].env
    try:
        return host_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    except (OSError, DistNetworkError) as e:
        port = f"cluster.master_port={env['MASTER_PORT']}"
        raise ConfigError(f"{port} on cluster.master_addr={env['MASTER_ADDR']}: the launcher cannot listen there "
                          f"({first_line(e)}). The port is in use or the address is not this host's: set "
                          f"cluster.master_port=0 (a free port, the default) or another port.") from None


def launch_run(cfg: DictConfig, plan: RunPlan, console: Console) -> int:
    """Run the plan's ranks of this host; returns the launcher's exit code (0 = every rank finished).

    One path whichever backend starts the ranks: the backend says it can (``check_ready``) and reads what it needs
    (``job_config``), the launcher hosts the store, makes the run dir, and each attempt asks the backend to ``start``
    the ranks and supervises the job it returns, in one attempt loop (launch/attempt.py ``run_attempts``) whose
    world comes from the plan, or, for a backend whose launchers meet at a rendezvous every round
    (``launcher_per_host``: elastic), from that round (launch/elastic_agent.py)."""
    # torch elastic logs each SIGTERM it sends and each failure; the failure report below says it once, better.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    for sig in LAUNCHER_SIGNALS:  # as torch elastic does once the ranks start: an exception, not death
        signal.signal(sig, _raise_signal)
    b = backend(cfg.cluster.launch)
    try:
        if b.launcher_per_host:  # torch elastic's c10d rendezvous, restarts on it
            from launcher.launch.elastic_agent import launch_elastic

            return launch_elastic(cfg, plan, console)
        return _launch(cfg, plan, console, b)
    except OSError as e:  # a full disk or a vanished log dir between the ranks' attempts: said, not a traceback
        console.print(f"[red]the launcher cannot go on: {escape(e.strerror or str(e))}"
                      f"{escape(f' ({e.filename})') if e.filename else ''}. Every rank it started has ended; what "
                      f"was written is in {escape(str(cfg.output.log_dir))}.[/red]", soft_wrap=True)
        return 1


def _launch(cfg: DictConfig, plan: RunPlan, console: Console, b: Backend) -> int:
    """Bad input first (the backend cannot start here, the store cannot listen), then the run dir and the run."""
    b.check_ready(dict(os.environ))  # e.g. mpirun / srun is there, srun in an allocation
    config = b.job_config(cfg, dict(os.environ))
    store = _bind_store(plan)  # held open for the whole run: the ranks rendezvous on it; a busy port stops us
    stores = [store]  # the one reference: a restart replaces the store (stores[0]), and the old one must go first
    del store
    run_dir = start_run_dir(cfg, plan)
    feed = None
    if (getattr(plan, "uses", None) or {}).get("trainer"):  # HF Trainer's metrics come back through its callback
        from launcher.integrations.hf_trainer import TrainerFeed

        feed = TrainerFeed(run_dir, [r.rank for r in plan.ranks], plan.loggers)
        plan = dataclasses.replace(plan, ranks=tuple(dataclasses.replace(r, env={**r.env, **feed.env})
                                                     for r in plan.ranks))
    try:
        return _launch_in(cfg, plan, console, b, config, stores, run_dir)
    finally:
        if feed is not None:
            feed.close()


def _launch_in(cfg: DictConfig, plan: RunPlan, console: Console, b: Backend, config: JobConfig, stores: list,
               run_dir: RunDir) -> int:
    from launcher.launch.attempt import run_attempts
    from launcher.launch.ops import build_ops
    from launcher.launch.supervise import SignalException
    from launcher.report.summary import build_summary

    console.print(f"run dir: {run_dir.path}")
    if getattr(plan, "resume_from", ""):
        from launcher.report.runs import resumed_from

        where = resumed_from(plan.resume_from)
        console.print(f"resuming from {where['path']} (step {where['step']})")
    t0 = time.monotonic()
    try:
        build_ops(plan, run_dir, console)
    except (RuntimeError, KeyboardInterrupt, SignalException) as e:
        interrupted = not isinstance(e, RuntimeError)
        signum = e.sigval if isinstance(e, SignalException) else signal.SIGINT
        console.print("[yellow]interrupted while building DeepSpeed's ops; no rank started[/yellow]" if interrupted
                      else f"[red]{e}[/red]")
        exits = [{"rank": r.rank, "exit_code": None} for r in on_node(plan.ranks, 0)]
        summary = build_summary(run_dir, plan.to_dict(), exits, "interrupted" if interrupted else "failed",
                                time.monotonic() - t0)
        write_records(run_dir, summary, cfg.output.stderr_tail, console)
        return 128 + signum if interrupted else 1
    if config.hosts:  # the rank table of the hosts the backend starts the ranks on (mpirun's, srun's)
        run_dir.write_json(run_dir.rank_table, rank_table(plan.ranks, list(config.hosts)))
    world = _PlannedWorld(cfg, plan, run_dir, stores, console, b, config)
    attempts = run_attempts(world, int(cfg.launcher.max_restarts), float(cfg.launcher.watchdog_s), console,
                            cfg.output.console)
    return report_run(cfg, plan, run_dir, attempts, time.monotonic() - t0, console)


@dataclasses.dataclass
class _PlannedWorld:
    """The plan's own hosts (every backend but elastic): each attempt on the same ranks; a restart resumes from the
    run's newest complete checkpoint (a script's from its start: it keeps its own checkpoints) with a fresh store;
    each attempt's ranks started by the backend (``b.start``: this host's, or every rank for mpirun/srun)."""

    cfg: DictConfig
    plan: RunPlan
    run_dir: RunDir
    stores: list
    console: Console
    b: Backend
    config: JobConfig
    meets = False

    def next_round(self, number: int, last):
        from launcher.launch.attempt import Round
        from launcher.launch.store import rank_envs

        max_restarts = int(self.cfg.launcher.max_restarts)
        if number:
            self.stores[0] = None  # the old store goes before the next one listens (on the same port, when given)
            self.plan, self.stores[0] = _prepare_restart(self.plan, self.run_dir, last, number, max_restarts,
                                                         self.console)
            if self.stores[0] is None:
                return None
        envs = rank_envs(self.plan, self.run_dir, self.stores[0].port, number, max_restarts,
                         node=None if self.b.starts_every_rank else 0)
        write_rank_env(self.run_dir, envs)
        return Round(self.plan, envs, functools.partial(self.b.start, self.config))

    def ran(self, attempt) -> None:
        pass

    def again(self, attempt, restarts_left: int) -> bool:
        return True

    def interrupted(self, signum: int) -> None:
        pass


def _prepare_restart(plan: RunPlan, run_dir: RunDir, attempt, restart: int, max_restarts: int, console: Console):
    """The next attempt's (plan, store): its plan resumes from the newest complete checkpoint, the last attempt's
    rank dirs move to attempt.<k>/, and a new store listens (as torchrun makes one per restart: no key of the last
    attempt is seen), on the planned port (an explicit one is free again once the old store is gone). (plan, None):
    no restart (the last checkpoint is the end, or the port is taken)."""
    from launcher.launch.attempt import archive_attempt
    from launcher.launch.store import host_store

    newest = newest_intact_checkpoint(run_dir, console)
    if hasattr(plan, "resume_from") and newest is not None:
        if newest[1] >= plan.steps:
            return plan, None  # the last checkpoint is the end: only what came after it failed
        plan = dataclasses.replace(plan, resume_from=str(newest[0].path))
    archive_attempt(run_dir, attempt.number, [r.rank for r in plan.ranks])
    run_dir.write_json(run_dir.plan, plan.to_dict())
    console.print(f"[yellow]attempt {attempt.number} {attempt.status}; restart {restart} of {max_restarts} from "
                  f"{getattr(plan, 'resume_from', '') or 'the start'} (its logs: "
                  f"{run_dir.attempt(attempt.number).path})[/yellow]")
    try:
        return plan, host_store(plan.ranks[0].env["MASTER_ADDR"], int(plan.ranks[0].env["MASTER_PORT"]))
    except OSError as e:
        console.print(f"[red]no restart: the rendezvous store cannot listen again ({e}); set "
                      f"cluster.master_port=0 for a free port[/red]")
        return plan, None
