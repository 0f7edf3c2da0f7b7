"""Evaluation inside the ranks: every rank scores its shard of the held-out set, rank results are gathered."""

from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.plan import LaunchPlan
from launcher.worker.eval_metrics import auc, binary_metrics


def mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return value.item() / dist.get_world_size()


def _gather_cat(t: torch.Tensor) -> torch.Tensor:
    """Concatenate a 1-D CPU tensor from every rank (shards may differ in length)."""
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, t.cpu())
    return torch.cat(parts)


@torch.no_grad()
def evaluate(step_fn, loss_fn, data, plan: LaunchPlan, dp_rank: int, device) -> dict:
    """Mean loss; with eval.metrics=binary also AUC, log loss, accuracy, n, and bayes_auc if the data knows the
    true click probability of each example (``data.true_logits(*inputs)``)."""
    step_fn.engine.eval()
    total, batches = torch.zeros((), device=device), 0
    outputs, labels, truth = [], [], []
    knows_truth = hasattr(data, "true_logits")
    for batch in data.eval_batches(dp_rank, plan.dp, plan.batch.micro_size, plan.eval_batches):
        out, y = step_fn(batch, train=False)
        total += loss_fn(out, y).float()
        batches += 1
        if plan.eval_metrics == "binary":
            outputs.append(out.float().cpu().flatten())
            labels.append(y.float().cpu().flatten())
            if knows_truth:
                truth.append(data.true_logits(*batch[0]).flatten())
    step_fn.engine.train()
    result = {"loss": mean_over_ranks(total / max(batches, 1))}
    if plan.eval_metrics != "binary":
        return result | {"n": batches * plan.batch.micro_size * plan.dp}
    scores, ys = _gather_cat(torch.cat(outputs)), _gather_cat(torch.cat(labels))
    result |= binary_metrics(scores, ys)
    if knows_truth:
        result["bayes_auc"] = auc(_gather_cat(torch.cat(truth)), ys)
    return result
