"""The pipeline part's engine: this rank's stages in torch.distributed.pipelining's ``PipelineStage`` and the planned
schedule, a torch optimizer over their parameters, DCP checkpoints (launcher/parallel/pipeline.py says what and why).

The micro-batches reach the stages as they are, whatever their structure (a KeyedJaggedTensor, a dict): torch's
schedules split the step's arguments with ``tensor_split``, so the first stage is given the micro-batches' numbers
(``arange(M)``, split into one number each) and looks its micro-batch up (``Feed``), as the last stage's loss looks up
its labels. A short held-out batch runs through stages shaped for full micro-batches: the first stage computes it as
it is and repeats the rows of what it sends up to the full micro-batch (``fit``), and the rows past the batch are
dropped from the output.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from launcher.parallel.engine import DTYPES, ChunkEngine
from launcher.parallel.pipeline_stages import stage_examples
from launcher.parallel.rank import local_tensor
from launcher.usercode.items import batch_rows, input_tensors

_SINGLE = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
"""Schedules of one stage per rank; interleaved_1f1b runs several (ScheduleInterleaved1F1B)."""


def _tied_parameter(chunk: Any, path: str) -> nn.Parameter | None:
    """The parameter ``<layer name>.<attribute path>`` when ``chunk`` holds that layer."""
    for name, layer in chunk.layers:
        if path.startswith(name + "."):
            return layer.get_parameter(path[len(name) + 1:])
    return None


class Feed:
    """The micro-batches of the step the schedule runs: the first stage's inputs and the last stage's labels, by
    micro-batch number."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.labels: list[Any] = []
        self.rows = 0
        """Samples in the held-out batch being evaluated (0 while training: no micro-batch is short)."""

    def hold(self, micro_batches: list[tuple[Any, Any]], held_out: bool = False) -> torch.Tensor:
        """Keep ``micro_batches`` ((inputs, labels) each) for the schedule; their numbers, which it splits."""
        self.inputs = [mb[0] for mb in micro_batches]
        self.labels = [mb[1] for mb in micro_batches]
        self.rows = batch_rows(self.inputs[0]) if held_out else 0
        return torch.arange(len(micro_batches))

    def first_stage(self, forward: Any, sends: tuple[torch.Tensor, ...]) -> Any:
        """The first stage's forward on micro-batch ``number`` (its inputs as positional tensors, a dict's values in
        key order), its outputs fitted to the shapes ``sends`` it was planned with."""
        def run(number: torch.Tensor) -> Any:
            out = forward(*input_tensors(self.inputs[int(number)]))
            if isinstance(out, tuple):
                return tuple(fit(t, like, self.rows) for t, like in zip(out, sends))
            return fit(out, sends[0], self.rows)

        return run


