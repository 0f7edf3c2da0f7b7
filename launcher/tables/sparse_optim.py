"""Row-sparse optimizers for embedding tables: only the rows present in a batch are read or written.

- FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013, Algorithm 1), in the
  general learning-rate-power form used by TensorFlow's ApplyFtrl and MindSpore's FTRL:
      n'  = n + g^2
      z  += g - (n'^(-p) - n^(-p)) / lr * w
      w   = (sign(z) * l1 - z) / (n'^(-p) / lr + 2 * l2)   if |z| > l1 else 0
  with p = lr_power (-0.5 gives the paper's sqrt schedule). No well-kept torch library ships it, so it is here.
- Lazy Adam (TensorFlow's and MindSpore's LazyAdam): Adam moments and weights updated only for rows with a
  gradient, one step count per table. torch.optim.SparseAdam is that algorithm (``SparseAdam`` below, the
  reference); ``LazyAdam`` computes the same update with one gather and one scatter of the moments, stored
  interleaved per row, which makes the host step several times faster (bench/placement_bench.py). The tests hold
  it to SparseAdam's results.
- Adagrad and row-wise Adagrad (``SparseAdagrad``, ``RowwiseAdagrad``): torch's Adagrad and FBGEMM's EXACT_ADAGRAD /
  EXACT_ROWWISE_ADAGRAD on the rows of each step (the row-wise one keeps one number per row: DLRM's and TorchRec's
  default for large tables).
- SGD and SGD with momentum (``SparseSGD``): torch.optim.SGD's update on the rows a step has gradients for. Plain
  SGD without weight decay is torch's SGD exactly (a row with no gradient does not move there either); with momentum
  the buffer of a row decays, and the row moves, only on steps it is looked up (lazy momentum: torch's dense buffer
  decays and moves every row every step); weight decay, like lazy Adam's, applies to the rows a step updates.

``dense_settings`` reads a user's torch optimizer for runtime.prepare(): which twin its tables get.

Each optimizer's ``step`` and ``updates`` run on the fused C kernels of launcher/tables/kernels.c when they loaded
(one pass over the rows, prefetched, over the rank's threads; launcher/tables/row_update.py: ``step_all`` steps a
store's tables in one call per kernel), else on the torch ops written here: the same arithmetic
(tests/tables/test_kernels.py holds them to each other).

``state_dict()`` returns references to the live state tensors, as torch's optimizers do: deep-copy it to keep a
snapshot while training goes on.
"""

from __future__ import annotations

import math

import torch

from launcher.plan.placement import DenseSettings
import launcher.tables.hugepages as hugepages
import launcher.tables.kernels as kernels
from launcher.tables.row_update import RowUpdate


class SparseFTRL(RowUpdate):
    """FTRL-Proximal over the rows of one table. ``step(rows, grads)`` takes coalesced (unique) rows."""

    KIND = "ftrl"

    def __init__(
        self,
        weight: torch.Tensor,
        lr: float,
        l1: float = 0.0,
        l2: float = 0.0,
        lr_power: float = -0.5,
        initial_accumulator: float = 0.1,
    ) -> None:
        if lr <= 0 or l1 < 0 or l2 < 0 or lr_power > 0 or initial_accumulator <= 0:
            raise ValueError("FTRL needs lr > 0, l1 >= 0, l2 >= 0, lr_power <= 0, initial_accumulator > 0")
        self.weight = weight
        self.lr, self.l1, self.l2, self.lr_power = lr, l1, l2, lr_power
        self.accum = hugepages.full(weight.shape, initial_accumulator, weight)  # n
        self.linear = hugepages.full(weight.shape, 0.0, weight)  # z

    def state_tensors(self) -> list[torch.Tensor]:
        return [self.accum, self.linear]

    def state_dict(self) -> dict:
        return {"accum": self.accum, "linear": self.linear}

    def load_state_dict(self, state: dict) -> None:
        self.accum.copy_(state["accum"])
        self.linear.copy_(state["linear"])

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.weight, self.accum, self.linear

    def _job(self, rows: torch.Tensor, grads: torch.Tensor, out: tuple[torch.Tensor | None, ...]) -> bytes:
        return kernels.job(rows, grads, self._tensors(), out, (self.lr, self.l1, self.l2, -self.lr_power))

    @torch.no_grad()
    def _torch_updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        w, n, z = self.weight[rows], self.accum[rows], self.linear[rows]
        n_new = n + grads * grads
        p = -self.lr_power
        n_pow, n_new_pow = n.pow(p), n_new.pow(p)
        z += grads - (n_new_pow - n_pow) / self.lr * w
        quadratic = n_new_pow / self.lr + 2 * self.l2
        w_new = (torch.sign(z) * self.l1 - z) / quadratic
        w_new = torch.where(z.abs() > self.l1, w_new, torch.zeros_like(w_new))
        return [(self.weight, w_new), (self.accum, n_new), (self.linear, z)]


