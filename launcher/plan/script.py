"""PURE planning of a user's own script: ranks, environment and rank table, and the ``RuntimePlan`` that
``runtime.prepare(model, optimizer)`` builds if the script calls it (engine, its DeepSpeed config, placement intents).

What depends on the script's model (which tables it has) is decided inside the rank, by the same pure
``plan_tables`` a recipe's plan uses, from the intents recorded here."""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.codec import from_plain
from launcher.contract import BackendRules, PartRules, backend_named
from launcher.errors import ConfigError
from launcher.integrations.accelerate import ScriptUse, accelerate_handover
from launcher.loggers import logger_specs
from launcher.plan.intents import PartPlan, intents_of
from launcher.plan.ds_ops import BUILDERS
from launcher.plan.loader import changed
from launcher.plan.nodes import planned_nodes
from launcher.plan.parallel import ParallelDims
from launcher.plan.placement import PlacementPlan, plan_placement
from launcher.plan.prefetch import prefetch_depth
from launcher.plan.registry import CPU_OPTIMIZERS
from launcher.plan.malloc import with_malloc
from launcher.plan.ranks import omp_threads_kept, plan_ranks, rank_table
from launcher.plan.rules import check_cluster, check_launcher, check_output, device_and_backend, resolve_nproc
from launcher.plan.script_keys import changed_keys, intents_set, script_key_verdicts
from launcher.plan.types import HostFacts, ScriptPlan


@dataclass(frozen=True)
class RuntimePlan:
    """What ``runtime.prepare()`` compiles the script's model and optimizer into."""

    parts: tuple[PartPlan, ...]
    """One data-parallel part (a script's loop is data parallel): ddp or deepspeed, the parts that take an optimizer
    built before them."""
    zero_stage: int
    precision: str
    grad_accum: int
    """Micro-batches (runtime.backward calls) per optimizer step."""
    placement: PlacementPlan
    """Where the dense optimizer and parameters live; its ``tables`` are empty (prepare() finds the model's)."""
    host_device_mix: int
    table_locations: dict[str, str]
    """placement.tables: module path -> host|device."""
    table_configs: dict[str, dict[str, Any]]
    """The tables section: module path -> TableConfig's fields."""
    backend: str = "gloo"
    ps: bool = False
    """placement.ps: every table outside the engine has its rows split over the script's ranks."""

    @property
    def engine(self) -> str:
        return "+".join(p.name for p in self.parts)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuntimePlan:
        return cls(**{**d, "parts": tuple(from_plain(PartPlan, p) for p in d["parts"]),
                      "placement": PlacementPlan(**{**d["placement"], "tables": ()})})


def plan_runtime(cfg: DictConfig, dims: ParallelDims, device_type: str, rules: PartRules,
                 backend: str = "gloo") -> tuple[RuntimePlan | None, tuple[str, ...], list[str], list[str]]:
    """(runtime plan, the DeepSpeed ops its ranks load, problems, notes) of a script run's intents: precision, zero,
    optimizer.target, placement."""
    placement, zero, problems, notes = plan_placement(cfg, None, 0, device_type)  # tables: found by prepare()
    if placement.optimizer_location == "host" and CPU_OPTIMIZERS[placement.cpu_impl].impl:
        problems.append("optimizer.cpu_impl=deepspeed builds DeepSpeedCPUAdam for a recipe; a script brings its own "
                        "optimizer, which DeepSpeed steps on the host partitions. Leave optimizer.cpu_impl=torch (or "
                        "pass deepspeed.ops.adam.DeepSpeedCPUAdam to runtime.prepare() yourself).")
    if cfg.parallel.sharding or cfg.parallel.tp != 1:
        problems.append(f"parallel.sharding / parallel.tp={cfg.parallel.tp} shard a recipe's operators, which a "
                        f"script's runtime.prepare() does not know (it runs data parallel). Remove them, or run a recipe.")
    depth, found = prefetch_depth(cfg.placement.prefetch)
    problems += found or ([f"placement.prefetch={depth} would do nothing: a script's own loop draws its batches, so "
                           f"there is no next micro-batch to gather rows for. Set placement.prefetch=0 (or auto)."]
                          if depth else [])
    b = cfg.batch
    micro, accum = (b.micro_size if b.micro_size > 0 else 1), (b.grad_accum if b.grad_accum > 0 else 1)
    if problems:
        return None, (), problems, notes
    intents = intents_of(cfg, dims, placement, zero, device_type, (micro * accum * dims.dp, micro, accum),
                         client_optimizer=True)
    parts, part_problems, part_notes = rules.plan_parts(intents)
    if part_problems:
        return None, (), part_problems, notes
    run = rules.run_facts(intents, parts)
    zero, ds_ops = run.zero, run.ops
    runtime = RuntimePlan(
        parts=parts, zero_stage=zero, precision=cfg.precision, grad_accum=accum, placement=placement,
        host_device_mix=cfg.placement.host_device_mix, table_locations=OmegaConf.to_container(cfg.placement.tables),
        table_configs=OmegaConf.to_container(cfg.tables), backend=backend, ps=cfg.placement.ps,
    )
    return runtime, ds_ops, problems, notes + part_notes


