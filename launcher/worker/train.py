"""Inside one rank: build the recipe, wrap it in DeepSpeed with the planned config, train, evaluate, checkpoint."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import OmegaConf

from launcher.plan import LaunchPlan
from launcher.worker.accounting import measure_memory
from launcher.worker.evaluate import evaluate, mean_over_ranks
from launcher.worker.metrics import MetricsWriter
from launcher.worker.optim import build_optimizer
from launcher.worker.tables import TableSet
from launcher.worker.transfer import host_to_device

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def run_rank(run_dir: str | Path) -> None:
    run_dir = Path(run_dir)
    plan = LaunchPlan.from_dict(json.loads((run_dir / "plan.json").read_text()))
    cfg = OmegaConf.load(run_dir / "config.yaml")
    rank = int(os.environ["RANK"])
    rank_dir = run_dir / f"rank.{rank}"
    rank_dir.mkdir(exist_ok=True)
    (rank_dir / "pid").write_text(str(os.getpid()))
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 + DeepSpeed: all_gather_into_tensor ...

    import deepspeed  # after the env is in place: DS_ACCELERATOR, TORCH_EXTENSIONS_DIR

    device = torch.device(plan.ranks[rank].device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=plan.backend)  # env:// rendezvous on the launcher's TCPStore
    deepspeed.init_distributed(dist_backend=plan.backend)

    torch.manual_seed(plan.seed)
    model = instantiate(cfg.model)
    loss_fn = instantiate(cfg.loss)
    data = instantiate(cfg.data)
    dtype = _DTYPES[plan.precision]
    tables = None
    net = model
    if plan.placement.sparse_tables:  # tables train outside the engine; the engine gets the rest of the model
        tables = TableSet(model.tables, plan.placement.tables, device)
        net = model.body
    optimizer = build_optimizer(plan.optimizer, plan.placement, net.parameters())
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=plan.deepspeed)
    step_fn = _Forward(engine, model, tables, device, dtype)
    metrics = MetricsWriter(rank_dir)
    dp_rank = rank  # data parallel only, for now: one data shard per rank
    batches = data.train_batches(dp_rank, plan.dp, plan.batch.micro_size, plan.seed)
    fail_rank, fail_step = plan.debug_fail
    try:
        tick, tick_step = time.perf_counter(), 0
        for step in range(1, plan.steps + 1):
            step_loss = torch.zeros((), device=device)
            for _ in range(plan.batch.grad_accum):
                out, labels = step_fn(next(batches), train=True)
                loss = loss_fn(out, labels)
                engine.backward(loss)
                if tables is not None:
                    tables.collect_grads()
                engine.step()
                step_loss += loss.detach().float()
            if tables is not None:
                tables.step()
            if step == 1:
                (rank_dir / "memory.json").write_text(json.dumps(measure_memory(engine, tables, plan.placement), indent=2))
            if rank == fail_rank and step == fail_step:
                raise RuntimeError(f"debug.fail_rank={fail_rank} debug.fail_step={fail_step}: injected failure")
            metrics.step_done(step)
            if step == 1 or step % plan.log_every == 0 or step == plan.steps:
                local = (step_loss / plan.batch.grad_accum).item()
                mean = mean_over_ranks(step_loss / plan.batch.grad_accum)
                now = time.perf_counter()
                rate = (step - tick_step) * plan.batch.global_size / (now - tick)
                metrics.write(step=step, loss=mean, local_loss=local, samples_per_s=round(rate, 1))
                tick, tick_step = now, step
            if plan.eval_every > 0 and step % plan.eval_every == 0 and step != plan.steps and plan.eval_batches > 0:
                metrics.write(event="eval", step=step, **evaluate(step_fn, loss_fn, data, plan, dp_rank, device))
                tick = time.perf_counter()  # evaluation time is not training throughput
            if plan.checkpoint_every > 0 and step % plan.checkpoint_every == 0 and step != plan.steps:
                _checkpoint(engine, tables, run_dir, step, rank)
        if plan.eval_batches > 0:
            metrics.write(event="eval", step=plan.steps, **evaluate(step_fn, loss_fn, data, plan, dp_rank, device))
        if plan.checkpoint_every >= 0:
            _checkpoint(engine, tables, run_dir, plan.steps, rank)
        if tables is not None:
            (rank_dir / "tables.json").write_text(json.dumps(tables.digests(), indent=2))
        dist.barrier()
    finally:
        metrics.close()
    dist.destroy_process_group()


class _Forward:
    """One micro-batch forward: inputs to the device; with sparse tables, rows looked up where the tables live."""

    def __init__(self, engine, model, tables: TableSet | None, device, dtype) -> None:
        self.engine, self.model, self.tables, self.device, self.dtype = engine, model, tables, device, dtype

    def __call__(self, batch, train: bool):
        inputs, labels = batch
        moved = tuple(host_to_device(t, self.device, self.dtype) for t in inputs)
        if self.tables is None:
            return self.engine(*moved), host_to_device(labels, self.device, self.dtype)
        looked_up = self.tables.lookup(self.model.table_rows(*inputs), self.dtype, train=train)
        return self.engine(*moved, **looked_up), host_to_device(labels, self.device, self.dtype)


def _checkpoint(engine, tables: TableSet | None, run_dir: Path, step: int, rank: int) -> None:
    """DeepSpeed's checkpoint of the engine (every rank writes its shard) + the sparse tables (rank 0)."""
    tag = f"step{step}"
    engine.save_checkpoint(str(run_dir / "checkpoints"), tag=tag)
    if tables is not None and rank == 0:
        tables.save(run_dir / "checkpoints" / tag / "tables.pt")