class LazyAdam(RowUpdate):
    """Row-fused lazy Adam: ``step(rows, grads)`` with coalesced rows; moments in one (rows, 2, dim) tensor. Weight
    decay applies to the rows a step updates only (rows no batch touched keep their values, as with every lazy
    optimizer): decoupled as AdamW's, or as Adam's L2 term in the gradient."""

    KIND = "lazy_adam"

    def __init__(self, weight: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_decay: bool = True):
        self.weight = weight
        self.lr, self.beta1, self.beta2, self.eps = lr, betas[0], betas[1], eps
        self.weight_decay, self.decoupled_decay = weight_decay, decoupled_decay
        self.moments = hugepages.full((weight.shape[0], 2, weight.shape[1]), 0.0, weight)
        self.steps = 0

    def state_tensors(self) -> list[torch.Tensor]:
        return [self.moments]

    def state_dict(self) -> dict:
        """The moments and the step count (the bias correction depends on it)."""
        return {"moments": self.moments, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.moments.copy_(state["moments"])
        self.steps = int(state["steps"])

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.weight, self.moments

    def _job(self, rows: torch.Tensor, grads: torch.Tensor, out: tuple[torch.Tensor | None, ...]) -> bytes:
        t = self.steps + 1
        step_size = self.lr * math.sqrt(1 - self.beta2**t) / (1 - self.beta1**t)
        return kernels.job(rows, grads, self._tensors(), out,
                           (1 - self.beta1, self.beta2, 1 - self.beta2, self.eps, self.weight_decay,
                            1 - self.lr * self.weight_decay, step_size), int(self.decoupled_decay))

    def _counted(self) -> None:
        self.steps += 1

    @torch.no_grad()
    def _torch_updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.steps += 1
        w = self.weight.index_select(0, rows)
        if self.weight_decay and not self.decoupled_decay:
            grads = grads.add(w, alpha=self.weight_decay)
        state = self.moments.index_select(0, rows)
        exp_avg, exp_avg_sq = state[:, 0], state[:, 1]
        exp_avg.lerp_(grads, 1 - self.beta1)  # m + (g - m)(1 - b1)
        exp_avg_sq.mul_(self.beta2).addcmul_(grads, grads, value=1 - self.beta2)
        # SparseAdam's step: lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
        step_size = self.lr * math.sqrt(1 - self.beta2**self.steps) / (1 - self.beta1**self.steps)
        # rows are unique: gather, add, write back (index_copy_) is the same as index_add_ here and 8-24x faster on
        # a CPU (index_add_ into a large table runs serially: 3.4 ms vs 0.43 ms for 58k rows of a 4 M x 16 table)
        if self.weight_decay and self.decoupled_decay:
            w.mul_(1 - self.lr * self.weight_decay)
        w.add_(exp_avg / exp_avg_sq.sqrt().add_(self.eps), alpha=-step_size)  # the moments stay as written
        return [(self.moments, state), (self.weight, w)]


class SparseSGD(RowUpdate):
    """torch.optim.SGD (momentum, dampening, Nesterov, L2 weight decay) on the rows ``step(rows, grads)`` names, in
    torch's order of operations: with every row stepping every step it is torch's SGD bit for bit. The momentum
    buffer starts as the first step's gradient, as torch's (rows without one start at zero there too)."""

    KIND = "sgd"

    def __init__(self, weight: torch.Tensor, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD needs lr >= 0, momentum >= 0, weight_decay >= 0; got lr={lr}, momentum={momentum}, "
                             f"weight_decay={weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0 (as torch.optim.SGD says)")
        self.weight = weight
        self.lr, self.momentum, self.dampening, self.nesterov = lr, momentum, dampening, nesterov
        self.weight_decay = weight_decay
        self.buffer = hugepages.full(weight.shape, 0.0, weight) if momentum else None
        self.steps = 0

    def state_tensors(self) -> list[torch.Tensor]:
        return [] if self.buffer is None else [self.buffer]

    def state_dict(self) -> dict:
        """The step count and, with momentum, the buffer of every row."""
        return {"steps": self.steps} if self.buffer is None else {"steps": self.steps, "momentum_buffer": self.buffer}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["steps"])
        if self.buffer is not None:
            self.buffer.copy_(state["momentum_buffer"])

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.weight, self.buffer

    def _job(self, rows: torch.Tensor, grads: torch.Tensor, out: tuple[torch.Tensor | None, ...]) -> bytes:
        return kernels.job(rows, grads, self._tensors(), out,
                           (self.lr, self.momentum, 1 - self.dampening, self.weight_decay),
                           int(self.nesterov), int(self.steps == 0))

    def _counted(self) -> None:
        self.steps += 1

    @torch.no_grad()
    def _torch_updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.steps += 1
        w = self.weight.index_select(0, rows)
        out = []
        if self.weight_decay:
            grads = grads.add(w, alpha=self.weight_decay)
        if self.buffer is not None:
            if self.steps == 1:
                buf = grads.clone()
            else:
                buf = self.buffer.index_select(0, rows).mul_(self.momentum).add_(grads, alpha=1 - self.dampening)
            out.append((self.buffer, buf))
            grads = grads.add(buf, alpha=self.momentum) if self.nesterov else buf
        w.add_(grads, alpha=-self.lr)
        return [*out, (self.weight, w)]  # rows are unique (see LazyAdam.step)