def check_script_ops(cfg: DictConfig, device_type: str = "") -> list[str]:
    """Problems with ``script_ops``: set without script= (a recipe's ops come from its parts; script_args and
    output.console without script= too: a recipe reads neither), a name DeepSpeed's
    builders do not have, or one the ``device_type``'s accelerator does not offer (DeepSpeed's CPU accelerator has
    no fused_lamb, for one). Known names: launcher/plan/ds_ops.py BUILDERS."""
    names = list(cfg.script_ops)
    if not cfg.script:  # the other script-only keys, which a recipe's ranks would never read
        problems = [f"script_args={list(cfg.script_args)} without script=: a recipe takes no arguments after --; its "
                    f"settings are config keys. Remove them, or run a script (script=train.py)."] if cfg.script_args \
            else []
        if cfg.output.console != "rank0":
            problems.append(f"output.console={cfg.output.console} without script=: a recipe's ranks report through "
                            f"the progress view (their output stays in rank.N/); output.console chooses whose output a "
                            f"script= run streams. Remove it.")
        if names:
            problems.append(f"script_ops=[{', '.join(names)}] without script=: a recipe's DeepSpeed ops come from its "
                            f"plan and are built before its ranks start. Remove script_ops, or run a script "
                            f"(script=train.py).")
        return problems
    problems = []
    for name in names:
        op = BUILDERS.get(name)
        if op is None:
            close = difflib.get_close_matches(str(name), BUILDERS, n=1)
            hint = f"Did you mean {close[0]}? " if close else ""
            problems.append(f"script_ops: {name!r} is not a DeepSpeed op the launcher can build. {hint}Use names "
                            f"from: {', '.join(sorted(BUILDERS))} (or remove it; the ranks then build it).")
        elif device_type not in op.devices:
            offered = sorted(n for n, o in BUILDERS.items() if device_type in o.devices)
            problems.append(f"script_ops: {name} ({op.builder}) is not offered by DeepSpeed's {device_type} "
                            f"accelerator, which builds {', '.join(offered)}. Remove {name} from script_ops, or run "
                            f"on {' / '.join(op.devices)} (cluster.device).")
    return problems


def _quoted_literal(arg: str) -> str:
    """``arg`` as one quoted value of a Hydra override that OmegaConf reads back as ``arg`` itself: ``${`` escaped
    for OmegaConf (with the backslashes before it doubled: ``\\${`` would be a backslash then an interpolation),
    then quoted for Hydra (a quote escaped, the backslashes before a quote or the closing one doubled)."""
    literal = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", arg)
    quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", literal)
    return "'" + re.sub(r"(\\+)\Z", lambda m: m.group(1) * 2, quoted) + "'"


