"""Section rules: one sentence per problem, naming the dotted key, its value and a fix."""

from __future__ import annotations

import math
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from launcher.contract import BackendRules, backend_named
from launcher.plain import to_plain
from launcher.plan.pipeline import partition_problems, schedule_problems
from launcher.plan.registry import DENSE_OPTIMIZERS, unknown, unread_optimizer_keys
from launcher.plan.sharding import search_mode_problems
from launcher.plan.values import number_problems, wild_number_problems
from launcher.plan.types import HostFacts

PRECISIONS = ("fp32", "bf16", "fp16")
BACKENDS = ("auto", "gloo", "nccl")
CONSOLE_MODES = ("rank0", "all", "none")
"""output.console: whose output a script= run streams to the launcher's terminal (launch/tee.py)."""


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RUN_NAME_MAX = 200
"""Characters of output.run_name (ASCII by RUN_NAME): a folder name fits any file system's 255 bytes."""
SEED_RANGE = 2**32
"""Seeds are in [0, 2**32): torch.manual_seed takes them, and so do the recipes' per-batch seeds (seed * 1_000_000_007 +
index < 2**64)."""


def check_output(o: DictConfig) -> list[str]:
    """output.run_name is one folder name inside output.log_dir: no separators, no '..', not 'latest', not longer
    than RUN_NAME_MAX; output.stderr_tail >= 0; output.console one of CONSOLE_MODES."""
    p = []
    name = str(o.run_name)
    if name and (not RUN_NAME.fullmatch(name) or name == "latest" or ".." in name or len(name) > RUN_NAME_MAX):
        shown = name if name.isprintable() else repr(name)  # a tab or newline in it is shown, not obeyed
        shown = shown if len(shown) <= 60 else f"{shown[:40]}... ({len(name)} characters)"
        p.append(f"output.run_name={shown} must be one folder name inside output.log_dir: letters, digits, '.', '_' "
                 f"and '-', starting with a letter or digit, no '..', not 'latest', at most {RUN_NAME_MAX} "
                 f"characters. E.g. output.run_name=exp1.")
    if "stderr_tail" in o and o.stderr_tail < 0:
        p.append(f"output.stderr_tail={o.stderr_tail} must be >= 0 (lines of a failed rank's stderr to print).")
    if "console" in o and o.console not in CONSOLE_MODES:
        p.append(unknown("output.console", o.console, CONSOLE_MODES) + " Set output.console=rank0 (rank 0's output "
                 "on the terminal), all (every rank's, prefixed [rank N]) or none (only in rank.N/stdout and stderr).")
    return p


def check_seeds(cfg: DictConfig) -> list[str]:
    """trainer.seed and the recipe's data.seed (when it has one) in [0, 2**32)."""
    seeds = [("trainer.seed", cfg.trainer.seed)]
    data = OmegaConf.select(cfg, "data", default=None, throw_on_missing=False)
    if isinstance(data, DictConfig) and isinstance(data.get("seed"), int):
        seeds.append(("data.seed", data.seed))
    return [f"{key}={seed} must be an integer in [0, 2**32). E.g. {key}=1234." for key, seed in seeds
            if not 0 <= seed < SEED_RANGE]


def check_launcher(launcher: DictConfig, launch: str, backends: tuple[BackendRules, ...]) -> list[str]:
    """launcher.*: the watchdog's limit and the number of restarts (where the backend restarts)."""
    p = number_problems("launcher", {"watchdog_s": (launcher.watchdog_s, "non_negative")})
    if launcher.max_restarts < 0:
        p.append(f"launcher.max_restarts={launcher.max_restarts} must be 0 (no restart) or more.")
    elif launcher.max_restarts > 0 and (b := backend_named(backends, launch)) is not None and not b.restarts:
        restarting = ", ".join(b.name for b in backends if b.restarts)
        p.append(f"launcher.max_restarts={launcher.max_restarts} with cluster.launch={launch}: restarts across "
                 f"hosts that each run a launcher are not supported yet ({restarting} restart). Set "
                 f"launcher.max_restarts=0, and resume with trainer.resume=latest.")
    return p