class SparseAdagrad(RowUpdate):
    """Adagrad over the rows a step names (torch.optim.Adagrad without lr_decay; FBGEMM's EXACT_ADAGRAD): per value
    ``state += g^2``, ``w -= lr * g / (sqrt(state) + eps)``, L2 weight decay added to g first. ``rowwise=True``:
    one state per row, ``state += mean(g^2)`` over the row (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default):
    the smallest state a table can have, 4 bytes a row. Rows no batch touches keep their state, as torch's dense
    Adagrad does for a zero gradient."""

    KIND = "adagrad"

    def __init__(self, weight: torch.Tensor, lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
                 initial_accumulator: float = 0.0, rowwise: bool = False) -> None:
        if lr <= 0 or eps <= 0 or weight_decay < 0 or initial_accumulator < 0:
            raise ValueError(f"Adagrad needs lr > 0, eps > 0, weight_decay >= 0, initial_accumulator >= 0; got "
                             f"lr={lr}, eps={eps}, weight_decay={weight_decay}, "
                             f"initial_accumulator={initial_accumulator}")
        self.weight, self.lr, self.eps, self.weight_decay, self.rowwise = weight, lr, eps, weight_decay, rowwise
        shape = (weight.shape[0],) if rowwise else weight.shape
        self.state = hugepages.full(shape, float(initial_accumulator), weight)

    def state_tensors(self) -> list[torch.Tensor]:
        return [self.state]

    def state_dict(self) -> dict:
        return {"sum": self.state}

    def load_state_dict(self, state: dict) -> None:
        self.state.copy_(state["sum"])

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.weight, self.state

    def _job(self, rows: torch.Tensor, grads: torch.Tensor, out: tuple[torch.Tensor | None, ...]) -> bytes:
        return kernels.job(rows, grads, self._tensors(), out, (self.lr, self.eps, self.weight_decay),
                           int(self.rowwise))

    @torch.no_grad()
    def _torch_updates(self, rows: torch.Tensor, grads: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        w = self.weight.index_select(0, rows)
        if self.weight_decay:
            grads = grads.add(w, alpha=self.weight_decay)
        state = self.state.index_select(0, rows)
        if self.rowwise:
            state += (grads * grads).sum(1) / grads.shape[1]
            w -= (self.lr / (state.sqrt() + self.eps)).unsqueeze(1) * grads
        else:
            state.addcmul_(grads, grads)
            w.add_(grads / (state.sqrt() + self.eps), alpha=-self.lr)
        return [(self.state, state), (self.weight, w)]


class RowwiseAdagrad(SparseAdagrad):
    """SparseAdagrad with one state per row (tables.<name>.optimizer=rowwise_adagrad)."""

    def __init__(self, weight: torch.Tensor, lr: float, eps: float = 1e-8, weight_decay: float = 0.0,
                 initial_accumulator: float = 0.0) -> None:
        super().__init__(weight, lr, eps, weight_decay, initial_accumulator, rowwise=True)


class SparseAdam:
    """torch.optim.SparseAdam on one table, fed with a sparse gradient built from (rows, grads): the reference."""

    def __init__(self, weight: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.weight = weight
        self._param = torch.nn.Parameter(weight, requires_grad=True)  # shares storage with weight
        self._opt = torch.optim.SparseAdam([self._param], lr=lr, betas=betas, eps=eps)

    @property
    def lr(self) -> float:
        return self._opt.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self._opt.param_groups[0]["lr"] = value

    def state_tensors(self) -> list[torch.Tensor]:
        state = self._opt.state.get(self._param, {})
        return [t for t in (state.get("exp_avg"), state.get("exp_avg_sq")) if t is not None]

    def state_dict(self) -> dict:
        return self._opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._opt.load_state_dict(state)

    @torch.no_grad()
    def step(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        self._param.grad = torch.sparse_coo_tensor(
            rows.unsqueeze(0), grads, self.weight.shape, is_coalesced=True, check_invariants=False
        )
        self._opt.step()
        self._param.grad = None


def dense_settings(optimizer: torch.optim.Optimizer, weight: torch.Tensor) -> DenseSettings:
    """A user's torch optimizer as runtime.prepare()'s table ``weight`` follows it (plan_table_optimizers picks the
    twin): its kind (SGD with or without momentum, Adam, AdamW, else its class) and the settings of the param group
    that held the weight: lr (its initial_lr when a scheduler came first), momentum, dampening, nesterov, betas, eps,
    weight decay."""
    group = next((g for g in optimizer.param_groups if any(p is weight for p in g["params"])), optimizer.defaults)
    cls = type(optimizer).__name__
    if group.get("maximize", False):
        raise ValueError(f"runtime.prepare(): your {cls} maximizes (maximize=True); the tables' row-sparse optimizers "
                         f"minimize. Minimize the negated objective, or leave the tables inside the engine "
                         f"(placement.host_device_mix=0, no placement.tables / tables entries).")
    lr = float(group.get("initial_lr", group.get("lr", 1e-3)))
    decay = float(group.get("weight_decay", 0.0))
    if isinstance(optimizer, torch.optim.SGD):
        m = float(group.get("momentum", 0.0))
        return DenseSettings("momentum" if m else "sgd", lr, momentum=m, dampening=float(group.get("dampening", 0.0)),
                             nesterov=bool(group.get("nesterov", False)), weight_decay=decay)
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
    name = cls
    if isinstance(optimizer, torch.optim.Adam):
        name = f"{cls}(amsgrad=True)" if group.get("amsgrad", False) else "adamw" if decoupled else "adam"
    betas = (float(group["betas"][0]), float(group["betas"][1])) if "betas" in group else None
    return DenseSettings(name, lr, betas=betas, eps=float(group.get("eps", 1e-8)), weight_decay=decay,
                         decoupled_decay=decoupled)
