"""``prepare()`` for your own training loop: the plan hetero-launch compiled, applied to your model and optimizer.

    from launcher import runtime

    model, optimizer = runtime.prepare(model, optimizer)   # engine, placement, ZeRO/offload as planned
    for step, (x, y) in enumerate(loader, 1):
        loss = loss_fn(model(*runtime.move(x)), runtime.move(y)[0])
        runtime.backward(loss)
        runtime.step()
        runtime.log(step=step, loss=loss)                  # progress, metrics.jsonl, summary.json, loggers

Under ``hetero-launch script=train.py`` the run dir's plan says what to build (``RuntimePlan``: torch DDP or
DeepSpeed with its config; tables to the host with ``placement.host_device_mix=1``; ZeRO-Offload with
``optimizer.target=CPU``). Under plain ``torchrun`` (or ``python``) the same script gets the defaults: torch DDP,
fp32, every table inside it, your optimizer as it is. Like ``accelerator.prepare`` and ``deepspeed.initialize``."""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import socket
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.runtime.prepare import _PreparedModel, _PreparedOptimizer, drop_from_optimizer, group_of, schedule_of, tables_of
from launcher.log_args import checked_log_args
from launcher.loggers.sink import open_metrics
from launcher.plan.placement import follow_notes, plan_table_optimizers, plan_tables, takes_tables_out
from launcher.plan.table_keys import resolve_aliases
from launcher.metrics_writer import MetricsWriter
from launcher.plan.script import RuntimePlan
from launcher.rundir import RUN_DIR_ENV, RankDir, RunDir, register_stack_dump
from launcher.schema import TableConfig

__all__ = ["backward", "device", "load_state_dict", "log", "move", "prepare", "rank", "state_dict", "step", "world_size"]

class _State:
    plan: RuntimePlan | None = None
    engine: Any = None
    tables: Any = None
    micro: int = 0
    metrics: MetricsWriter | None = None
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    schedule: tuple = ()
    """(table, its lr at prepare(), index of the engine optimizer's param group it follows, that group's base lr)
    for each host table that trains with your optimizer's settings: its lr moves with that group's (an LR
    scheduler's) every step."""


_S = _State()


def _default_plan() -> RuntimePlan:
    """Without hetero-launch's plan (plain torchrun or python): replicated fp32 data parallelism, tables inside."""
    from launcher import parallel
    from launcher.plan.parallel import ParallelDims
    from launcher.plan.placement import PlacementPlan

    world = world_size()
    intents = parallel.Intents(dims=ParallelDims(dp=world, pp=1, tp=1, world_size=world), zero=0,
                               offload_optimizer=False, offload_params=False, precision="fp32", client_optimizer=True)
    parts, _, _ = parallel.plan_parts(intents)
    placement = PlacementPlan(tables=(), sparse_tables=False, dense_params=0, param_location="device",
                              optimizer_location="device", cpu_impl="torch", pin_memory=False)
    return RuntimePlan(parts=parts, zero_stage=0, precision="fp32", grad_accum=1, placement=placement,
                       host_device_mix=0, table_locations={}, table_configs={},
                       backend="nccl" if torch.cuda.is_available() else "gloo")


def _init_process_group(backend: str | None = None) -> None:
    """Join the group torchrun / hetero-launch describe in the environment (with the plan's backend under
    hetero-launch); a plain ``python`` run is world 1."""
    if dist.is_initialized():
        return
    atexit.register(_finish)
    if os.environ.get(RUN_DIR_ENV):  # under hetero-launch: its watchdog may ask for this rank's stacks
        register_stack_dump()
    if "WORLD_SIZE" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"))


def _close_metrics() -> None:
    if _S.metrics is not None:
        _S.metrics.close()
        _S.metrics = None


def _finish() -> None:
    """At exit of a script whose group prepare() created: records closed, the group torn down."""
    _close_metrics()
    if dist.is_initialized():
        # Every rank reaches the end before any tears its connections down: a rank that destroyed its group while a
        # peer's gloo thread still talked to it aborted ("terminate called without an active exception", SIGABRT) at
        # exit after a finished run. The recipe worker does the same before destroy_process_group.
        # gloo's barrier may return on one rank before its last message reached a peer (the abort was still seen):
        # each rank also checks in on the store and tears down once all have returned from the barrier.
        dist.barrier()
        all_returned(dist.distributed_c10d._get_default_store(), dist.get_world_size())
        dist.destroy_process_group()


def all_returned(store, world: int, timeout_s: float = 30.0, key: str = "hetero_launch/final_barrier") -> None:
    """Count this rank in on the rendezvous store and wait (up to timeout_s) until every rank has."""
    deadline, count = time.monotonic() + timeout_s, store.add(key, 1)
    while count < world and time.monotonic() < deadline:
        time.sleep(0.01)
        count = store.add(key, 0)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def device() -> torch.device:
    """Where this rank computes: cuda:<LOCAL_RANK> with CUDA, else the CPU."""
    return _S.device


