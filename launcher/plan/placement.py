"""Placement: which tables live on the host or the device, how each trains, where the dense optimizer and parameters
live.

Intents (placement.host_device_mix, placement.tables.<name>, optimizer.target, placement.offload_params) become
concrete decisions here; DeepSpeed's offload keys and the memory accounting follow from them. A table that trains
outside the engine with no ``tables.<path>`` entry keeps the dense optimizer's kind: the row-sparse twin the registry
names for it (sgd, momentum, lazy_adam for adam/adamw) with its settings, and the plan says how the twin differs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.errors import did_you_mean, few
from launcher.plain import to_plain
from launcher.plan.placement_types import DenseSettings, PlacementPlan, TablePlan
from launcher.plan.registry import CPU_OPTIMIZERS, DENSE_OPTIMIZERS, TABLE_OPTIMIZERS, unknown
from launcher.plan.table_keys import hash_problems, resolve_aliases
from launcher.plan.ps import place_problems
from launcher.plan.values import number_problems
from launcher.schema import TableConfig

PLACEMENT_MODES = ("manual", "auto")
"""placement.mode's values (placement=auto sets auto)."""


def takes_tables_out(host_device_mix: int, locations: Any, table_configs: Any, ps: bool = False) -> bool:
    """Whether a placement intent takes a model's tables out of the engine: host_device_mix=1, placement.ps=true, or
    any placement.tables or tables.<path> entry (a recipe in the user's folder and a script's runtime.prepare() train
    their model as written otherwise)."""
    return host_device_mix == 1 or ps or len(locations) > 0 or len(table_configs) > 0


def plan_tables(shapes: dict[str, tuple[int, int]], table_cfgs: dict[str, TableConfig], wanted: dict[str, str],
                host_device_mix: int, default: TableConfig, owner: str, known: bool = True,
                kept: dict[str, str] | None = None, ps: bool = False,
                group_size: int = 1, names: dict[str, str] | None = None) -> tuple[list[TablePlan], list[str], list[str]]:
    """(tables, problems, notes): where each table (module path -> (rows, dim)) lives and how it trains, from the
    ``tables`` section (table_cfgs), ``placement.tables`` (wanted), ``placement.host_device_mix`` and
    ``placement.ps``. ``default``: how a table without a ``tables.<path>`` entry trains. ``owner`` names the model in
    messages. Also what a script's ``runtime.prepare()`` calls, with its live model's tables. ``known=False``: the
    tables are not known yet (a script's, before it runs): names are not checked. ``kept``: embeddings that stay
    inside the parts, and why. ``group_size``: the ranks of a table's pipeline stage, over which a ps table's rows
    are split (its ``shards``). ``names``: module path -> the name messages call a table by (a TorchRec table's)."""
    problems: list[str] = []
    notes: list[str] = []
    kept, names = kept or {}, names or {}
    for section, keys in (("tables", table_cfgs.keys()), ("placement.tables", wanted.keys())):
        for name in keys:
            if known and name in kept:
                problems.append(f"{section}.{name}: {owner}'s embedding {name} trains inside the parts: {kept[name]}. "
                                f"Untie or change it in the model (a HuggingFace config: tie_word_embeddings: false) "
                                f"to place it, or remove {section}.{name}.")
            elif known and name not in shapes:
                hint = did_you_mean(name, [*names.values(), *shapes, *kept], f"{section}.")
                listing = ", ".join(names.get(p, p) for p in shapes) or "none"
                problems.append(f"{section}.{name}: {owner} has no table {name}.{hint} Its tables: {listing}.")
    if host_device_mix not in (0, 1):
        problems.append(f"placement.host_device_mix={host_device_mix} must be 0 (tables on the device) or 1 (tables on the host).")
    notes += _intent_notes(shapes, wanted, host_device_mix, ps, owner, known, kept)

    tables, one_rank = [], []  # one_rank: the ps tables, said in a note when a stage has one rank
    for name, (rows, dim) in shapes.items():
        t = table_cfgs.get(name)
        shown = names.get(name, name)
        opt = t.optimizer if t is not None else default.optimizer
        if opt not in TABLE_OPTIMIZERS:
            problems.append(unknown(f"tables.{shown}.optimizer", opt, TABLE_OPTIMIZERS))
        want = wanted.get(name, "ps" if ps else "host" if host_device_mix == 1 else "device")
        problems += place_problems(shown, want, opt, name in wanted)
        if opt == "dense":
            want = "engine"
        elif want == "ps":
            one_rank.append(name)
        d = t if t is not None else default
        tables.append(
            TablePlan(
                name=name, rows=rows, dim=dim, location="host" if want == "ps" else want, optimizer=opt, lr=d.lr,
                betas=(d.betas[0], d.betas[1]), eps=d.eps, l1=d.l1, l2=d.l2, lr_power=d.lr_power,
                initial_accumulator=d.initial_accumulator, shards=group_size if want == "ps" else 1,
                hash_buckets=d.hash, hash_fn=d.hash_fn,
            )
        )
        problems += hash_problems(shown, rows, d, opt)
        notes += unread_table_fields(shown, opt, d)
        if opt != "dense":
            problems += number_problems(f"tables.{shown}", {
                "lr": (d.lr, "positive"), "l1": (d.l1, "non_negative"), "l2": (d.l2, "non_negative"),
                "lr_power": (d.lr_power, "non_positive"), "initial_accumulator": (d.initial_accumulator, "positive"),
                "eps": (d.eps, "positive"), "betas[0]": (d.betas[0], "unit"), "betas[1]": (d.betas[1], "unit")})
    problems += _dense_problems(tables, wanted, host_device_mix, ps)
    if group_size == 1 and one_rank:
        notes.append(f"ps tables {few(one_rank)} on a group of 1 rank (world size / pipeline stages): it holds every "
                     f"row anyway, as a replicated host table (shards 1)")
    return tables, problems, notes


