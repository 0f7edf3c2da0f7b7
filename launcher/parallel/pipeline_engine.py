"""The pipeline part's engine: this rank's stages in torch.distributed.pipelining's ``PipelineStage`` and the planned
schedule, a torch optimizer over their parameters, DCP checkpoints (launcher/parallel/pipeline.py says what and why).

The micro-batches reach the stages as they are, whatever their structure (a KeyedJaggedTensor, a dict): torch's
schedules split the step's arguments with ``tensor_split``, so the first stage is given the micro-batches' numbers
(``arange(M)``, split into one number each) and looks its micro-batch up (``Feed``), as the last stage's loss looks up
its labels. A later stage that uses the batch's inputs (a graph split's ``Chunk.fed``) reads them from the
micro-batch the schedule runs (``Stage`` records which), so an input whose shape changes from one micro-batch to the
next is never sent between stages. torch's stages are shaped by a micro-batch; one whose inputs have other shapes
(the short last batch, a batch of ids padded to its longest list, whose layers then send values of another length)
runs through stages shaped for those inputs, made the first time such a micro-batch comes (``SHAPED`` kept; every rank
of the pipeline holds the same micro-batches, so they all make the same ones without a word between them). A
training step whose micro-batches differ runs each run of equally shaped ones as a schedule of its own (GPipe's order
where it is not the planned count: the same sums in the same order), before the one optimizer step."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from launcher.parallel.engine import ChunkEngine
from launcher.parallel.pipeline_stages import stage_shapes
from launcher.parallel.rank import local_tensor
from launcher.usercode.items import batch_rows, input_tensors

_SINGLE = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
"""Schedules of one stage per rank; interleaved_1f1b runs several (ScheduleInterleaved1F1B)."""
SHAPED = 16
"""Shapes of micro-batch a rank keeps stages and schedules for (each new one is a shape run on meta): the oldest other
than the run's own go first."""


def signature(inputs: Any) -> tuple:
    """What stages are shaped by: the shape of each of a micro-batch's tensor inputs (another input, such as a
    KeyedJaggedTensor, never crosses between stages: its batch size)."""
    return tuple(tuple(x.shape) if torch.is_tensor(x) else batch_rows([x]) for x in input_tensors(inputs))


def _runs(micro_batches: list[tuple[Any, Any]]) -> list[tuple[tuple, list[tuple[Any, Any]]]]:
    """(signature, the micro-batches) of each run of consecutive micro-batches with one signature."""
    out: list[tuple[tuple, list[tuple[Any, Any]]]] = []
    for mb in micro_batches:
        key = signature(mb[0])
        if out and out[-1][0] == key:
            out[-1][1].append(mb)
        else:
            out.append((key, [mb]))
    return out


def _keep(cache: dict, key: Any, value: Any, own: Any) -> Any:
    """cache[key] = value, the oldest entry other than ``own`` dropped past SHAPED."""
    cache[key] = value
    if len(cache) > SHAPED:
        del cache[next(k for k in cache if k != own)]
    return value


def _tied_parameter(chunk: Any, path: str) -> nn.Parameter | None:
    """The parameter ``<layer name>.<attribute path>`` when ``chunk`` holds that layer."""
    for name, layer in chunk.layers:
        if path.startswith(name + "."):
            return layer.get_parameter(path[len(name) + 1:])
    return None


