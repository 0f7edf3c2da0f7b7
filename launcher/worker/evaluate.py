"""Evaluation inside the ranks: every data-parallel rank scores its shard of the held-out set; results are reduced
over the dp group."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from launcher.worker.eval_metrics import auc, binary_metrics
from launcher.worker.mesh import DataParallel


def mean_over(value: torch.Tensor, dp: DataParallel) -> float:
    """The mean of a scalar over the dp group."""
    value = value.detach().float().clone()
    if dp.size > 1:
        dist.all_reduce(value, group=dp.group)
    return value.item() / dp.size


def _gather_cat(t: torch.Tensor, dp: DataParallel) -> torch.Tensor:
    """Concatenate a 1-D CPU tensor from every dp rank (shards may differ in length)."""
    parts = [None] * dp.size
    dist.all_gather_object(parts, t.cpu(), group=dp.group)
    return torch.cat(parts)


@torch.no_grad()
def evaluate(trainer) -> dict:
    """Mean loss over the held-out samples; with eval.metrics=binary also AUC, log loss, accuracy, n, and bayes_auc if the data knows the
    true click probability of each example (``data.true_logits(*inputs)``)."""
    plan, dp, data = trainer.plan, trainer.dp, trainer.data
    trainer.engine.eval()
    sums = torch.zeros(2, device=trainer.device)  # (loss × samples, samples): batches may differ in size
    outputs, labels, truth = [], [], []
    knows_truth = hasattr(data, "true_logits")
    batches = data.eval_batches(dp.rank, dp.size, plan.batch.micro_size, plan.eval_batches)
    pipelined = getattr(trainer.engine, "drives_schedule", False)  # only the loss: the last stage computes it
    for batch in itertools.islice(batches, plan.eval_max_batches or None):
        trainer.alive()
        if pipelined:
            loss, n = trainer.engine.eval_loss(trainer._to_device(batch)), len(batch[1])
            sums += torch.stack([loss.float() * n, sums.new_tensor(float(n))])
            continue
        out, y = trainer.forward(batch)
        sums += torch.stack([trainer.loss_fn(out, y).float() * len(y), sums.new_tensor(float(len(y)))])
        if plan.eval_metrics == "binary":
            outputs.append(out.float().cpu().flatten())
            labels.append(y.float().cpu().flatten())
            if knows_truth:
                truth.append(data.true_logits(*batch[0]).flatten())
    trainer.engine.train()
    if dp.size > 1:
        dist.all_reduce(sums, group=dp.group)
    result = {"loss": (sums[0] / sums[1].clamp(min=1)).item()}
    if plan.eval_metrics != "binary":
        return result | {"n": int(sums[1].item())}
    scores, ys = _gather_cat(torch.cat(outputs), dp), _gather_cat(torch.cat(labels), dp)
    result |= binary_metrics(scores, ys)
    if knows_truth:
        result["bayes_auc"] = auc(_gather_cat(torch.cat(truth), dp), ys)
    return result