def _intent_notes(shapes: dict[str, tuple[int, int]], wanted: dict[str, str], host_device_mix: int, ps: bool,
                  owner: str, known: bool, kept: dict[str, str]) -> list[str]:
    """What placement.host_device_mix=1 and placement.ps=true leave where it was: no tables, a placement.tables entry
    for each, embeddings that stay inside the parts."""
    notes = []
    for key, on in (("placement.host_device_mix=1", host_device_mix == 1), ("placement.ps=true", ps)):
        if on and not shapes and known:
            notes.append(f"{key}: {owner} has no embedding tables; nothing moves to the host")
        elif on and shapes and set(shapes) <= set(wanted):  # every table has a placement of its own
            notes.append(f"{key}: every table of {owner} has its own placement.tables entry, which it keeps; "
                         f"{key} moves none")
    if (host_device_mix == 1 or ps) and kept:
        notes.append(f"{'placement.ps=true' if ps else 'placement.host_device_mix=1'} leaves inside the parts: "
                     f"{'; '.join(f'{n} ({why})' for n, why in kept.items())}")
    return notes


TABLE_FIELDS = ("lr", "betas", "eps", "l1", "l2", "lr_power", "initial_accumulator")
"""TableConfig's optimizer fields: each read by the TABLE_OPTIMIZERS whose kwargs name it."""


def unread_table_fields(shown: str, optimizer: str, d: Any) -> list[str]:
    """A note per tables.<name>.<field> set to other than its default that the table's optimizer does not read (ftrl
    has no betas, lazy_adam no l1; a dense table none: optimizer.* trains it). A note, not a refusal: a recipe's YAML
    sets its optimizer's fields, and a user who switches the optimizer on the command line did not set them."""
    spec = TABLE_OPTIMIZERS.get(optimizer)
    if spec is None:
        return []
    default, out = TableConfig(), []
    for f in TABLE_FIELDS:
        value, was = getattr(d, f), getattr(default, f)
        value = list(value) if f == "betas" else value
        if f in spec.kwargs or value == was:
            continue
        why = " (optimizer.* trains a dense table)" if optimizer == "dense" else ""
        out.append(f"tables.{shown}.{f}={value}: tables.{shown}.optimizer={optimizer} does not read {f}{why}; "
                   f"it takes {', '.join(k for k in spec.kwargs if k in TABLE_FIELDS) or 'none of them'}")
    return out


