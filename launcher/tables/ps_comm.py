"""The parameter-server exchanges, as all-to-alls on the table group's existing process group (gloo or nccl):
no server process and no protocol of our own.

A lookup routes a batch's unique ids to their owners once (``route``: the counts, then the ids) and brings the rows
back (``fetch``: one all-to-all per table); after the backward the same route carries the rows' gradients to the
owners in the reverse direction (``push``: one all-to-all per route, every table looked up with those ids side by
side). Every rank of the group issues the same collectives in the same order, as long as every rank runs the same
lookups in its forward (the same model code); a rank whose batch is empty sends and receives zero rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from launcher.tables.partition import RowPartition


@dataclass
class Route:
    """Where one lookup's unique ids went, for the rows coming back and the gradients going out."""

    inverse: torch.Tensor
    """Each looked-up id's position among the unique ids (the rows come back in unique-id order)."""
    sent: list[int]
    """Unique ids sent to each owner (in rank order: the ids are sorted, so grouped by owner)."""
    received: list[int]
    """Ids each rank asked of this one."""
    asked: torch.Tensor
    """The rows of this rank's block the others asked for (their local indices), by asking rank."""


def _all_to_all(send: torch.Tensor, sent: list[int], received: list[int], group) -> torch.Tensor:
    """``send`` (rows grouped by destination, ``sent[d]`` for rank d) in, the rows each rank sent here out."""
    if len(sent) == 1:
        return send
    out = send.new_empty((sum(received), *send.shape[1:]))
    dist.all_to_all_single(out, send.contiguous(), received, sent, group=group)
    return out


def route(ids: torch.Tensor, part: RowPartition, group, device: torch.device) -> Route:
    """Deduplicate ``ids`` and send each unique id to its owner (collective over ``group``)."""
    unique, inverse = torch.unique(ids.reshape(-1).to(torch.int64), sorted=True, return_inverse=True)
    if len(unique) and (int(unique[0]) < 0 or int(unique[-1]) >= part.rows):  # here, not on the owner
        raise IndexError(f"index out of range in self: ids {int(unique[0])}..{int(unique[-1])} looked up in a table "
                         f"of {part.rows} rows")
    sent = part.counts(unique)
    if part.parts == 1:
        return Route(inverse, sent, sent, unique)
    counts = torch.tensor(sent, dtype=torch.int64, device=device)
    received = _all_to_all(counts, [1] * part.parts, [1] * part.parts, group).tolist()
    asked = _all_to_all(part.local(unique).to(device), sent, received, group)
    return Route(inverse, sent, received, asked.to(torch.int64))


def fetch(block: torch.Tensor, r: Route, group, device: torch.device) -> torch.Tensor:
    """The rows of one table for a routed lookup, in unique-id order: each owner gathers what it was asked."""
    rows = torch.index_select(block, 0, r.asked.to(block.device))
    return _all_to_all(rows.to(device), r.received, r.sent, group)


def push(grads: torch.Tensor, r: Route, group) -> torch.Tensor:
    """Unique-id gradients (in unique-id order) to their owners: the gradients of ``r.asked`` rows, by sender."""
    return _all_to_all(grads, r.sent, r.received, group)


def bytes_sent(r: Route, widths: list[int], rank: int) -> int:
    """Bytes this rank sends for one route over a step: the counts and ids out, each table's rows back, and the
    gradients out (fp32 rows of ``widths`` columns per table; what stays on this rank not counted)."""
    out_ids = sum(n for d, n in enumerate(r.sent) if d != rank)
    out_rows = sum(n for d, n in enumerate(r.received) if d != rank)
    return 8 * (len(r.sent) - 1 + out_ids) + 4 * sum(widths) * (out_rows + out_ids)
