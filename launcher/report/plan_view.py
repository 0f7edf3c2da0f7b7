"""The plan as a rich tree, for dry runs and the start of every run."""

from __future__ import annotations

from rich.tree import Tree

from launcher.plan import LaunchPlan


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def plan_tree(plan: LaunchPlan) -> Tree:
    b, o, m = plan.batch, plan.optimizer, plan.memory
    root = Tree(f"[bold]plan[/bold]: recipe {plan.recipe}, {plan.world_size} rank(s) on {plan.device_type}")
    par = root.add("parallel")
    par.add(f"nnodes {plan.nnodes} × nproc_per_node {plan.nproc_per_node} = world {plan.world_size}")
    par.add(f"dp {plan.dp}, pipeline_stages {plan.pipeline_stages}, ZeRO stage {plan.zero_stage}, backend {plan.backend}")
    root.add(f"batch: global {b.global_size} = micro {b.micro_size} × accum {b.grad_accum} × dp {plan.dp}")
    root.add(f"trainer: {plan.steps} steps, log every {plan.log_every}, seed {plan.seed}, precision {plan.precision}")
    root.add(f"optimizer: {o.name} lr {o.lr} on {o.target}")
    mem = root.add(f"memory per rank (estimate, {m.params:,} parameters): {_mib(m.total_bytes)}")
    mem.add(f"parameters {_mib(m.param_bytes)}, gradients {_mib(m.grad_bytes)}, optimizer states {_mib(m.optimizer_bytes)}")
    ranks = root.add("ranks")
    for r in plan.ranks:
        ranks.add(f"rank {r.rank}: node {r.node_rank}, local rank {r.local_rank}, device {r.device}, OMP_NUM_THREADS {r.env['OMP_NUM_THREADS']}")
    if plan.ds_ops:
        root.add(f"DeepSpeed ops: {', '.join(plan.ds_ops)}")
    for note in plan.notes:
        root.add(f"[dim]note: {note}[/dim]")
    return root