def script_args_override(args: list[str]) -> str:
    """The ``script_args=[...]`` override that carries a command line's words after ``--`` to the script byte for
    byte (``--name=${x}``, quotes, backslashes: never interpolated nor unquoted), checked by reading it back as
    Hydra's parser and OmegaConf's resolution do; ConfigError if an argument does not come back as it was."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    override = f"script_args=[{','.join(_quoted_literal(a) for a in args)}]"
    try:  # (never failed: the quoting above is what the two grammars ask; a check, so that no word is ever changed)
        value = OverridesParser.create().parse_override(override).value()
        back = OmegaConf.to_container(OmegaConf.create({"args": value}), resolve=True)["args"]
    except (HydraException, OmegaConfBaseException):
        back = None
    changed = [a for i, a in enumerate(args) if back is None or i >= len(back) or back[i] != a]
    if back is None or changed or len(back) != len(args):
        raise ConfigError(f"the script argument {changed[0] if changed else args!r} after -- cannot be passed "
                          f"through the config as it is. Put it in a file the script reads, or pass it another way.")
    return override


def plan_script(cfg: DictConfig, host: HostFacts, use: ScriptUse | None = None, *,
                backends: tuple[BackendRules, ...], parts: PartRules) -> ScriptPlan:
    """``use``: what the script trains with (launcher.integrations.scan_script of its text); None = not scanned,
    planned as a runtime.prepare() script. ``backends``: the launch backends (launcher.backends.BACKENDS' values);
    ``parts``: the parallel parts' rules (launcher.parallel.RULES)."""
    use = use or ScriptUse("prepare", "not scanned")
    cfg, node_problems = planned_nodes(cfg, backends)
    c = cfg.cluster
    loggers, logger_problems = logger_specs(cfg.logger)
    key_problems, not_applied = script_key_verdicts(cfg, use.kind)
    problems = (node_problems + check_cluster(c, host, backends) + check_output(cfg.output)
                + check_launcher(cfg.launcher, c.launch, backends)
                + logger_problems + key_problems)
    if ((b := backend_named(backends, c.launch)) is not None and not b.scripts) or c.nnodes > 1:
        problems.append(f"cluster.launch={c.launch} cluster.nnodes={c.nnodes} with script=: scripts run on one host "
                        f"for now (recipes run on several), started locally, by mpirun or by srun. Set "
                        f"cluster.launch=local (or mpi / slurm) and cluster.nnodes=1, or run your model as a recipe.")
    if cfg.parallel.pipeline_stages > 1:
        problems.append(f"parallel.pipeline_stages={cfg.parallel.pipeline_stages} with script=: runtime.prepare() "
                        f"trains your loop data-parallel; pipelines run recipes (your model in a recipe YAML, see "
                        f"'Bring your own model'). Set parallel.pipeline_stages=1.")
    keys = changed(OmegaConf.to_container(cfg.loader, resolve=True))
    if keys:
        problems.append(f"loader.{', loader.'.join(keys)} with script=: your script builds its own DataLoader, which "
                        f"takes them (DataLoader(..., collate_fn=..., num_workers=...)). Remove them.")
    if problems:
        raise ConfigError(problems)
    nproc, note = resolve_nproc(c.nproc_per_node, host)
    device_type, backend = device_and_backend(c.backend, host, c.device)
    dims = ParallelDims(dp=nproc, pp=1, tp=1, world_size=nproc)
    runtime, ds_ops, problems, notes = plan_runtime(cfg, dims, device_type, parts, backend)
    problems += check_script_ops(cfg, device_type)
    if use.nccl_line and not host.accelerators:
        problems.append(f"script={cfg.script}: line {use.nccl_line} calls init_process_group(\"nccl\") on a host "
                        f"without a GPU: every rank would fail (NCCL is for GPUs). Leave the backend out "
                        f"(init_process_group() takes gloo on the CPU and nccl on a GPU, as torchrun's ranks do) or "
                        f"write \"cuda:nccl,cpu:gloo\".")
    omp_problems, omp_notes = omp_threads_kept(host.omp_threads, host.cpu_count, nproc)
    ranks = plan_ranks(
        nnodes=1, nproc_per_node=nproc, device_type=device_type, master_addr=c.master_addr,
        master_port=c.master_port, cpu_count=host.cpu_count, extensions_dir=host.extensions_dir,
        path=host.toolchain_path, omp_threads=host.omp_threads,
    )
    ranks, malloc_problems, malloc_notes = with_malloc(ranks, cfg.launcher.malloc, host, script=True)
    problems += omp_problems + malloc_problems
    notes = [*notes, *omp_notes, *malloc_notes]
    if problems:
        raise ConfigError(problems)
    ds_ops = tuple(dict.fromkeys([*ds_ops, *cfg.script_ops]))  # the engine's, then the script's own
    handover: dict[str, str] = {}
    if use.kind == "accelerate":  # the plan reaches Accelerator() as accelerate launch hands it over
        handover, problems, more = accelerate_handover(runtime, device_type, use, parts.config_file(runtime.parts),
                                                       set(changed_keys(cfg)), tuple(cfg.script_args))
        if problems:
            raise ConfigError(problems)
        notes = [*notes, *more]
        ranks = tuple(dataclasses.replace(r, env={**r.env, **handover}) for r in ranks)
    return ScriptPlan(
        script=cfg.script, args=tuple(cfg.script_args), world_size=nproc, nnodes=1, nproc_per_node=nproc,
        backend=backend, device_type=device_type, ranks=ranks, rank_table=rank_table(ranks, [c.master_addr]),
        notes=((note,) if note else ()) + tuple(notes), runtime=dataclasses.asdict(runtime), ds_ops=ds_ops,
        loggers=loggers, uses={**dataclasses.asdict(use), "handover": sorted(handover),
                                       "intents": intents_set(cfg)},
        not_applied=tuple(not_applied),
    )