def _dense_problems(tables: list[TablePlan], wanted: dict[str, str], host_device_mix: int, ps: bool) -> list[str]:
    """Dense tables (trained inside the engine) beside sparse ones, or where an intent for every table wants them
    outside the engine."""
    dense = [t.name for t in tables if t.optimizer == "dense"]
    problems = []
    if dense and len(dense) != len(tables):
        problems.append(
            f"tables {', '.join(dense)} are dense and {', '.join(t.name for t in tables if t.optimizer != 'dense')} are "
            f"sparse: all tables of a run train either inside the engine or outside it. Set every tables.<name>.optimizer "
            f"to dense, or none."
        )
    if dense and host_device_mix == 1:
        problems.append(
            "placement.host_device_mix=1 needs sparse tables (lazy_adam or ftrl); the tables are dense. "
            "Set tables.<name>.optimizer=lazy_adam, or placement.host_device_mix=0."
        )
    dense_ps = [n for n in dense if n not in wanted]
    if dense_ps and ps:
        which = "the tables are dense" if len(dense) == len(tables) else f"tables {few(dense_ps)} are dense"
        problems.append(f"placement.ps=true splits each table's rows over the ranks, which needs sparse tables "
                        f"(lazy_adam or ftrl); {which}. Set tables.<name>.optimizer=lazy_adam, or placement.ps=false.")
    return problems


def recipe_dense(o: Any) -> DenseSettings:
    """A recipe's optimizer section as the tables follow it (optimizer.name=sgd takes no momentum: DENSE_OPTIMIZERS;
    ``momentum`` is kept for a tables.<path>.optimizer=momentum entry's factor)."""
    betas = (o.betas[0], o.betas[1]) if len(o.betas) == 2 else (0.9, 0.999)  # another length: check_config names it
    return DenseSettings(name=o.name, lr=o.lr, momentum=o.momentum, betas=betas, eps=o.eps,
                         weight_decay=o.weight_decay, decoupled_decay=o.name == "adamw")


def follow_dense(t: TablePlan, d: DenseSettings) -> TablePlan:
    """Table t (no tables.<path> entry) trained by the row-sparse twin of the dense optimizer d, with d's settings:
    sgd, momentum (momentum 0 is sgd), lazy_adam for adam/adamw; lazy Adam with d's lr, betas and eps stands in for
    an optimizer with betas (NAdam, RAdam); lazy Adam's own defaults for any other (Adagrad, RMSprop)."""
    twin = next((n for n, spec in TABLE_OPTIMIZERS.items() if d.name in spec.twin_of), "")
    if twin == "momentum" and d.momentum == 0:
        twin = "sgd"
    if twin in ("sgd", "momentum"):
        m = twin == "momentum"
        t = replace(t, optimizer=twin, lr=d.lr, momentum=d.momentum if m else 0.0, dampening=d.dampening if m else 0.0,
                    nesterov=d.nesterov and m, weight_decay=d.weight_decay)
    elif twin or d.betas is not None:
        t = replace(t, optimizer="lazy_adam", lr=d.lr, betas=d.betas or t.betas, eps=d.eps,
                    weight_decay=d.weight_decay if twin else 0.0, decoupled_decay=d.decoupled_decay)
    else:
        t = replace(t, optimizer="lazy_adam")
    return replace(t, follows=d.name, differs=_differs(t, d.name, twin, d.betas is not None))