def resolve_nproc(value: str, host: HostFacts) -> tuple[int, str]:
    """cluster.nproc_per_node as an int, and a note when it was resolved from 'auto' (an invalid value, which
    check_cluster names, -> what auto gives)."""
    if str(value) == "auto":
        if host.accelerators > 0:
            return host.accelerators, f"cluster.nproc_per_node=auto -> {host.accelerators} (visible CUDA devices)"
        return 2, "cluster.nproc_per_node=auto -> 2 (CPU-only host: 2 ranks)"
    try:
        n = int(value)
    except ValueError:
        n = 0
    if 1 <= n <= MAX_NPROC_PER_NODE:
        return n, ""
    return resolve_nproc("auto", host)[0], ""  # invalid (check_cluster names it): the rest plans as auto would


MAX_NPROC_PER_NODE = 4096
"""The most ranks one host may run. Above it the count is a typo: the largest hosts have a few hundred cores (or 16
GPUs), each rank is a Python process with torch (hundreds of MB), and a plan of that many ranks is itself slow."""


def oversubscribed(nproc: int, host: HostFacts, workers: int = 0) -> str:
    """A warning line when ``nproc`` ranks on this host, each with ``workers`` DataLoader workers, outnumber its CPU
    cores ('' when they do not): each rank gets OMP_NUM_THREADS=1 (plan_ranks shares the cores) and the processes
    take turns on the cores."""
    cores = max(1, host.cpu_count)
    processes = nproc * (1 + workers)
    if processes <= cores:
        return ""
    if nproc <= cores:
        return (f"warning: {nproc} rank(s) with loader.num_workers={workers} each run {processes} processes on {cores} "
                f"CPU core(s) of {host.hostname}: the workers and the ranks take turns on the cores, which helps only "
                f"when reading waits on files or the network. Set loader.num_workers={max(0, cores // nproc - 1)} "
                f"(or auto) if reading is CPU work.")
    return (f"warning: cluster.nproc_per_node={nproc} puts {nproc} ranks on {cores} CPU core(s) of {host.hostname}: "
            f"each rank gets OMP_NUM_THREADS=1 and the ranks take turns on the cores ({nproc / cores:.1f} per core), "
            f"so a step is slower than with {cores} rank(s) and each rank's memory adds up. Set "
            f"cluster.nproc_per_node={cores} or fewer (auto: one rank per GPU, or 2 on a CPU host).")


DEVICES = ("auto", "cpu", "cuda")


def device_and_backend(backend: str, host: HostFacts, device: str = "auto") -> tuple[str, str]:
    """(cuda|cpu, the torch.distributed backend): device auto means cuda with CUDA devices; backend auto means nccl
    on cuda, gloo on the CPU."""
    device_type = ("cuda" if host.accelerators > 0 else "cpu") if device == "auto" else device
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    return device_type, backend


def _check_nodes(c: DictConfig, backends: tuple[BackendRules, ...]) -> list[str]:
    """cluster.launch, node_rank, and the keys only the chosen backend has (cluster.nnodes: plan/nodes.py
    planned_nodes, which runs first and leaves a number >= 1 here)."""
    b = backend_named(backends, c.launch)
    if b is None:
        return [f"cluster.launch={c.launch} is not one of {', '.join(b.name for b in backends)}. Use cluster.launch="
                f"{', '.join(b.help for b in backends)}."]
    p = []
    if c.node_rank != 0 and not b.launcher_per_host:
        per_host = " / ".join(other.name for other in backends if other.launcher_per_host)
        p.append(f"cluster.node_rank={c.node_rank}: only cluster.launch={per_host} runs one launcher per host (and "
                 f"there the rendezvous assigns node ranks). Leave cluster.node_rank out.")
    return p + _keys_of_other_backends(c, b, backends) + b.problems(c)


