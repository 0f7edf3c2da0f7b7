"""cluster.launch=elastic: one host's launcher as torch's elastic agent runs it (``SimpleElasticAgent._invoke_run``):
meet the other hosts at the c10d rendezvous, start this host's ranks, watch them; when a rank fails, a host is lost
(its ranks fail with lost peers) or a host waits to join (``num_nodes_waiting() > 0``), stop the ranks and meet
again (``handler.next_rendezvous()``, ``_restart_workers``) on whatever hosts are there, MIN to MAX of
cluster.nnodes=MIN:MAX.

What torch's agent leaves to the user's script is done here: each round is planned again for its world (the global
batch kept, the micro-batch or gradient accumulation adjusted by the plan's batch solver; a world that cannot
hold the job is refused before any rank starts, for every size of the range), and resumes from the newest intact
checkpoint, which the worker reshards onto the new layout (DCP; issue 19). Each restart, whatever its cause, counts
against launcher.max_restarts (torch's agent does not count admissions: here a host that comes and goes cannot
restart a job forever). summary.json's ``attempts`` says of each: who left and joined, the world, the step it resumed
from and the time lost (from the failure to the first step of the next attempt).

Imported only by the launcher (torch, the rendezvous), never by the plan."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import time
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace

from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launcher.errors import ConfigError
from launcher.plan import HostFacts, RunPlan
from launcher.plan.nodes import node_range
from launcher.rundir import RunDir

__all__ = ["ElasticPlans", "launch_elastic"]


class ElasticPlans:
    """The plan of each world the job may run on (cluster.nnodes=MIN:MAX): the same config for that many hosts, with
    the global batch of the plan for MAX kept and the round's checkpoint to resume from. The accumulation is kept and
    the micro-batch inferred first: a global micro-batch (micro × dp) kept is what a resume needs to go on with the
    same data (the checkpoint's data position counts global micro-batches; check_resume refuses another); else the
    micro-batch is kept and the accumulation inferred (a world that starts from scratch)."""

    def __init__(self, cfg: DictConfig, host: HostFacts, first: RunPlan) -> None:
        self.cfg, self.host, self.first = cfg, host, first

    def plan(self, nnodes: int, resume_from: str) -> RunPlan:
        """The plan for ``nnodes`` hosts resuming from ``resume_from`` ('' = the start); ConfigError with the reason
        when the job does not fit that world."""
        from launcher.launch.planning import plan_run

        b = self.first.batch
        tries = [("grad_accum", b.grad_accum, "micro_size"), ("micro_size", b.micro_size, "grad_accum")]
        problems: list[str] = []
        for kept, value, inferred in tries:
            cfg = self.cfg.copy()
            cfg.cluster.nnodes = nnodes
            cfg.batch.global_size, cfg.batch[kept], cfg.batch[inferred] = b.global_size, value, -1
            if "micro_batches" in cfg.batch:
                cfg.batch.micro_batches = -1
            cfg.trainer.resume, cfg.trainer.resume_from = "", resume_from
            try:
                # The first plan's code paths: a recipe from --config-dir was made importable by the first
                # planning, and its ranks find its folder by them (re-planning knows only this config).
                return dataclasses.replace(plan_run(cfg, self.host)[0], code_paths=self.first.code_paths)
            except ConfigError as e:
                problems += [p for p in e.problems if p not in problems]
        raise ConfigError([f"cluster.nnodes={self.cfg.cluster.nnodes}: the job cannot run on {nnodes} host(s) "
                           f"({nnodes} × {self.first.nproc_per_node} ranks, global batch {b.global_size} kept): "
                           + " ".join(problems) + f" Raise MIN of cluster.nnodes above {nnodes}, or change the "
                           f"intents so that {nnodes} host(s) hold the job."])

    def check_range(self) -> None:
        """Every world of MIN..MAX plans (from the start): refused before any host meets, never at a restart."""
        lo, hi = node_range(self.cfg.cluster.nnodes)
        for n in range(lo, hi):
            self.plan(n, self.first.resume_from)


def _resume_choice(run_dir: RunDir, cfg: DictConfig, number: int, own: str, console: Console) -> dict:
    """Node 0's decision for the round: the newest intact checkpoint of the job (by step), or the plan's own
    resume_from on the first attempt (or when none was written yet)."""
    from launcher.facts.preflight import newest_intact_checkpoint

    if number == 0:
        from launcher.errors import ConfigError
        from launcher.launch.record import check_checkpoint_dir_free

        try:  # the job's own folder, unless it goes on from one of its checkpoints (as every other launch)
            if cfg.trainer.checkpoint_dir:
                check_checkpoint_dir_free(cfg.trainer.checkpoint_dir, own)
        except ConfigError as e:
            return {"error": str(e.problems[0])}
        return {"step": None, "path": own}
    newest = newest_intact_checkpoint(run_dir, console)
    if newest is None:
        return {"step": None, "path": own}
    return {"step": newest[1], "path": ""}


def _resume_path(run_dir: RunDir, cfg: DictConfig, choice: dict) -> str:
    """The path of the chosen checkpoint as every node names it (the shared folder's, so that plans agree)."""
    if choice["step"] is None:
        return choice["path"]
    root = Path(cfg.trainer.checkpoint_dir) if cfg.trainer.checkpoint_dir else run_dir.checkpoints
    return str(root / f"step{choice['step']}")


def _first_step_time(run_dir: RunDir, ranks) -> float | None:
    """When the first step of this node's attempt was logged (the wall clock of its lowest rank's first record)."""
    with suppress(OSError, ValueError):
        for line in run_dir.rank(min(ranks)).metrics.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec and "time" in rec:
                return float(rec["time"])
    return None


def _failed_at(attempt) -> float:
    """The wall clock of the attempt's end as this launcher saw it: when a lost host was last heard from, else its
    first rank that ended on its own, else now."""
    lost = attempt.remote_failure or {}
    if isinstance(lost.get("last_heard"), (int, float)):
        return float(lost["last_heard"])
    seen = [e.seen_s for e in attempt.outcome.exits if e.seen_s is not None and e.exit_code not in (0, None)]
    return time.time() - (time.monotonic() - min(seen)) if seen else time.time()


def attempts_table(records: list[dict]) -> Table:
    """The console's list of attempts: who left or joined, the world, the step resumed from, the time lost."""
    t = Table(title="attempts (cluster.launch=elastic)")
    for col in ("attempt", "status", "hosts", "world", "resumed from step", "left", "joined", "time lost"):
        t.add_column(col, justify="right")
    for r in records:
        lost = "-" if r.get("time_lost_s") is None else f"{r['time_lost_s']:.1f} s"
        t.add_row(str(r["attempt"]), r["status"], str(r.get("nnodes", "-")), str(r.get("world_size", "-")),
                  str(r.get("resumed_step") or 0), escape(", ".join(r.get("left", [])) or "-"),
                  escape(", ".join(r.get("joined", [])) or "-"), lost)
    return t


def launch_elastic(cfg: DictConfig, plan: RunPlan, console: Console) -> int:
    """Run this host's part of an elastic job; returns the launcher's exit code (0 = the job finished). Bad input
    (a world of the range that cannot hold the job) is a ConfigError before this host meets any other; restarts with
    no shared checkpoints were refused by the plan (plan/nodes.py checkpoint_problems)."""
    from launcher.facts.host import probe_host
    from launcher.launch.rendezvous import rendezvous_handler
    from launcher.launch.reach import address_problems, rendezvous_problems

    if problems := address_problems(cfg) + rendezvous_problems(cfg):
        raise ConfigError(problems)
    host = probe_host()
    plans = ElasticPlans(cfg, host, plan)
    plans.check_range()
    lo, hi = node_range(cfg.cluster.nnodes)
    t0 = time.monotonic()
    from torch.distributed.elastic.multiprocessing.api import SignalException  # launcher/launch/__init__.py's

    try:
        handler = rendezvous_handler(cfg)
    except RuntimeError as e:
        console.print(f"[red]{escape(str(e))}[/red]", soft_wrap=True)
        return _never_met(cfg, plan, str(e), None, time.monotonic() - t0, console)
    except SignalException as e:  # stopped while torch's client waited for the endpoint
        said = f"interrupted by {signal.Signals(e.sigval).name} while reaching cluster.rdzv_endpoint"
        console.print(f"[red]{said}={escape(str(cfg.cluster.rdzv_endpoint))}[/red]", soft_wrap=True)
        return _never_met(cfg, plan, said, int(e.sigval), time.monotonic() - t0, console)
    console.print(f"waiting for {lo if lo == hi else f'{lo} to {hi}'} node(s) at cluster.rdzv_endpoint="
                  f"{cfg.cluster.rdzv_endpoint} ...")
    agent = _Agent(cfg, plans, host, handler, console)
    try:
        agent.run()
    finally:
        if agent.group is not None:
            agent.group.finish()
        else:
            with suppress(Exception):  # a store already gone: nothing is left to close
                handler.shutdown()
    return agent.report(time.monotonic() - t0)


@dataclasses.dataclass
class _Agent:
    """The restart loop of one host (SimpleElasticAgent._invoke_run): rounds until one ends ok, interrupted, or
    with no restart left."""

    cfg: DictConfig
    plans: ElasticPlans
    host: HostFacts
    handler: object
    console: Console
    run_dir: RunDir | None = None
    """Made once the first round met (a rendezvous that never completes: by ``_never_met``, with its summary)."""
    signum: int | None = None
    group: object = None
    plan: RunPlan | None = None
    last_hosts: list | None = None
    """The hosts of the last round that ran (None before the first)."""
    failed_at: float | None = None
    """When the last round's attempt ended, as this launcher saw it (_failed_at): the next record's time lost."""
    attempts: list = dataclasses.field(default_factory=list)
    records: list = dataclasses.field(default_factory=list)
    error: str = ""
    """Why the job stopped between two rounds (a rendezvous that failed, a world that cannot hold the job)."""

    meets = True
    """Each round is met at the rendezvous: an interrupt while meeting ends the job, recorded."""
    _this: tuple = ()
    """This round's (hosts, resume choice, this node's ranks); its plan and group are self.plan, self.group."""

    def run(self) -> None:
        from launcher.launch.attempt import run_attempts

        self.attempts = run_attempts(self, int(self.cfg.launcher.max_restarts), float(self.cfg.launcher.watchdog_s),
                                     self.console, self.cfg.output.console)

    def next_round(self, number: int, last):
        """Meet, plan this world, agree; None when the round cannot be (a rendezvous that failed, a world that
        cannot hold the job: said)."""
        try:
            return self._round(number)
        except (RuntimeError, ConfigError) as e:
            self.error = str(e)
            self.console.print(f"[red]{escape(self.error)}[/red]", soft_wrap=True)
            return None

    def _round(self, number: int):
        from launcher.backends import JobConfig, backend
        from launcher.launch.attempt import Round
        from launcher.launch.store import host_store, rank_envs
        from launcher.launch.nodes import agree, next_round
        from launcher.launch.record import write_rank_env
        from launcher.plan.ranks import on_node, rank_table

        identity = f"{self.host.hostname}:{os.getpid()}"
        restarts_left = int(self.cfg.launcher.max_restarts) - number  # this host's own rounds count
        info, hosts, number = next_round(self.handler, self.cfg, self.host, number, identity)
        if self.run_dir is None:
            self._start_run_dir()
        choice = _decided(info, "resume", lambda: _resume_choice(self.run_dir, self.cfg, number,
                                                                  self.plans.first.resume_from, self.console))
        if "error" in choice:
            raise ConfigError(choice["error"])
        plan = self.plans.plan(info.world_size, _resume_path(self.run_dir, self.cfg, choice))
        ranks_store = host_store(hosts[0]["addr"], 0) if info.rank == 0 else None
        admit = restarts_left > 0 and info.world_size < node_range(self.cfg.cluster.nnodes)[1]
        self.group = group = agree(info, hosts, self.handler, plan, ranks_store, self.cfg.cluster, admit)
        group.ranks_store = ranks_store  # held for the round: this node's ranks (and the others') meet on it
        self.plan = plan
        self.run_dir.write_json(self.run_dir.plan, plan.to_dict())
        self.run_dir.write_json(self.run_dir.rank_table, rank_table(plan.ranks, [h["addr"] for h in hosts]))
        envs = rank_envs(plan, self.run_dir, group.master_port, number, int(self.cfg.launcher.max_restarts),
                         node=group.node_rank, master_addr=group.master_addr)
        _bind_sockets(envs, str(self.cfg.cluster.local_addr))
        write_rank_env(self.run_dir, envs)
        mine = [r.rank for r in on_node(plan.ranks, group.node_rank)]
        self.console.print(f"attempt {number}: node {group.node_rank} of {group.nnodes} (world {plan.world_size}), "
                           f"ranks {', '.join(map(str, mine))}; resuming from {plan.resume_from or 'the start'}")
        self._this = (hosts, choice, mine)
        start = backend(self.cfg.cluster.launch).start  # this host's ranks, as the local backend starts them
        return Round(plan, envs, functools.partial(start, JobConfig()), group, number)

    def ran(self, attempt) -> None:
        hosts, choice, mine = self._this
        self.records.append(self._record(attempt, self.plan, self.group, hosts, self.last_hosts, choice,
                                         self.failed_at, mine))
        self.last_hosts, self.failed_at = hosts, _failed_at(attempt)

    def again(self, attempt, restarts_left: int) -> bool:
        if self.group is not None and self.group.store_lost:  # cut off from the rendezvous: no next round
            self.error = attempt.remote_failure["error"] if attempt.remote_failure else "the store is lost"
            return False
        self._between_rounds(attempt, restarts_left)
        return True

    def interrupted(self, signum: int) -> None:
        """A signal while meeting the other nodes: no rank runs."""
        self.error = f"interrupted by {signal.Signals(signum).name} while meeting the other nodes"
        self.console.print(f"[yellow]{self.error}; no rank runs[/yellow]")
        self.signum = signum
        if self.records:
            self.records[-1]["status"] = "interrupted"

    def _start_run_dir(self) -> None:
        """The run dir (its checkpoints in trainer.checkpoint_dir, when given) and the ops the ranks need."""
        from launcher.launch.ops import build_ops
        from launcher.launch.run_records import start_run_dir

        self.run_dir = start_run_dir(self.cfg, self.plans.first)
        self.console.print(f"run dir: {self.run_dir.path}")
        build_ops(self.plans.first, self.run_dir, self.console)

    def _record(self, attempt, plan, group, hosts, last_hosts, choice, failed_at, mine) -> dict:
        """The attempt in summary.json, with what the elastic round adds."""
        who = {h["launcher"]: f"node {h['node']} ({h['addr']}, launcher {h['launcher']})" for h in hosts}
        before = {h["launcher"]: f"{h['addr']} (launcher {h['launcher']})" for h in last_hosts or ()}
        first = _first_step_time(self.run_dir, mine)
        rec = {**attempt.record(), "nnodes": group.nnodes, "world_size": plan.world_size, "node_rank": group.node_rank,
               "hosts": list(who.values()), "resumed_step": choice["step"],
               "left": [v for k, v in before.items() if k not in who],
               "joined": [v for k, v in who.items() if last_hosts is not None and k not in before],
               "time_lost_s": round(first - failed_at, 2) if first is not None and failed_at is not None else None}
        if attempt.remote_failure and "admit" in attempt.remote_failure:
            rec["ended_to_admit"] = attempt.remote_failure["admit"]
        if attempt.remote_failure and attempt.remote_failure.get("lost"):
            rec["lost_hosts"] = attempt.remote_failure["lost"]
        return rec

    def _between_rounds(self, attempt, restarts_left: int) -> None:
        """This round's rank dirs to attempt.<k>/; the round's stores go before the next round."""
        from launcher.launch.attempt import archive_attempt

        archive_attempt(self.run_dir, attempt.number, [e["rank"] for e in attempt.exits])
        why = {"admit": "a host waits to join"}.get(attempt.status, f"attempt {attempt.number} {attempt.status}")
        if attempt.remote_failure and attempt.remote_failure.get("lost"):
            why = f"attempt {attempt.number} failed: {attempt.remote_failure['error']}"
        self.console.print(f"[yellow]{why}: meeting the other nodes again ({restarts_left} restart(s) left after "
                           f"this one; logs of attempt {attempt.number}: {self.run_dir.attempt(attempt.number).path})"
                           f"[/yellow]", soft_wrap=True)
        self.group.ranks_store = None
        self.group.close()
        self.group = None

    def report(self, wall_s: float) -> int:
        """summary.json (with every attempt) and the console's summary; the exit code."""
        from launcher.launch.run_records import report_run

        if not self.attempts:
            return _never_met(self.cfg, self.plans.first, self.error, self.signum, wall_s, self.console, self.run_dir)
        last = self.attempts[-1]
        if last.status == "admit":  # the next round never came: the job stopped here
            self.attempts[-1] = dataclasses.replace(last, status="failed", remote_failure=None)
            self.records[-1]["status"] = "failed"
        self.console.print(attempts_table(self.records))
        attempts = [_Recorded(a, r) for a, r in zip(self.attempts, self.records)]
        nodes = SimpleNamespace(node_rank=self.records[-1]["node_rank"], hosts=self.last_hosts)
        return report_run(self.cfg, self.plan, self.run_dir, attempts, wall_s, self.console, nodes)


def _never_met(cfg: DictConfig, plan: RunPlan, error: str, signum: int | None, wall_s: float, console: Console,
              run_dir: RunDir | None = None) -> int:
    """The records of a job whose ranks never started (its rendezvous unreachable, not every host came, or an
    interrupt while meeting): the run dir with its plan and a summary.json that says why; exit 1 (128 + a signal)."""
    from launcher.launch.run_records import start_run_dir, write_records
    from launcher.report.summary import build_summary

    if run_dir is None:
        run_dir = start_run_dir(cfg, plan)
        console.print(f"run dir: {run_dir.path}")
    summary = build_summary(run_dir, plan.to_dict(), [], "failed" if signum is None else "interrupted", wall_s)
    summary["error"] = error
    write_records(run_dir, summary, cfg.output.stderr_tail, console)
    return 1 if signum is None else 128 + signum


def _bind_sockets(envs: dict[int, dict[str, str]], local_addr: str) -> None:
    """With cluster.local_addr, the ranks' gloo and NCCL sockets on the interface that holds it (unless the user set
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME): a host whose name resolves to 127.0.1.1 would offer its peers that."""
    from launcher.launch.reach import socket_ifname

    iface = socket_ifname(local_addr) if local_addr else None
    if iface is None:
        return
    for env in envs.values():
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            if var not in os.environ:
                env.setdefault(var, iface)


def _decided(info, name: str, decide):
    """A value node 0 of the round decides and every node reads (JSON through the round's store)."""
    key = f"hl/{name}"
    if info.rank == 0:
        info.store.set(key, json.dumps(decide()))
    return json.loads(info.store.get(key))


class _Recorded:
    """An attempt whose summary record is the elastic one (report_run asks each attempt for ``record()``)."""

    def __init__(self, attempt, record: dict) -> None:
        self._attempt, self._record = attempt, record

    def __getattr__(self, name: str):
        return getattr(self._attempt, name)

    def record(self) -> dict:
        return self._record