def _differs(t: TablePlan, name: str, twin: str, stand_in: bool) -> str:
    decay = " Weight decay, too, applies to the rows a step looks up only." if t.weight_decay else ""
    if t.optimizer == "sgd":
        if t.weight_decay:
            return ("lazy: weight decay applies to the rows a step looks up only (torch's SGD decays every row every "
                    "step); the gradient step is torch's")
        return "exact: torch's SGD update on the rows looked up; the others get no gradient and stay put there too"
    if t.optimizer == "momentum":
        return ("lazy: a row's momentum buffer decays, and the row moves, only on steps it is looked up (torch's dense "
                "momentum decays every buffer and moves every row with one every step)." + decay)
    if twin:
        return ("lazy: a row's Adam moments update, and the row moves, only on steps it is looked up (torch's Adam "
                "updates every row every step)." + decay)
    if stand_in:
        return (f"stand-in: {name} has no row-sparse twin here; lazy Adam with its lr, betas and eps trains the table "
                f"(set tables.<path>.optimizer and .lr to choose another)")
    return (f"fallback: {name} has no row-sparse twin here; lazy Adam with its own defaults trains the table (set "
            f"tables.<path>.optimizer (sgd, momentum, lazy_adam, ftrl) and .lr to choose)")


def twin_words(t: TablePlan) -> str:
    """A few words for the placement view: 'exact twin of sgd', 'lazy twin of momentum', 'stand-in for NAdam',
    'fallback for Adagrad'; '' when the table's tables.<path> entry chose its optimizer."""
    if not t.follows:
        return ""
    kind = t.differs.partition(":")[0]
    return f"{kind} twin of {t.follows}" if kind in ("exact", "lazy") else f"{kind} for {t.follows}"


def plan_table_optimizers(tables: list[TablePlan], configured: set[str], dense_of: Callable[[str], DenseSettings],
                          source: str) -> tuple[list[TablePlan], list[str], list[str]]:
    """(tables, problems, notes): each table outside the engine with no tables.<path> entry (not in ``configured``)
    follows the dense optimizer that ``dense_of(its name)`` describes (follow_dense); a tables.<path>.optimizer=
    momentum entry takes that optimizer's momentum factor (the entry has no key for one). ``source`` names the dense
    optimizer in messages (optimizer.name=sgd; your SGD)."""
    out, problems = [], []
    for t in tables:
        if t.outside and t.name not in configured:
            t = follow_dense(t, dense_of(t.name))
        elif t.outside and t.optimizer == "momentum":
            factor = dense_of(t.name).momentum
            if factor <= 0:
                problems.append(f"tables.{t.name}.optimizer=momentum takes its momentum factor from the dense "
                                f"optimizer ({source}), whose momentum is {factor}. Give it one (optimizer.momentum=0.9;"
                                f" SGD(..., momentum=0.9) in a script), or set tables.{t.name}.optimizer=sgd.")
            t = replace(t, momentum=factor)
        out.append(t)
    return out, problems, follow_notes(out, source)


def follow_notes(tables: list[TablePlan], source: str) -> list[str]:
    """One line per way the following tables train (a recipe may have thousands of tables): which tables, their
    optimizer and settings, and how it differs from the dense one."""
    groups: dict[str, list[str]] = {}
    for t in tables:
        if t.follows and t.outside:
            groups.setdefault(f"{t.optimizer} ({settings_words(t)}) — {t.differs}", []).append(t.name)
    notes = []
    for how, names in groups.items():
        notes.append(f"{'tables' if len(names) > 1 else 'table'} {few(names)} follow{'' if len(names) > 1 else 's'} "
                     f"{source}: {how}")
    return notes


def settings_words(t: TablePlan) -> str:
    """'row-sparse, lr 0.1, momentum 0.9, weight decay 0.01': what a table's optimizer runs with."""
    words = ["row-sparse", f"lr {t.lr:g}"]
    if t.optimizer == "momentum":
        words.append(f"momentum {t.momentum:g}" + (f", dampening {t.dampening:g}" if t.dampening else "")
                     + (", nesterov" if t.nesterov else ""))
    if t.optimizer in ("lazy_adam", "sparse_adam"):
        words.append(f"betas ({t.betas[0]:g}, {t.betas[1]:g})")
    if t.weight_decay:
        words.append(f"weight decay {t.weight_decay:g}" + (" decoupled" if t.optimizer == "lazy_adam"
                                                            and t.decoupled_decay else ""))
    return ", ".join(words)


