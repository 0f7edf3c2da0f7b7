"""Evaluation inside the ranks: every data-parallel rank scores its shard of the held-out set; results are reduced
over the dp group."""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist

from launcher.usercode.items import select_output
from launcher.worker.eval_metrics import auc, binary_metrics
from launcher.worker.mesh import DataParallel


def mean_over(value: torch.Tensor, dp: DataParallel) -> float:
    """The mean of a scalar over the dp group."""
    value = value.detach().float().clone()
    if dp.size > 1:
        dist.all_reduce(value, group=dp.group)
    return value.item() / dp.size


def _gather_cat(t: torch.Tensor, dp: DataParallel, device: torch.device) -> torch.Tensor:
    """Concatenate a 1-D fp32 CPU tensor from every dp rank (shards may differ in length) on the CPU: each rank's
    length, then the values padded to the longest in one all_gather on the rank's ``device`` (NCCL's groups take
    device tensors; no pickled copies: a held-out set's scores are the eval's largest memory). One rank: the tensor
    itself."""
    if dp.size == 1:
        return t
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dp.size)]
    dist.all_gather(lengths, torch.tensor([len(t)], device=device), group=dp.group)
    counts = [int(n) for n in lengths]
    padded = (t if len(t) == max(counts) else torch.cat([t, t.new_zeros(max(counts) - len(t))])).to(device)
    parts = [padded.new_empty(max(counts)) for _ in range(dp.size)]
    dist.all_gather(parts, padded, group=dp.group)
    return torch.cat([part[:n].cpu() for part, n in zip(parts, counts)])


class Scored:
    """A rank's scored values (fp32, flat), copied batch by batch into blocks of BLOCK values made as they fill. Kept
    as each batch's own small tensor, they pinned the heap between the blocks the batches' forwards freed: a streamed
    run's rank grew about 250 bytes a held-out row (1 M against 4 M rows: +25 % at its peak; about +11 % now)."""

    BLOCK = 1 << 18

    def __init__(self) -> None:
        self.blocks: list[torch.Tensor] = []
        self.used = 0  # values in the last block

    def add(self, values: torch.Tensor) -> None:
        values = values.detach().flatten()
        while len(values):
            if not self.blocks or self.used == self.BLOCK:
                self.blocks.append(torch.empty(self.BLOCK))
                self.used = 0
            k = min(len(values), self.BLOCK - self.used)
            self.blocks[-1][self.used:self.used + k].copy_(values[:k])
            self.used, values = self.used + k, values[k:]

    def join(self) -> torch.Tensor:
        """One flat tensor of every value (empty when none: a rank that scored no batch still gathers); the blocks
        are let go as they are joined."""
        if not self.blocks:
            return torch.zeros(0)
        self.blocks[-1] = self.blocks[-1][:self.used]
        out = self.blocks[0] if len(self.blocks) == 1 else torch.cat(self.blocks)
        self.blocks, self.used = [], 0
        return out


def _outputs(trainer, batch) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the model's output, the labels) of one held-out micro-batch on the device; a pipeline's output exists on
    its last stage only (None elsewhere). A short last batch goes through a pipeline's stages, which were shaped by
    full micro-batches, with its rows repeated after the first stage (``PipelineEngine.outputs``); the repeated rows'
    outputs are dropped here."""
    if not getattr(trainer.engine, "drives_schedule", False):
        return trainer.forward(batch)
    inputs, labels = trainer._move(batch)
    if len(labels) == 0:  # every stage of this pipeline got the same empty batch: none of them runs it
        return None, labels
    out = trainer.engine.outputs(inputs)
    return (out[:len(labels)] if out is not None else None), labels


def _first(tree, keep: int, rows: int):
    """``tree`` (an output or a batch: any nesting of tensors) with its first ``keep`` rows of every tensor that has
    ``rows`` rows."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t[:keep] if torch.is_tensor(t) and t.dim() > 0 and len(t) == rows else t, tree)


@torch.no_grad()
def evaluate(trainer, split: str = "test") -> dict:
    """Mean loss over the held-out samples of ``split`` (test: the data's eval_batches; val: its val_batches); with
    eval.metrics=binary also AUC, log loss, accuracy, n, and bayes_auc if the data knows the true click probability
    of each example (``data.true_logits(*inputs)``). In a pipeline the last stage scores the batches and sends the
    result to every stage."""
    plan, dp, data = trainer.plan, trainer.dp, trainer.data
    trainer.engine.eval()
    sums = torch.zeros(2, device=trainer.device)  # (loss × samples, samples): batches may differ in size
    outputs, labels, truth = Scored(), Scored(), Scored()
    knows_truth = hasattr(data, "true_logits")
    held_out = data.val_batches if split == "val" else data.eval_batches
    batches = held_out(dp.rank, dp.size, plan.batch.micro_size, plan.eval_batches)
    own = data.held_out_items(split, dp.rank, dp.size) if hasattr(data, "held_out_items") else None
    left = math.inf if own is None else own  # this rank's items not yet scored; the padding after them is not
    for batch in itertools.islice(batches, plan.eval_max_batches or None):
        trainer.alive()
        out, y = _outputs(trainer, batch)
        keep = max(0, min(len(y), left))  # padding runs (the forwards are collective) but is not scored
        left -= len(y)
        if out is None or keep == 0:
            continue
        if keep < len(y):
            out, y, batch = _first(out, keep, len(y)), y[:keep], _first(batch, keep, len(y))
        sums += torch.stack([trainer.loss_fn(out, y).float() * len(y), sums.new_tensor(float(len(y)))])
        if plan.eval_metrics == "binary":
            outputs.add(select_output(out, plan.model_output).float().cpu())
            labels.add(y.float().cpu())
            if knows_truth:
                truth.add(data.true_logits(*batch[0]).float().cpu())
    trainer.engine.train()
    pipelined = getattr(trainer.engine, "drives_schedule", False)
    scores = not pipelined or trainer.engine.is_last  # the same on every rank of a dp group: its reductions match
    result = _reduce(sums, outputs, labels, truth if knows_truth else None, plan.eval_metrics, dp) if scores else None
    if pipelined:
        box = [result]
        dist.broadcast_object_list(box, src=trainer.engine.last_rank, group=trainer.engine.pp_group)
        result = box[0]
    return result


def _reduce(sums, outputs, labels, truth, metrics: str, dp: DataParallel) -> dict:
    """The held-out metrics over the dp group (every rank of it scored its share)."""
    if dp.size > 1:
        dist.all_reduce(sums, group=dp.group)
    result = {"loss": (sums[0] / sums[1].clamp(min=1)).item()}
    if metrics != "binary":
        return result | {"n": int(sums[1].item())}
    device = sums.device
    scores, ys = _gather_cat(outputs.join(), dp, device), _gather_cat(labels.join(), dp, device)
    result |= binary_metrics(scores, ys)
    del scores
    if truth is not None:  # the data knows it on every rank: each rank gathers, also one that scored no batch
        result["bayes_auc"] = auc(_gather_cat(truth.join(), dp, device), ys)
    return result
