"""Pipeline parallelism on DeepSpeed's PipelineModule and its 1F1B train schedule (``PipelineEngine.train_batch``).

The plan decided which of the recipe's ``layers()`` each stage runs (``PipelinePlan``). Every rank builds the whole
model from the same seed (so a stage's weights are the one-process model's), applies recompute, and hands
DeepSpeed one ``Stage`` module per pipeline stage with ``partition_method="uniform"``: stage s gets exactly the
layers the plan gave it, and DeepSpeed's partitioner has nothing left to decide. DeepSpeed sends the activations
between stages, runs the schedule, averages gradients over the data-parallel group and steps the optimizer.

A weight two stages share (GPT's head tied to its token embedding) lives once per stage; before every optimizer step
the stages that hold it sum their gradients (an all-reduce over those ranks, a ``register_step_pre_hook`` on the
torch optimizer), so each copy takes the one-process model's step and the copies never drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from launcher.plan.pipeline import PipelinePlan
from launcher.rundir import CheckpointDir
from launcher.worker.engines import Unscaled


class Stage(nn.Module):
    """Some of a model's layers, run in order: one pipeline stage. The first stage unpacks a model with several
    inputs (DeepSpeed passes them as one tuple)."""

    def __init__(self, names: Iterable[str], layers: Iterable[nn.Module], first: bool) -> None:
        super().__init__()
        self.names = list(names)
        self.layers = nn.ModuleList(layers)
        self.first = first

    def forward(self, x: Any) -> Any:
        for i, layer in enumerate(self.layers):
            x = layer(*x) if i == 0 and self.first and isinstance(x, tuple) else layer(x)
        return x


def build_stages(layers: list[tuple[str, nn.Module]], plan: PipelinePlan) -> list[Stage]:
    """The model's named layers grouped as the plan's stages say (every layer in exactly one stage, in order)."""
    by_name = dict(layers)
    return [Stage(s.layers, [by_name[n] for n in s.layers], first=s.index == 0) for s in plan.stages]


def _tied_parameter(stage: Stage, paths: tuple[str, ...]) -> nn.Parameter | None:
    """The one parameter behind ``paths`` (``<layer name>.<attribute path>``, all the same tensor) that this stage
    holds; None when it holds none of those layers."""
    for path in paths:
        for name, module in zip(stage.names, stage.layers):
            if path.startswith(name + "."):
                return module.get_parameter(path[len(name) + 1:])
    return None


class PipelineEngine(Unscaled):
    """The Engine seam for a pipeline: DeepSpeed drives the micro-batches itself, so the Trainer calls
    ``train_batch`` with a step's micro-batches instead of forward/backward/step per micro-batch."""

    drives_schedule = True

    def __init__(self, layers: list[tuple[str, nn.Module]], plan: PipelinePlan, loss_fn: nn.Module, *,
                 optimizer_factory, dims, config: dict[str, Any], backend: str, device: torch.device) -> None:
        import deepspeed  # after the env is in place: DS_ACCELERATOR, TORCH_EXTENSIONS_DIR
        from deepspeed.pipe import PipelineModule
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

        deepspeed.init_distributed(dist_backend=backend)  # the process group exists: DeepSpeed adopts it
        stages = build_stages(layers, plan)
        topology = PipeDataParallelTopology(num_pp=dims.pp, num_dp=dims.dp)  # rank = stage × dp + dp rank: our mesh
        # dynamic_shape: a held-out set's last micro-batch may be smaller; DeepSpeed then sends each activation's
        # shape along with it instead of reusing the first one's.
        pipe = PipelineModule(layers=stages, topology=topology, loss_fn=loss_fn, partition_method="uniform",
                              dynamic_shape=True)
        pipe.to(device)
        optimizer = optimizer_factory(pipe.parameters())
        self._stage = dims.coords(dist.get_rank())["pp"]
        self._hook_tied(stages[self._stage], plan, dims, optimizer)
        self._ds, _, _, _ = deepspeed.initialize(model=pipe, optimizer=optimizer, config=config)
        self.module = self._ds.module
        self.optimizer = self._ds.optimizer

    def _hook_tied(self, stage: Stage, plan: PipelinePlan, dims, optimizer: torch.optim.Optimizer) -> None:
        """Sum each tied weight's gradient over the stages that hold it (same dp rank), before every step. Every
        rank creates every group (``new_group`` is collective), in the plan's order."""
        me = dist.get_rank()
        coords = dims.coords(me)
        mine = []
        for tie in plan.tied:
            for dp in range(dims.dp):
                ranks = [dims.rank_of({"pp": s, "dp": dp, "tp": 0}) for s in tie.stages]
                group = dist.new_group(ranks)
                if me in ranks and dp == coords["dp"]:
                    mine.append((group, _tied_parameter(stage, tie.paths)))
        if not mine:
            return

        def sum_tied(_optimizer, _args, _kwargs) -> None:
            for group, p in mine:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=group)

        optimizer.register_step_pre_hook(sum_tied)

    # -- the step ---------------------------------------------------------------------------------------------------
    def train_batch(self, micro_batches: list[tuple[Any, Any]]) -> torch.Tensor:
        """One optimizer step over ``micro_batches`` ((inputs, labels) each, on the device) by the 1F1B schedule;
        the mean loss over them and the data-parallel group, on every stage (DeepSpeed broadcasts it)."""
        return self._ds.train_batch(iter(micro_batches)).reshape(())

    def eval_loss(self, batch: tuple[Any, Any]) -> torch.Tensor:
        """The loss of one held-out micro-batch (the last stage computes it; every stage gets it)."""
        return self._ds.eval_batch(iter([batch]), num_micro_batches=1).reshape(())

    def train(self, mode: bool = True) -> Any:
        return self._ds.train(mode)

    def eval(self) -> Any:
        return self._ds.eval()

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a pipeline runs whole steps: call train_batch() (DeepSpeed's PipelineEngine has no "
                           "forward of one stage)")

    def state_dict(self) -> dict[str, Any]:
        """This stage's layers and its optimizer's state (fp32, ZeRO-0: nothing is sharded)."""
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise RuntimeError(f"{type(self.optimizer).__name__} keeps its state in shards: use Trainer.save(), "
                               f"which writes DeepSpeed's checkpoint.")
        return {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, ckpt: CheckpointDir) -> None:
        self._ds.save_checkpoint(str(ckpt.root), tag=ckpt.tag)  # one file per stage's layers, as DeepSpeed lays out

    def load(self, ckpt: CheckpointDir) -> None:
        path, _ = self._ds.load_checkpoint(str(ckpt.root), tag=ckpt.tag)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {ckpt.path}")