def _from_deepspeed_file(cfg: DictConfig, key: str) -> bool:
    """``key`` may hold deepspeed.config's value (adopted where the command line did not name it): a DeepSpeed file
    written for GPUs that runs here as it is."""
    return cfg.deepspeed.config is not None and key not in cfg.deepspeed.given


def plan_placement(cfg: DictConfig, shapes: dict[str, tuple[int, int]] | None, dense_count: int, device_type: str,
                   default: TableConfig | None = None, kept: dict[str, str] | None = None,
                   group_size: int = 1, aliases: dict[str, str] | None = None
                   ) -> tuple[PlacementPlan | None, int, list[str], list[str]]:
    """(placement, effective ZeRO stage, problems, notes) for the recipe's tables (module path -> (rows, dim)) and
    its dense_count parameters outside them. ``default`` is how a table without a ``tables.<path>`` entry trains:
    dense, or outside the engine (then with optimizer.name's twin: plan_table_optimizers). ``shapes=None``: the
    tables are not known yet (a script run). ``group_size``: the ranks of one pipeline stage (world size /
    pipeline_stages), over which a ps table's rows are split. ``aliases``: other names of tables (a TorchRec table's
    own name) -> module path, which placement.tables and tables may use."""
    known = shapes is not None
    shapes = shapes or {}
    pl, o = cfg.placement, cfg.optimizer
    # Plain containers: OmegaConf node access costs ~50 us a key, and a recipe may have thousands of tables
    # (to_plain: OmegaConf.to_container at a tenth of its cost).
    table_cfgs, problems = resolve_aliases("tables", {name: TableConfig(**t) for name, t in
                                                      to_plain(cfg.tables, resolve=False).items()}, aliases or {})
    wanted, alias_problems = resolve_aliases("placement.tables", to_plain(pl.tables, resolve=False), aliases or {})
    owner = OmegaConf.select(cfg, "recipe.name", default=None, throw_on_missing=False)
    named = {path: name for name, path in (aliases or {}).items()}
    tables, table_problems, notes = plan_tables(shapes, table_cfgs, wanted, pl.host_device_mix,
                                                default or TableConfig(), f"recipe {owner}" if owner else "the model",
                                                known, kept, ps=pl.ps, group_size=group_size, names=named)
    problems += alias_problems + table_problems
    tables = [replace(t, alias=named.get(t.name, "")) for t in tables]
    dense_settings = recipe_dense(o)
    tables, follow_problems, follow = plan_table_optimizers(tables, set(table_cfgs), lambda _: dense_settings,
                                                            f"optimizer.name={o.name}")
    problems += follow_problems
    notes += follow
    dense = [t.name for t in tables if t.optimizer == "dense"]
    sparse = bool(tables) and not dense

    stage = cfg.zero.stage
    target = o.target.lower()
    if target not in ("device", "cpu"):
        problems.append(f"optimizer.target={o.target} must be device or CPU.")
    if o.cpu_impl not in CPU_OPTIMIZERS:
        problems.append(unknown("optimizer.cpu_impl", o.cpu_impl, CPU_OPTIMIZERS))
    offload_opt = target == "cpu"
    if offload_opt and stage == 0:
        stage = 2
        notes.append("optimizer.target=CPU needs ZeRO (offload_optimizer): zero.stage 0 -> 2")
    cpu = CPU_OPTIMIZERS.get(o.cpu_impl)
    if cpu is not None and cpu.impl and not DENSE_OPTIMIZERS.get(o.name, DENSE_OPTIMIZERS["sgd"]).ds_cpu_adam:
        problems.append(f"optimizer.cpu_impl=deepspeed runs DeepSpeedCPUAdam, which needs optimizer.name=adam or "
                        f"adamw; got optimizer.name={o.name}. Set optimizer.cpu_impl=torch.")
    if not offload_opt and cpu is not None and cpu.impl and pl.mode != "auto":  # auto may put it on the host
        problems.append(f"optimizer.cpu_impl={o.cpu_impl} chooses what steps the optimizer on the host, and "
                        f"optimizer.target={o.target} keeps it on the device, so nothing would read it. Set "
                        f"optimizer.target=CPU (ZeRO-Offload), or remove optimizer.cpu_impl.")
    if pl.offload_params and stage != 3:
        problems.append(f"placement.offload_params=true needs zero.stage=3 (offload_param partitions parameters); "
                        f"got zero.stage={stage}. Set zero.stage=3 or placement.offload_params=false.")
    if pl.mode not in PLACEMENT_MODES:  # any other value was planned as manual, silently
        hint = did_you_mean(str(pl.mode), PLACEMENT_MODES, "placement.mode=")
        problems.append(f"placement.mode={pl.mode} is not one of {', '.join(PLACEMENT_MODES)}.{hint} placement=auto "
                        f"lets the planner choose where everything lives; manual keeps your intents.")
    pin = str(pl.pin_memory).lower()
    if pin not in ("auto", "true", "false"):
        problems.append(f"placement.pin_memory={pl.pin_memory} must be auto, true or false.")
    elif pin == "true" and device_type != "cuda" and not _from_deepspeed_file(cfg, "placement.pin_memory"):
        problems.append("placement.pin_memory=true: pinned (page-locked) host memory speeds offload copies to a GPU; "
                        "this run is on the CPU, where it would do nothing. Remove it (auto pins with CUDA).")
    pin_memory = device_type == "cuda" if pin == "auto" else pin == "true"
    dense_params = dense_count + (0 if sparse else sum(r * d for r, d in shapes.values()))
    plan = PlacementPlan(
        tables=tuple(tables),
        sparse_tables=sparse,
        dense_params=dense_params,
        param_location="host" if pl.offload_params else "device",
        optimizer_location="host" if offload_opt else "device",
        cpu_impl=o.cpu_impl,
        pin_memory=pin_memory,
    )
    return plan, stage, problems, notes