def _keys_of_other_backends(c: DictConfig, chosen: BackendRules, backends: tuple[BackendRules, ...]) -> list[str]:
    """A cluster.* key set (not its default) that only other backends read: with this one it would change nothing."""
    from launcher.schema import ClusterConfig

    default, p = ClusterConfig(), []
    for key in dict.fromkeys(k for b in backends for k in b.reads if k not in chosen.reads):
        value = c.get(key, getattr(default, key))
        value = to_plain(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if value != getattr(default, key):
            readers = " / ".join(b.name for b in backends if key in b.reads)
            p.append(f"cluster.{key}={value} is read by cluster.launch={readers} only; with cluster.launch="
                     f"{chosen.name} it would change nothing. Remove it, or set cluster.launch={readers}.")
    return p


def check_cluster(c: DictConfig, host: HostFacts, backends: tuple[BackendRules, ...],
                  dry_run: bool = False) -> list[str]:
    """The cluster section's problems (shared by recipe runs and script runs). A dry run may plan CUDA devices this
    host does not have (a plan for the cluster, made on a laptop)."""
    p: list[str] = []
    nproc = str(c.nproc_per_node)
    if nproc != "auto" and not (nproc.isascii() and nproc.isdigit() and int(nproc) >= 1):  # not ² or ٣
        p.append(f"cluster.nproc_per_node={nproc} must be a positive integer or auto (the ranks on each host). E.g. "
                 f"cluster.nproc_per_node=2.")
    elif nproc != "auto" and int(nproc) > MAX_NPROC_PER_NODE:
        p.append(f"cluster.nproc_per_node={nproc}: more than {MAX_NPROC_PER_NODE} ranks on one host ({host.hostname} "
                 f"has {host.cpu_count} CPU core(s) and {host.accelerators} GPU(s)); each rank is a process with its "
                 f"own torch. Set cluster.nproc_per_node to the host's GPUs or cores (auto picks), and cluster.nnodes "
                 f"for more hosts.")
    p += _check_nodes(c, backends)
    if c.backend not in BACKENDS:
        p.append(f"cluster.backend={c.backend} is not one of {', '.join(BACKENDS)}.")
    elif c.backend == "nccl" and host.accelerators == 0:
        p.append("cluster.backend=nccl needs CUDA devices and this host has none. Set cluster.backend=gloo (or auto).")
    if c.device not in DEVICES:
        p.append(f"cluster.device={c.device} is not one of {', '.join(DEVICES)}.")
    elif c.device == "cuda" and host.accelerators == 0 and not dry_run:
        p.append("cluster.device=cuda needs CUDA devices and this host has none. Set cluster.device=cpu (or auto), "
                 "or dry_run=true to plan for a GPU cluster from here.")
    elif c.device == "cpu" and c.backend == "nccl":
        p.append("cluster.backend=nccl with cluster.device=cpu: nccl runs on CUDA devices only. Set "
                 "cluster.backend=gloo (or auto).")
    if not 0 <= c.master_port <= 65535:
        p.append(f"cluster.master_port={c.master_port} must be 0 (pick a free port) or a port number <= 65535.")
    for key in ("device_memory_gb", "host_memory_gb"):  # 0 = what the host reports
        if key in c and not (math.isfinite(c[key]) and c[key] >= 0):
            p.append(f"cluster.{key}={c[key]} must be a size in GB > 0, or 0 (what the host reports). E.g. "
                     f"cluster.{key}=80.")
    if "rdzv_timeout_s" in c:
        p += number_problems("cluster", {"rdzv_timeout_s": (c.rdzv_timeout_s, "positive")})
    return p


def unused_optimizer_keys(o: DictConfig, tables: dict) -> list[str]:
    """optimizer.<key> set to other than its default that optimizer.name's class does not take (its
    DENSE_OPTIMIZERS kwargs): the run would not read it (Adam has no momentum, SGD no betas or eps)."""
    from launcher.schema import OptimizerConfig

    default, out = OptimizerConfig(), []
    rows = [t.get("optimizer") for t in tables.values() if isinstance(t, dict)]
    for key in unread_optimizer_keys(o.name, rows):
        value, was = o[key], getattr(default, key)
        value = list(value) if isinstance(value, ListConfig) else value
        if value == was:
            continue
        spec = DENSE_OPTIMIZERS[o.name]
        takers = [n for n, s in DENSE_OPTIMIZERS.items() if key in s.kwargs]
        out.append(f"optimizer.{key}={value}: optimizer.name={o.name} ({spec.impl}) takes no {key}, so the run "
                   f"would not read it; {o.name} takes {', '.join(spec.kwargs)}. Remove optimizer.{key} (its default "
                   f"is {was}), or set optimizer.name to one that takes it: {', '.join(takers)}.")
    return out


def check_config(cfg: DictConfig, host: HostFacts, backends: tuple[BackendRules, ...]) -> list[str]:
    """Every problem in cfg that does not depend on the batch split."""
    p: list[str] = []
    t, c = cfg.trainer, cfg.cluster
    if t.steps < 1:
        p.append(f"trainer.steps={t.steps} must be >= 1.")
    if t.log_every < 1:
        p.append(f"trainer.log_every={t.log_every} must be >= 1.")
    if t.checkpoint_every < -1:
        p.append(f"trainer.checkpoint_every={t.checkpoint_every}: use N>0 (every N steps), 0 (at the end) or -1 (never).")
    p += number_problems("trainer", {"epochs": (t.epochs, "non_negative"), "grad_clip": (t.grad_clip, "non_negative")})
    p += check_seeds(cfg)
    d = cfg.debug
    if d.fail_rank < -1:
        p.append(f"debug.fail_rank={d.fail_rank} must be a rank (0, 1, ...) or -1 (off).")
    if d.fail_step != -1 and d.fail_step < 1:
        p.append(f"debug.fail_step={d.fail_step} must be a step (1, 2, ...) or -1 (off).")
    e = cfg.eval
    if e.batches < 0:
        p.append(f"eval.batches={e.batches} must be >= 0 (0 = no evaluation).")
    if e.every < 0:
        p.append(f"eval.every={e.every} must be >= 0 (0 = only at the end).")
    if e.max_batches < 0:
        p.append(f"eval.max_batches={e.max_batches} must be >= 0 (0 = all of a held-out set).")
    if e.metrics not in ("auto", "loss", "binary"):
        p.append(f"eval.metrics={e.metrics} is not one of auto, loss, binary.")

    p += check_cluster(c, host, backends, cfg.dry_run)

    if cfg.zero.stage not in (0, 1, 2, 3):
        p.append(f"zero.stage={cfg.zero.stage} must be 0, 1, 2 or 3.")
    par = cfg.parallel
    p += partition_problems(par.partition) + search_mode_problems(par.search_mode)
    micro = cfg.batch.micro_batches if cfg.batch.micro_batches > 0 else max(1, cfg.batch.grad_accum)
    p += schedule_problems(par.schedule, par.stages_per_rank, par.pipeline_stages, micro)

    if cfg.precision not in PRECISIONS:
        p.append(f"precision={cfg.precision} is not one of {', '.join(PRECISIONS)}.")
    elif cfg.precision == "fp16" and device_and_backend(c.backend, host, c.device)[0] == "cpu":
        p.append("precision=fp16 is not supported on CPU (DeepSpeed has no fp16 CPU path). Set precision=bf16 or precision=fp32.")

    o = cfg.optimizer  # target, cpu_impl and placement.*: plan/placement.py
    if o.name not in DENSE_OPTIMIZERS:
        p.append(unknown("optimizer.name", o.name, DENSE_OPTIMIZERS))
    p += number_problems("optimizer", {"lr": (o.lr, "positive"), "momentum": (o.momentum, "unit"),
                                       "eps": (o.eps, "positive"), "weight_decay": (o.weight_decay, "non_negative")})
    if len(o.betas) != 2:
        p.append(f"optimizer.betas={list(o.betas)} must be two numbers, e.g. optimizer.betas=[0.9,0.999].")
    else:
        p += number_problems("optimizer", {"betas[0]": (o.betas[0], "unit"), "betas[1]": (o.betas[1], "unit")})
    p += unused_optimizer_keys(o, to_plain(cfg.tables, resolve=False))
    p += number_problems("placement", {"reserve": (cfg.placement.reserve, "unit")})  # a share of each budget kept free
    p += check_output(cfg.output) + check_launcher(cfg.launcher, cfg.cluster.launch, backends)
    p += wild_number_problems(to_plain(cfg), named=" ".join(p))
    return p
