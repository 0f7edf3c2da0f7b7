"""From a composed config to a plan, with the checks that need the disk (the script, the data, the checkpoint):
what a single run and every job of a sweep do before anything starts."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from omegaconf import DictConfig

from launcher.backends import BACKENDS, backend
from launcher.facts.cluster_files import read_cluster_files
from launcher.errors import ConfigError
from launcher.integrations import scan_script
from launcher.launch.deepspeed_check import check_with_deepspeed, read_deepspeed_file
from launcher.launch.record import check_checkpoint_dir_free
from launcher.facts.preflight import check_resume, check_script, gather_facts, resume_checkpoint
from launcher.loggers import check_loggers
from launcher.native import environment_problems
from launcher.parallel import RULES
from launcher.parallel.choose import engine_config
from launcher.plan import HostFacts, RunPlan, plan_launch
from launcher.plan.layout import ClusterLayout
from launcher.plan.rules import oversubscribed
from launcher.plan.script import plan_script
from launcher.rundir import check_log_dir


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def plan_run(cfg: DictConfig, host: HostFacts, config_dir: str | None = None,
             estimate: bool = True) -> tuple[RunPlan, list[str]]:
    """(the plan, lines about the data and model to show before it); ConfigError for bad input. ``estimate=False``
    (``check``) leaves out the activation estimate, which needs torch."""
    logger_problems = check_loggers(cfg.logger) + environment_problems()  # before anything slower
    if logger_problems:
        raise ConfigError(logger_problems)
    if cfg.script and cfg.deepspeed.config is not None:
        raise ConfigError("deepspeed.config with script=: not applied to a script yet (its runtime.prepare() gets "
                          "the compiled config only). Remove deepspeed.config, or run a recipe.")
    cfg = read_deepspeed_file(cfg)  # the plan reads no file
    if cfg.script:
        if cfg.trainer.resume or cfg.trainer.resume_from:
            key = "trainer.resume" if cfg.trainer.resume else "trainer.resume_from"
            raise ConfigError(f"{key}={cfg.trainer[key.split('.')[1]]} with script=: a script loads its own "
                              f"checkpoints (runtime.load_state_dict). Leave {key} empty.")
        check_script(cfg)
        plan = plan_script(cfg, host, scan_script(Path(cfg.script).read_text(errors="replace"), cfg.script),
                           backends=tuple(BACKENDS.values()), parts=RULES)
        check_log_dir(Path(cfg.output.log_dir))
        _check_store_address(cfg, plan)
        return plan, [*host.notes, *_warnings(plan, host, False)]
    resume = resume_checkpoint(cfg)
    if resume:  # trainer.resume=<run>|latest is that run's newest complete checkpoint: the config says which
        cfg = cfg.copy()
        cfg.trainer.resume_from = resume
    launch = backend(cfg.cluster.launch) if cfg.cluster.launch in BACKENDS else None  # else the rules say so
    layout = launch.layout(cfg, dict(os.environ)) if launch is not None else read_cluster_files(cfg)
    lines = []
    if layout is not None:
        cfg = with_layout(cfg, layout, launch is None or "rdzv_endpoint" in launch.reads)
        lines.append(f"{layout.source}: {layout.nnodes} host(s) × {layout.nproc_per_node} rank(s) "
                     f"({', '.join(layout.hosts)}) -> cluster.nnodes={layout.nnodes}, "
                     f"cluster.nproc_per_node={layout.nproc_per_node}")
    c = cfg.cluster
    if launch is not None and launch.program and launch.ranks_elsewhere(c, layout) and c.master_addr in LOOPBACK:
        cfg = cfg.copy()  # ranks on other hosts reach the launcher's store at this host's name
        cfg.cluster.master_addr = socket.getfqdn()
        if layout is not None:  # the hosts are known, and this launcher starts their ranks (not an sbatch to write)
            _not_loopback(cfg.cluster.master_addr, c.master_addr, layout)
        lines.append(f"cluster.master_addr={cfg.cluster.master_addr}: this host (the launcher hosts the store the "
                     f"ranks of every host rendezvous on)")
    facts = gather_facts(cfg, config_dir, estimate)
    plan = plan_launch(cfg, host, facts, layout)
    ds = engine_config(plan)
    if cfg.deepspeed.config is not None and ds is not None:
        check_with_deepspeed(ds, plan.dims.dp, cfg.deepspeed.source or "(the inline config)")
    check_resume(plan, f"trainer.resume={cfg.trainer.resume}" if resume else "", facts.model)
    if cfg.trainer.checkpoint_dir and not (launch is not None and launch.launcher_per_host):  # elastic: the agent's
        check_checkpoint_dir_free(cfg.trainer.checkpoint_dir, plan.resume_from)  # first round (hosts join later)
    check_log_dir(Path(cfg.output.log_dir))  # where the run dir and log_dir/latest will go, before either is made
    _check_store_address(cfg, plan)
    model_lines = facts.model.lines if facts.model else ()
    given = cfg.loader.num_workers != "auto"
    return plan, [*host.notes, *lines, *facts.data.lines, *model_lines, *_warnings(plan, host, given)]


def check_local_address(addr: str) -> None:
    """cluster.master_addr must name this host (the launcher hosts the store there): resolvable, and bindable. A name
    that does not resolve or an address of another machine would leave the ranks retrying to connect for minutes."""
    key = f"cluster.master_addr={addr}"
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ConfigError(f"{key}: not a host name this machine can resolve ({e.strerror or e}). Set "
                          f"cluster.master_addr=127.0.0.1 to run on this host.") from None
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
                return
            except OSError:
                continue
    raise ConfigError(f"{key}: not an address of this host (it resolves to "
                      f"{', '.join(sorted({i[4][0] for i in infos}))}), and the launcher hosts the rendezvous here. "
                      f"Set cluster.master_addr=127.0.0.1 (or this host's own address).")


def _not_loopback(name: str, given: str, layout: ClusterLayout) -> None:
    """Ranks on other hosts reach the store at this host's ``name``: one that resolves to a loopback address (Debian's
    127.0.1.1) they could not reach (elastic's launchers check the same: launch/reach.py address_problems)."""
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        return  # check_local_address says a name that does not resolve
    if resolved.startswith("127."):
        raise ConfigError(f"cluster.master_addr={given} with ranks on other hosts ({', '.join(layout.hosts)}): this "
                          f"host's name {name} "
                          f"resolves to {resolved}, a loopback address, which they cannot reach. Set "
                          f"cluster.master_addr to this host's address as the other hosts reach it.")


def _check_store_address(cfg: DictConfig, plan: RunPlan) -> None:
    """Where the launcher will host the ranks' store (every backend but elastic's, whose launchers meet at
    cluster.rdzv_endpoint), checked in the plan too: a dry run, ``check`` and a sweep's plans refuse what the run
    would (they accepted a cluster.master_addr the run then refused)."""
    launch = BACKENDS.get(cfg.cluster.launch)
    if launch is not None and not launch.launcher_per_host and plan.ranks:
        check_local_address(plan.ranks[0].env["MASTER_ADDR"])


def _warnings(plan: RunPlan, host: HostFacts, workers_given: bool) -> list[str]:
    """What the plan lets run but the user should hear: more ranks (and DataLoader workers the user asked for) than
    cores."""
    loader = plan.data.get("loader", {}) if workers_given and isinstance(getattr(plan, "data", None), dict) else {}
    warning = oversubscribed(plan.nproc_per_node, host, loader.get("num_workers", 0))
    return [warning] if warning else []


def with_layout(cfg: DictConfig, layout: ClusterLayout, rendezvous: bool = True) -> DictConfig:
    """The cluster a rank table or hostfile describes, in cluster.nnodes and nproc_per_node (given values must
    agree), and, for a backend that reads cluster.rdzv_endpoint (``rendezvous``: elastic), as the rendezvous' default
    endpoint (the first host, torchrun's port 29400); under mpirun or srun that key is another backend's."""
    c = cfg.cluster
    problems = []
    if c.nnodes not in (1, layout.nnodes):
        problems.append(f"cluster.nnodes={c.nnodes} but {layout.source} describes {layout.nnodes} host(s). Leave "
                        f"cluster.nnodes out (the file decides) or make them agree.")
    if str(c.nproc_per_node) not in ("auto", str(layout.nproc_per_node)):
        problems.append(f"cluster.nproc_per_node={c.nproc_per_node} but {layout.source} gives each host "
                        f"{layout.nproc_per_node} rank(s). Leave cluster.nproc_per_node out or make them agree.")
    if problems:
        raise ConfigError(problems)
    cfg = cfg.copy()
    cfg.cluster.nnodes = layout.nnodes
    cfg.cluster.nproc_per_node = str(layout.nproc_per_node)
    if rendezvous and layout.nnodes > 1 and not cfg.cluster.rdzv_endpoint:
        host = layout.hosts[0]
        cfg.cluster.rdzv_endpoint = f"[{host}]:29400" if ":" in host else f"{host}:29400"
    return cfg