def sparse_grad_problems(sparse: tuple[str, ...], tables: tuple[TablePlan, ...], optimizer: str,
                         weight_decay: float) -> list[str]:
    """Embeddings built with sparse=True that train inside the parts, where optimizer.name's torch class cannot take
    their sparse gradients (nor torch's SGD with a weight decay): every rank would fail at its first step."""
    names, outside = {t.name for t in tables}, {t.name for t in tables if t.outside}
    inside = [p for p in sparse if p not in outside]
    spec = DENSE_OPTIMIZERS.get(optimizer)
    if not inside or spec is None or (spec.sparse_grads and not weight_decay):
        return []
    it, its, is_ = ("it", "its", "is") if len(inside) == 1 else ("them", "their", "are")
    which = f"optimizer.name={optimizer}" + (f" with optimizer.weight_decay={weight_decay}" if spec.sparse_grads else "")
    takers = ", ".join(n for n, s in DENSE_OPTIMIZERS.items() if s.sparse_grads)
    movable = [p for p in inside if p in names]
    out = (f"train {it} outside the parts with a row-sparse optimizer (tables.{movable[0]}.optimizer=lazy_adam on the "
           f"device, or placement.host_device_mix=1: every table on the host), " if movable else "")
    return [f"model: {few(inside)} {is_} built with sparse=True, so inside the parallel parts {its} gradients are "
            f"sparse, which {which} ({spec.impl}) cannot take: every rank would fail at its first step. Either {out}"
            f"set optimizer.name to one that takes sparse gradients ({takers}; optimizer.weight_decay=0), or build "
            f"{it} with sparse=False."]
