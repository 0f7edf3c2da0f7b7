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
from launcher.worker.metrics import MetricsWriter
from launcher.worker.optim import build_optimizer

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
    optimizer = build_optimizer(plan.optimizer, model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=plan.deepspeed)
    dtype = _DTYPES[plan.precision]
    metrics = MetricsWriter(rank_dir)
    dp_rank = rank  # data parallel only, for now: one data shard per rank
    batches = data.train_batches(dp_rank, plan.dp, plan.batch.micro_size, plan.seed)
    fail_rank, fail_step = plan.debug_fail
    try:
        tick, tick_step = time.perf_counter(), 0
        for step in range(1, plan.steps + 1):
            step_loss = torch.zeros((), device=device)
            for _ in range(plan.batch.grad_accum):
                inputs, labels = _to(next(batches), device, dtype)
                loss = loss_fn(engine(*inputs), labels)
                engine.backward(loss)
                engine.step()
                step_loss += loss.detach().float()
            if rank == fail_rank and step == fail_step:
                raise RuntimeError(f"debug.fail_rank={fail_rank} debug.fail_step={fail_step}: injected failure")
            metrics.step_done(step)
            if step == 1 or step % plan.log_every == 0 or step == plan.steps:
                mean = _mean_over_ranks(step_loss / plan.batch.grad_accum)
                now = time.perf_counter()
                rate = (step - tick_step) * plan.batch.global_size / (now - tick)
                metrics.write(step=step, loss=mean, samples_per_s=round(rate, 1))
                tick, tick_step = now, step
            if plan.checkpoint_every > 0 and step % plan.checkpoint_every == 0 and step != plan.steps:
                engine.save_checkpoint(str(run_dir / "checkpoints"), tag=f"step{step}")
        if plan.eval_batches > 0:
            metrics.write(event="eval", step=plan.steps, **_evaluate(engine, loss_fn, data, plan, dp_rank, device, dtype))
        if plan.checkpoint_every >= 0:
            engine.save_checkpoint(str(run_dir / "checkpoints"), tag=f"step{plan.steps}")
        dist.barrier()
    finally:
        metrics.close()
    dist.destroy_process_group()


def _to(batch, device, dtype):
    inputs, labels = batch

    def move(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device, non_blocking=True)
        return t.to(dtype) if t.is_floating_point() else t

    return tuple(move(t) for t in inputs), move(labels)


def _mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


@torch.no_grad()
def _evaluate(engine, loss_fn, data, plan: LaunchPlan, dp_rank: int, device, dtype) -> dict:
    engine.eval()
    total, n = torch.zeros((), device=device), 0
    for batch in data.eval_batches(dp_rank, plan.dp, plan.batch.micro_size, plan.eval_batches):
        inputs, labels = _to(batch, device, dtype)
        total += loss_fn(engine(*inputs), labels).float()
        n += 1
    engine.train()
    return {"loss": _mean_over_ranks(total / max(n, 1)), "n": n * plan.batch.micro_size * plan.dp}