class Feed:
    """The micro-batches of the step the schedule runs: the first stage's inputs, the inputs a later stage reads and
    the last stage's labels, by micro-batch number."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.labels: list[Any] = []
        self.sends: dict[int, tuple] = {}
        """stage -> what it sends, as the stages running now were shaped (meta tensors)."""
        self.current = 0
        """The micro-batch a stage of this rank runs now (``Stage`` sets it before each forward)."""

    def hold(self, micro_batches: list[tuple[Any, Any]], sends: dict[int, tuple] | None = None) -> torch.Tensor:
        """Keep ``micro_batches`` ((inputs, labels) each) for the schedule, whose stages send ``sends``; their
        numbers, which it splits."""
        self.inputs = [mb[0] for mb in micro_batches]
        self.labels = [mb[1] for mb in micro_batches]
        self.sends = sends or {}
        return torch.arange(len(micro_batches))

    def first_stage(self, forward: Any) -> Any:
        """The first stage's forward on micro-batch ``number`` (its inputs as positional tensors, a dict's values in
        key order)."""
        def run(number: torch.Tensor) -> Any:
            return forward(*input_tensors(self.inputs[int(number)]))

        return run

    def later_stage(self, forward: Any, positions: tuple[int, ...]) -> Any:
        """A later stage's forward on what it receives and the batch's inputs at ``positions`` of the micro-batch
        it runs."""
        def run(*received: Any) -> Any:
            given = input_tensors(self.inputs[self.current])
            return forward(*received, *(given[i] for i in positions))

        return run

    def checked(self, forward: Any, stage: int) -> Any:
        """``forward`` of a stage that sends, its outputs checked against the shapes the stages were made for
        (``sends``): a value whose shape depends on the batch's content cannot cross (torch's stages receive into
        buffers of the planned shapes)."""
        def run(*args: Any) -> Any:
            out = forward(*args)
            sent = out if isinstance(out, tuple) else (out,)
            for i, (t, like) in enumerate(zip(sent, self.sends[stage])):
                if torch.is_tensor(t) and tuple(t.shape) != tuple(like.shape):
                    raise RuntimeError(
                        f"pipeline stage {stage} sends a {tuple(t.shape)} tensor (its output {i}) where the stages "
                        f"were shaped for {tuple(like.shape)} by a micro-batch whose inputs have the same shapes: "
                        f"its shape depends on the batch's values, not only on its inputs' shapes (a layer that "
                        f"filters or counts). Begin the next stage elsewhere (parallel.stages) so that the layer that "
                        f"makes it and the one that uses it are on one stage, or set parallel.pipeline_stages=1.")
            return out

        return run


def _sends(examples: dict[int, tuple[tuple, tuple]]) -> dict[int, tuple]:
    """stage -> what it sends, of stage -> (what it receives, what it sends)."""
    return {k: v[1] for k, v in examples.items()}


class Stage(PipelineStage):
    """torch's PipelineStage that tells the ``Feed`` which micro-batch its forward runs."""

    def __init__(self, *args: Any, feed: Feed, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feed = feed

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self.feed.current = fwd_chunk_id
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)


