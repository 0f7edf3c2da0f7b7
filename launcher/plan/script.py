"""PURE planning of a user's own script: ranks, environment and rank table, nothing else."""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.errors import ConfigError
from launcher.plan.ranks import plan_ranks, rank_table
from launcher.plan.rules import check_cluster, device_and_backend, resolve_nproc
from launcher.plan.types import HostFacts, ScriptPlan


def plan_script(cfg: DictConfig, host: HostFacts) -> ScriptPlan:
    c = cfg.cluster
    problems = check_cluster(c, host)
    if problems:
        raise ConfigError(problems)
    nproc, note = resolve_nproc(c.nproc_per_node, host)
    device_type, backend = device_and_backend(c.backend, host)
    ranks = plan_ranks(
        nnodes=1, nproc_per_node=nproc, device_type=device_type, master_addr=c.master_addr,
        master_port=c.master_port, cpu_count=host.cpu_count, extensions_dir=host.extensions_dir,
    )
    return ScriptPlan(
        script=cfg.script, args=tuple(cfg.script_args), world_size=nproc, nnodes=1, nproc_per_node=nproc,
        backend=backend, device_type=device_type, ranks=ranks, rank_table=rank_table(ranks, [c.master_addr]),
        notes=(note,) if note else (),
    )
