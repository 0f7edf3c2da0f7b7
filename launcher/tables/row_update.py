"""What the row-sparse table optimizers (launcher/tables/sparse_optim.py) share: ``RowUpdate``, an optimizer whose
step runs on its C kernel (launcher/tables/kernels.c) when the kernels take its tensors, else on its torch ops;
``step_all``, the steps of a store's tables in one kernel call per optimizer kind; ``updates_all``, the same steps
computed but not written (placement.prefetch writes them: launcher/tables/prefetch.py), one call per kind as well;
and ``write_rows``, which writes them."""

from __future__ import annotations

import torch

import launcher.tables.kernels as kernels


def fused(rows: torch.Tensor, grads: torch.Tensor, *tables: torch.Tensor | None) -> bool:
    """Whether this update runs on the C kernels (launcher/tables/kernels.py): loaded, and every tensor fp32 / int64,
    contiguous, on the CPU."""
    return kernels.usable(rows, grads, *(t for t in tables if t is not None))


def outputs(n: int, *like: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Per table-shaped tensor, an empty (n, ...) tensor for a kernel's deferred values (None stays None)."""
    return [None if t is None else t.new_empty(n, *t.shape[1:]) for t in like]


def write_rows(rows: torch.Tensor, updates: list[tuple[torch.Tensor, torch.Tensor]],
               index: torch.Tensor | None = None) -> None:
    """Write an optimizer's ``updates`` (each (table-shaped tensor, its new values of ``rows``)) into place: all of
    them, or only the positions ``index`` of rows. The update's arithmetic is done by then, so writing it in two parts
    (launcher/tables/prefetch.py writes the rows the next micro-batches need first) gives the same tables bit for bit.
    """
    if index is not None:
        rows = rows.index_select(0, index)
    for target, values in updates:
        target.index_copy_(0, rows, values if index is None else values.index_select(0, index))


class RowUpdate:
    """What the row-sparse optimizers of sparse_optim.py share: ``step`` and ``updates`` run the optimizer's C kernel
    (kernels.c hl_<KIND>, on ``_job(rows, grads, out)``; out None: in place) when it takes these tensors
    (``fused``), else its torch ops (``_torch_updates``). ``_tensors``: the table and its states, in the order the
    kernel writes them. ``step_all`` steps many tables in one kernel call."""

    KIND = ""

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        raise NotImplementedError

    def _job(self, rows: torch.Tensor, grads: torch.Tensor, out: tuple[torch.Tensor | None, ...]) -> bytes:
        """The kernel's Job of the next step (its step count, where it keeps one, moves once the kernel ran:
        ``_counted``)."""
        raise NotImplementedError

    def _counted(self) -> None:
        """After the kernel ran this step (a call refused for a row out of range changes no table and no count)."""

    def _torch_updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        step_all([(self, rows, grads)])

    def updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each (table-shaped tensor, its new values of ``rows``): the step, not yet written."""
        return updates_all([(self, rows, grads)])[0]


def step_all(steps: list[tuple[object, torch.Tensor, torch.Tensor]]) -> None:
    """Each (optimizer, rows, grads)'s ``step``: the steps the C kernels take in one call per kernel (every table's
    rows spread over the rank's threads as one range), any other one by one."""
    _, rest = _on_kernels(steps, deferred=False)
    for optimizer, rows, grads in (steps[at] for at in rest):
        if isinstance(optimizer, RowUpdate):
            write_rows(rows, optimizer._torch_updates(rows, grads))
        else:
            optimizer.step(rows, grads)


@torch.no_grad()
def updates_all(steps: list[tuple[RowUpdate, torch.Tensor, torch.Tensor]]
                ) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each (optimizer, rows, grads)'s ``updates``, in order: the steps the C kernels take in one call per kernel, their
    new values in fresh (rows, ...) tensors, any other on its torch ops."""
    done, rest = _on_kernels(steps, deferred=True)
    for at in rest:
        optimizer, rows, grads = steps[at]
        done[at] = optimizer._torch_updates(rows, grads)
    return [done[at] for at in range(len(steps))]


def _on_kernels(steps: list[tuple[object, torch.Tensor, torch.Tensor]], deferred: bool
                ) -> tuple[dict[int, list[tuple[torch.Tensor, torch.Tensor]]], list[int]]:
    """The steps the C kernels take, run in one ``kernels.update_many`` call per optimizer KIND, their step counts
    moved after it: in place, or (``deferred``) into fresh (rows, ...) tensors, returned by position as each
    (table-shaped tensor, its new values of rows). Also the positions of the steps left to torch's ops."""
    calls: dict[str, list] = {}
    rest: list[int] = []
    for at, (optimizer, rows, grads) in enumerate(steps):
        tensors = optimizer._tensors() if isinstance(optimizer, RowUpdate) else ()
        if not tensors or not fused(rows, grads, *tensors):
            rest.append(at)
            continue
        new = outputs(len(rows), *tensors) if deferred else []
        calls.setdefault(optimizer.KIND, []).append((at, optimizer, optimizer._job(rows, grads, tuple(new)), rows,
                                                     tensors, new))
    done: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for kind, group in calls.items():
        kernels.update_many(kind, [(job, rows) for _, _, job, rows, _, _ in group])
        for at, optimizer, _, _, tensors, new in group:
            optimizer._counted()
            done[at] = [(t, v) for t, v in zip(tensors, new) if t is not None]
    return done, rest