def move(*batch: Any) -> tuple[Any, ...]:
    """Tensors, or any structures of them (dicts, tuples, TorchRec's KeyedJaggedTensor), to this rank's device;
    floating ones in the training precision (bf16 with precision=bf16)."""
    from launcher.usercode.items import move_to

    return tuple(move_to(b, _S.device, _S.dtype) for b in batch)


def prepare(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """(model, optimizer) as the plan compiles them: call the model as before; use ``runtime.backward(loss)`` and
    ``runtime.step()`` (or the returned optimizer's ``step()``) instead of ``loss.backward()`` / ``optimizer.step()``."""
    from launcher.tables import build_tables
    from launcher.tables.sparse_optim import dense_settings
    from launcher.worker.mesh import world_mesh
    from launcher.worker.trainer import DTYPES

    run_dir = os.environ.get(RUN_DIR_ENV)
    planned = RunDir(run_dir).read_plan() if run_dir else {}
    plan = RuntimePlan.from_dict(planned["runtime"]) if run_dir else _default_plan()
    _init_process_group(planned.get("backend"))
    local = int(os.environ.get("LOCAL_RANK", 0))
    on_cuda = planned["device_type"] == "cuda" if planned else torch.cuda.is_available()  # the plan decides
    _S.device = torch.device(f"cuda:{local}") if on_cuda else torch.device("cpu")
    if _S.device.type == "cuda":
        torch.cuda.set_device(_S.device)
    _S.plan, _S.dtype, _S.micro = plan, DTYPES[plan.precision], 0  # the precision's dtype, as the Trainer's
    shapes, aliases = tables_of(model)
    intent = takes_tables_out(plan.host_device_mix, plan.table_locations, plan.table_configs, plan.ps)
    table_cfgs, problems = resolve_aliases("tables", {n: TableConfig(**t) for n, t in plan.table_configs.items()},
                                           aliases)
    locations, more = resolve_aliases("placement.tables", plan.table_locations, aliases)
    problems += more
    tables, found, _ = plan_tables(shapes, table_cfgs, locations, plan.host_device_mix,
                                      TableConfig(optimizer="lazy_adam" if intent else "dense"),
                                      f"the model ({type(model).__name__})", ps=plan.ps, group_size=world_size())
    problems += found
    yours = f"your {type(optimizer).__name__}"
    tables, follow_problems, table_notes = plan_table_optimizers(
        tables, set(table_cfgs), lambda name: dense_settings(optimizer, model.get_submodule(name).weight), yours)
    problems += follow_problems
    if problems:
        raise ValueError("runtime.prepare(): " + " ".join(problems))
    sparse = [t for t in tables if t.outside]
    untwinned = [t for t in sparse if t.differs.startswith(("fallback", "stand-in"))]
    if untwinned and rank() == 0:  # your optimizer has no row-sparse twin: said on stderr, not only in prepared.json
        warnings.warn("runtime.prepare(): " + "; ".join(follow_notes(untwinned, yours)), stacklevel=2)
    followed = {}
    if sparse:
        weights = [model.get_submodule(t.name).weight for t in sparse]  # before the swap takes the modules out
        followed = {t.name: group_of(optimizer, w) for t, w in zip(sparse, weights) if t.name not in table_cfgs}
        mesh = world_mesh(_S.device.type) if any(t.sharded for t in sparse) else None  # ps: over every rank
        group = mesh.get_group() if mesh is not None else None
        _S.tables = build_tables([model], tuple(sparse), _S.device, _S.dtype, dist.group.WORLD, group, mesh)
        drop_from_optimizer(optimizer, {id(w) for w in weights})
    _S.engine = _build_engine(plan, model, optimizer)
    _S.schedule = schedule_of(sparse, followed, optimizer, _S.engine.optimizer.param_groups)
    if run_dir:
        rank_dir = RunDir(run_dir).rank(rank())
        _S.metrics = open_metrics(rank_dir, planned.get("loggers", ()), rank())  # rank 0's feeds the loggers
        _write_prepared(rank_dir, [*sparse, *(t for t in tables if not t.outside)], table_notes)
    return _PreparedModel(_S.engine), _PreparedOptimizer(_S.engine.optimizer, step)


def _build_engine(plan: RuntimePlan, model: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """The planned data-parallel part around the script's model and optimizer (launcher.parallel.compose)."""
    from launcher.parallel.compose import apply_parts
    from launcher.parallel.rank import Chunk, RankContext

    rt = RankContext(plan=dataclasses.replace(plan, backend=dist.get_backend()), mesh=None, device=_S.device,
                     dp_group=dist.group.WORLD, rank=rank(), grad_accum=plan.grad_accum)
    return apply_parts([Chunk(module=model, paths=[])], rt, lambda _params: optimizer)


def _follow_schedule() -> None:
    """Before the tables step: each followed table's lr = its lr at prepare() x (its group's lr now / then)."""
    groups = _S.engine.optimizer.param_groups
    for name, lr, index, base in _S.schedule:
        now = groups[index]["lr"]
        _S.tables.set_lr(name, lr * now / base if base > 0 else now)


def _write_prepared(rank_dir: RankDir, tables, table_notes: list[str]) -> None:
    opt = _S.engine.optimizer
    held = _S.tables.held() if _S.tables is not None else {}
    info = {
        "parts": [p.name for p in _S.plan.parts],
        "engine": type(_S.engine).__name__,
        "zero_stage": getattr(_S.engine, "zero_stage", 0),  # what DeepSpeed's engine says it runs
        "offload_optimizer": bool(getattr(opt, "cpu_offload", False) or getattr(opt, "offload_optimizer", False)),
        "precision": _S.plan.precision,
        "tables": {t.name: {"location": t.location, "optimizer": t.optimizer, "lr": t.lr, "shards": t.shards,
                            "torch_device": held[t.name][1].device.type if t.name in held else None,
                            "rows_held": len(held[t.name][1]) if t.name in held else None}
                   for t in tables},
        "table_notes": table_notes,  # which optimizer each table follows and how it differs (plan_table_optimizers)
        "engine_params": sum(p.numel() for p in _S.engine.module.parameters()),
    }
    rank_dir.prepared.write_text(json.dumps(info, indent=2))


def state_dict() -> dict[str, Any]:
    """Everything to save: the engine's model and optimizer and the tables outside it with their optimizers'
    states (``model.state_dict()`` alone would miss the tables). A DeepSpeed engine that shards its state
    (ZeRO 1-3, bf16) has none in memory: this raises, and DeepSpeed's own ``save_checkpoint`` is the way there."""
    _need_prepare()
    return {"engine": _S.engine.state_dict(), "tables": _S.tables.state_dict() if _S.tables is not None else None,
            "micro_steps": _S.micro}


def load_state_dict(state: dict[str, Any]) -> None:
    _need_prepare()
    _S.engine.load_state_dict(state["engine"])
    if _S.tables is not None:
        _S.tables.load_state_dict(state["tables"])
    _S.micro = int(state["micro_steps"])


def _need_prepare() -> None:
    if _S.engine is None:
        raise RuntimeError("call runtime.prepare(model, optimizer) first")


def backward(loss: torch.Tensor) -> None:
    """Backward of one micro-batch's loss (divided by grad_accum, loss-scaled with fp16 by the engine)."""
    _need_prepare()
    _S.engine.backward(loss)
    if _S.tables is not None:
        _S.tables.collect(_S.engine.loss_scale)


def step() -> None:
    """After every micro-batch: the engine steps at the accumulation boundary, the host tables with it."""
    _need_prepare()
    _S.engine.step()
    _S.micro += 1
    if _S.tables is not None and _S.micro % _S.plan.grad_accum == 0:
        if _S.engine.step_skipped:
            _S.tables.discard()
        else:
            _follow_schedule()
            _S.tables.step()


def log(step: int, loss: float | torch.Tensor | None = None, **values: float) -> None:
    """Record a step (call it on every rank: the loss is averaged over them), with or without ``prepare()``. Under
    hetero-launch it feeds the progress view, rank.N/metrics.jsonl (the channel a recipe's steps take) and
    summary.json (last step, final loss, the other values); under torchrun rank 0 prints it."""
    step, loss, values = checked_log_args(step, loss, values)  # a bad argument fails here, in the rank
    record: dict[str, Any] = {"step": step}
    if loss is not None:
        t = loss.detach().float().clone() if torch.is_tensor(loss) else torch.tensor(loss)
        record["local_loss"] = t.item()
        if dist.is_initialized() and world_size() > 1:
            t = t.to(_reduce_device())
            dist.all_reduce(t)
            t /= world_size()
        record["loss"] = t.item()
    record.update({k: float(v.item()) if torch.is_tensor(v) else v for k, v in values.items()})
    if "lr" not in record and _S.engine is not None and _S.engine.optimizer.param_groups:  # as a recipe's steps
        record["lr"] = float(_S.engine.optimizer.param_groups[0]["lr"])
    if _S.metrics is None and os.environ.get(RUN_DIR_ENV):  # a script that logs without prepare(): as prepare() opens
        run_dir = RunDir(os.environ[RUN_DIR_ENV])
        _S.metrics = open_metrics(run_dir.rank(rank()), run_dir.read_plan().get("loggers", ()), rank())
        atexit.register(_close_metrics)
    if _S.metrics is not None:
        _S.metrics.step_done(step)
        _S.metrics.write(**record)
    elif rank() == 0:
        print(json.dumps(record), flush=True)


def _reduce_device() -> torch.device:
    """Where log() averages the loss: the prepared device, or (a group the script made itself) cuda with nccl."""
    if _S.engine is None and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return _S.device