class PipelineEngine(ChunkEngine):
    drives_schedule = True

    def __init__(self, chunks: list[Any], optimizer: torch.optim.Optimizer, rt: Any) -> None:
        super().__init__(chunks, optimizer, rt.dp_group)
        plan = rt.plan.pipeline
        self.device, self._rt = rt.device, rt
        self.pp_group = rt.mesh["pp"].get_group()
        self.last_rank = dist.get_global_rank(self.pp_group, plan.ranks - 1)
        """The global rank of this pipeline's last stage (evaluation results are sent from it)."""
        n, m, loss_fn = len(plan.stages), plan.micro_batches, rt.loss_fn
        self._first = any(c.stage == 0 for c in chunks)
        self.is_last = any(c.stage == n - 1 for c in chunks)
        """This rank runs the last stage (it has the model's outputs and scores the held-out batches)."""
        self._own = signature(rt.example)
        """The inputs' shapes of the run's micro-batch: what the first stages were shaped by."""
        self._feed = feed = Feed()
        for c in chunks:
            if c.stage == 0:
                c.module.forward = feed.first_stage(c.module.forward)
            elif c.fed:
                c.module.forward = feed.later_stage(c.module.forward, c.fed)
            if c.stage < n - 1:
                c.module.forward = feed.checked(c.module.forward, c.stage)
        examples = ({c.stage: c.io for c in chunks} if all(c.io for c in chunks) else
                    stage_shapes(rt, plan, rt.example))
        stages = self._stages(examples)

        def mean_part(output: Any, number: torch.Tensor) -> torch.Tensor:  # each micro-batch's share of the mean
            return loss_fn(output, feed.labels[int(number)]) / m

        self._mean_part = mean_part
        self._trains = {(self._own, m): (self._train_schedule(stages, m), _sends(examples))}
        """(inputs' shapes, micro-batches) -> (the training schedule over stages shaped for them, what they send)."""
        self._shaped = {self._own: (self._eval_schedule(stages), _sends(examples))}
        """Inputs' shapes -> (the forward-only schedule over stages shaped for them, what its stages send)."""
        self._sum_tied(plan, rt)

    def _stages(self, examples: dict[int, tuple[tuple, tuple]]) -> list[Stage]:
        """This rank's stages as torch's PipelineStage, shaped by ``examples`` (stage -> (receives, sends))."""
        n = len(self._rt.plan.pipeline.stages)
        number = torch.zeros(1, dtype=torch.int64, device="meta")  # what the first stage takes: a micro-batch's number
        return [Stage(c.call or c.module, c.stage, n, self.device,
                      input_args=(number,) if c.stage == 0 else examples[c.stage][0],
                      output_args=examples[c.stage][1], group=self.pp_group, feed=self._feed) for c in self.chunks]

    def _train_schedule(self, stages: list[Stage], count: int) -> Any:
        """The planned schedule over ``count`` micro-batches; GPipe's where they are not the planned count (a run of
        equally shaped micro-batches within a step: 1F1B wants at least as many as stages)."""
        plan = self._rt.plan.pipeline
        if plan.schedule in _SINGLE:
            kind = _SINGLE[plan.schedule] if count == plan.micro_batches else ScheduleGPipe
            return kind(stages[0], count, loss_fn=self._mean_part, scale_grads=False)
        if count != plan.micro_batches:
            raise RuntimeError(
                f"a training step's micro-batches have inputs of different shapes ({count} of "
                f"{plan.micro_batches} alike), which parallel.schedule=interleaved_1f1b cannot run apart. Give every "
                f"micro-batch of a step one shape (pad a step's batch to its longest list before it is split), or set "
                f"parallel.schedule=1f1b.")
        return ScheduleInterleaved1F1B(stages, count, loss_fn=self._mean_part, scale_grads=False)

    def _shaped_for(self, cache: dict, key: Any, inputs: Any, schedule_of: Any, own: Any) -> tuple[Any, dict]:
        """cache[key]: (a schedule, what its stages send), made the first time by ``schedule_of`` over stages shaped
        by the shape run of ``inputs`` (``_keep`` bounds the cache)."""
        got = cache.get(key)
        if got is None:
            examples = stage_shapes(self._rt, self._rt.plan.pipeline, inputs)
            got = _keep(cache, key, (schedule_of(self._stages(examples)), _sends(examples)), own)
        return got

    def _trained(self, key: tuple, run: list[tuple[Any, Any]]) -> tuple[Any, dict[int, tuple]]:
        """(schedule, what its stages send) for ``run``: micro-batches whose inputs have the shapes ``key``."""
        return self._shaped_for(self._trains, (key, len(run)), run[0][0],
                                lambda stages: self._train_schedule(stages, len(run)),
                                (self._own, self._rt.plan.pipeline.micro_batches))

    def _eval_schedule(self, stages: list[Stage]) -> Any:
        if self._rt.plan.pipeline.schedule in _SINGLE:
            return ScheduleGPipe(stages[0], 1)
        return ScheduleInterleaved1F1B(stages, 1)

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
        losses: list[torch.Tensor] = []
        for key, run in _runs(micro_batches):
            schedule, sends = self._trained(key, run)
            numbers = self._feed.hold(run, sends)
            got: list[torch.Tensor] = []  # (a schedule's step clears the list it is given)
            try:
                schedule.step(*((numbers,) if self._first else ()), return_outputs=False,  # the losses alone
                              **({"target": numbers, "losses": got} if self.is_last else {}))
            finally:
                self._feed.hold([])
            losses += got
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).sum().detach().float() if self.is_last else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return loss

    def outputs(self, inputs: Any) -> torch.Tensor | None:
        """The model's output for one held-out micro-batch (on the rank of the last stage; None elsewhere), through
        stages shaped for its inputs."""
        schedule, sends = self._shaped_for(self._shaped, signature(inputs), inputs, self._eval_schedule, self._own)
        numbers = self._feed.hold([(inputs, None)], sends)
        try:
            out = schedule.eval(*((numbers,) if self._first else ()))
        finally:
            self._feed.hold([])
        return out if self.is_last else None

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a pipeline runs whole steps: call train_batch() (one stage has no forward of the model)")