def fit(t: torch.Tensor, like: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` as the first stage sends it for a micro-batch shaped as ``like``: a short held-out batch's ``rows``
    repeated up to the micro-batch's along the dimension that has them (as torch's DistributedSampler pads: the first
    rows again)."""
    if t.shape == like.shape:
        return t
    differ = [d for d in range(t.dim()) if t.shape[d] != like.shape[d]] if t.dim() == like.dim() else []
    if len(differ) != 1 or not 0 < rows == t.shape[differ[0]] < like.shape[differ[0]]:
        raise RuntimeError(f"the first pipeline stage sends a {tuple(t.shape)} tensor where the stages were shaped "
                           f"for {tuple(like.shape)} (by the first micro-batch): every micro-batch must give the "
                           f"stages the same shapes (a short held-out batch has fewer rows)")
    d = differ[0]
    return t.index_select(d, torch.arange(like.shape[d], device=t.device) % rows)


class PipelineEngine(ChunkEngine):
    drives_schedule = True

    def __init__(self, chunks: list[Any], optimizer: torch.optim.Optimizer, rt: Any) -> None:
        super().__init__(chunks, optimizer, rt.dp_group)
        plan = rt.plan.pipeline
        self.device = rt.device
        self._pp_group = rt.mesh["pp"].get_group()
        self._last_rank = dist.get_global_rank(self._pp_group, plan.ranks - 1)
        n, m, loss_fn = len(plan.stages), plan.micro_batches, rt.loss_fn
        self._first = any(c.stage == 0 for c in chunks)
        self._last = any(c.stage == n - 1 for c in chunks)
        examples = ({c.stage: c.io for c in chunks} if all(c.io for c in chunks) else
                    stage_examples(rt.plan.model, rt.layers_of, plan, rt.example, DTYPES[rt.plan.precision]))
        self._feed = feed = Feed()
        for c in chunks:
            if c.stage == 0:
                c.module.forward = feed.first_stage(c.module.forward, examples[0][1])
        number = torch.zeros(1, dtype=torch.int64, device="meta")  # what the first stage takes: a micro-batch's number
        stages = [PipelineStage(c.call or c.module, c.stage, n, rt.device,
                                input_args=(number,) if c.stage == 0 else examples[c.stage][0],
                                output_args=examples[c.stage][1], group=self._pp_group) for c in chunks]

        def mean_part(output: Any, number: torch.Tensor) -> torch.Tensor:  # each micro-batch's share of the mean
            return loss_fn(output, feed.labels[int(number)]) / m

        if plan.schedule in _SINGLE:
            self._train = _SINGLE[plan.schedule](stages[0], m, loss_fn=mean_part, scale_grads=False)
            self._eval = ScheduleGPipe(stages[0], 1)
        else:
            self._train = ScheduleInterleaved1F1B(stages, m, loss_fn=mean_part, scale_grads=False)
            self._eval = ScheduleInterleaved1F1B(stages, 1)
        self._sum_tied(plan, rt)

    def _sum_tied(self, plan: Any, rt: Any) -> None:
        """Before every optimizer step, sum each shared weight's gradient over its copies: this rank's stages and the
        ranks of other stages with the same dp and tp coordinates. Every rank creates every group (``new_group`` is
        collective), in the plan's order."""
        dims, me = rt.plan.dims, rt.rank
        coords = dims.coords(me)
        mine = []
        for tie in plan.tied:
            holders = sorted({plan.rank_of(s) for s in tie.stages})
            local = [p for c in self.chunks for path in tie.paths if (p := _tied_parameter(c, path)) is not None]
            for dp in range(dims.dp):
                for tp in range(dims.tp):
                    ranks = [dims.rank_of({"pp": r, "dp": dp, "tp": tp}) for r in holders]
                    group = dist.new_group(ranks) if len(ranks) > 1 else None
                    if (dp, tp) == (coords["dp"], coords["tp"]) and local:
                        mine.append((group, list({id(p): p for p in local}.values())))
        if not mine:
            return

        def sum_copies(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
            for group, params in mine:
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                total = sum(local_tensor(p.grad) for p in params)
                if group is not None:  # on the compute device: an offloaded gradient lives on the host (nccl)
                    reduced = total.to(self.device)
                    dist.all_reduce(reduced, group=group)
                    total = reduced.to(total.device)
                for p in params:
                    local_tensor(p.grad).copy_(total)

        self.optimizer.register_step_pre_hook(sum_copies)

    # -- the step ---------------------------------------------------------------------------------------------------
    def train_batch(self, micro_batches: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over ``micro_batches`` ((inputs, labels) each, on the device) by the schedule: the mean
        loss over them, on every stage."""
        numbers = self._feed.hold(micro_batches)
        losses: list[torch.Tensor] = []
        try:
            self._train.step(*((numbers,) if self._first else ()), return_outputs=False,  # only the losses are wanted
                             **({"target": numbers, "losses": losses} if self._last else {}))
        finally:
            self._feed.hold([])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).sum().detach().float() if self._last else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self._last_rank, group=self._pp_group)
        return loss

    def outputs(self, inputs: Any) -> torch.Tensor | None:
        """The model's output for one held-out micro-batch (on the rank of the last stage; None elsewhere); a short
        batch's output has the full micro-batch's rows, the batch's first (``fit``)."""
        numbers = self._feed.hold([(inputs, None)], held_out=True)
        try:
            out = self._eval.eval(*((numbers,) if self._first else ()))
        finally:
            self._feed.hold([])
        return out if self._last else None

    @property
    def is_last(self) -> bool:
        """This rank runs the last stage (it has the model's outputs and scores the held-out batches)."""
        return self._last

    @property
    def last_rank(self) -> int:
        """The global rank of this pipeline's last stage (evaluation results are sent from it)."""
        return self._last_rank

    @property
    def pp_group(self) -> Any:
        return self._pp_group

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a pipeline runs whole steps: call train_batch() (one stage has no forward of the model)")
