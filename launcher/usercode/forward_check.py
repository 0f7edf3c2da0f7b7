"""One micro-batch of two items through a user's model and loss before any rank starts, as the ranks will run it.

The model is built on the ``meta`` device (no memory). When the run takes its tables out of the parallel parts,
each table is swapped for the lookup a rank puts there (``launcher.tables.lookup``), reading zero rows from
``ZeroRows`` (the table's width, where the model computes; the ids checked against the table's rows): a call the
lookup cannot take, raw ids a table cannot index, a shape the loss rejects are found here, not in a rank.

Where the forward cannot run on meta (a data-dependent branch such as HuggingFace's mask code, TorchRec's
KeyedJaggedTensor, whose split needs its lengths' values), it runs on the CPU: the model built for real when it has at
most ``CPU_CHECK_PARAMS`` parameters, or, when its tables are swapped and its dense part is that small, built with
its tables on meta (they are never made). A larger model is checked by its first step."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from launcher.errors import first_words
from launcher.module_paths import held_module, set_module
from launcher.tables.hashing import IdHash
from launcher.tables.lookup import lookup_for
from launcher.usercode.items import call, describe_output, move_to, select_output

CPU_CHECK_PARAMS = 50_000_000
"""A model whose forward cannot run on the meta device is checked on the CPU, built for real, when it has at most this
many parameters (counting only its dense part when its tables are swapped and never made); a larger one is checked by
its first step."""


class IdRangeError(IndexError):
    """A batch looked up ids a table does not have (raw feature ids, or ids of another vocabulary)."""

    def __init__(self, name: str, rows: int, low: int, high: int) -> None:
        self.name, self.rows, self.low, self.high = name, rows, low, high
        super().__init__(f"table {name} has {rows:,} rows (ids 0 .. {rows - 1:,}); the batch looked up ids from "
                         f"{low:,} to {high:,}")


class ZeroRows:
    """The table store of a check: zero rows of each table's width on ``device``, after checking the ids (when they
    hold values: not on meta) against the table's rows."""

    def __init__(self, shapes: dict[str, tuple[int, int]], device: torch.device | str,
                 names: dict[str, str] | None = None) -> None:
        self.shapes, self.device, self.names = shapes, torch.device(device), names or {}
        self.tables: dict[str, Any] = {}

    def lookup(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        rows, dim = self.shapes[name]
        if ids.numel() and not ids.is_meta:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= rows:
                raise IdRangeError(self.names.get(name, name), rows, low, high)
        return torch.zeros(*ids.shape, dim, device=self.device)


@dataclass(frozen=True)
class Swap:
    """Which tables a check swaps for lookups: module path -> (rows, dim), and the id hash of those that hash."""

    shapes: dict[str, tuple[int, int]]
    hashing: dict[str, tuple[int, str]]
    """module path -> (buckets, hash function)."""
    names: dict[str, str]
    """module path -> the name its config keys use, where it has another (a TorchRec table's)."""
    planned: bool = True
    """The run takes these tables out of the parts too (False: the check swaps them only to check the ids)."""


def swap_tables(model: nn.Module, swap: Swap, device: torch.device | str) -> None:
    """Put a lookup over ZeroRows where each table of ``swap`` is in ``model`` (in place)."""
    store = ZeroRows(swap.shapes, device, swap.names)
    for name in swap.shapes:
        module = held_module(model, name)
        if module is None:
            continue
        buckets, fn = swap.hashing.get(name, (0, "mix"))
        hashing = IdHash(buckets, fn, module.padding_idx) if buckets else None
        set_module(model, name, lookup_for(store, name, module, hashing))


@contextlib.contextmanager
def tables_on_meta() -> Iterator[None]:
    """While a model is built: every nn.Embedding / nn.EmbeddingBag made without a weight of its own is made on the
    meta device (its initialisation runs there: no memory), everything else where it would be."""
    saved = {cls: cls.__init__ for cls in (nn.Embedding, nn.EmbeddingBag)}

    def on_meta(init):
        def build(module, *args, **kwargs):
            if kwargs.get("_weight") is None:
                kwargs["device"] = "meta"
            init(module, *args, **kwargs)
        return build

    for cls, init in saved.items():
        cls.__init__ = on_meta(init)
    try:
        yield
    finally:
        for cls, init in saved.items():
            cls.__init__ = init


def run_batch(model: nn.Module, inputs: Any, device: str) -> Any:
    """The model's output for ``inputs`` moved to ``device`` (no gradient)."""
    with torch.no_grad():
        return call(model, move_to(inputs, device))


def on_meta_failed(e: BaseException) -> bool:
    """Whether an exception says the forward cannot run on the meta device (not what a rank would hit)."""
    return isinstance(e, NotImplementedError) or "meta" in str(e).lower()


def cpu_model(build, total: int, dense: int, swap: Swap | None, kept: bool) -> nn.Module | None:
    """The model on the CPU for the check, its tables swapped when ``swap``: built for real when it has at most
    CPU_CHECK_PARAMS parameters; with its tables on meta (never made) when only its dense part is that small and
    every table is swapped (``kept``: an embedding stays inside the parts, and would be on meta); else None."""
    if total <= CPU_CHECK_PARAMS:
        model = build()
    elif swap is not None and not kept and dense <= CPU_CHECK_PARAMS:
        with tables_on_meta():
            model = build()
    else:
        return None
    if swap is not None:
        swap_tables(model, swap, "cpu")
    return model


def describe_inputs(inputs: Any) -> tuple[str, str]:
    """(the inputs' shapes, how the model is called) for a message."""
    def shape(v: Any) -> str:
        return str(tuple(v.shape)) if torch.is_tensor(v) else type(v).__name__

    if isinstance(inputs, Mapping):
        return ", ".join(f"{k}={shape(v)}" for k, v in inputs.items()), "model(**inputs)"
    return ", ".join(shape(v) for v in inputs), "model(input_1, ..., input_k)"


def batch_words(items: int) -> str:
    return f"a batch of {items} dataset item{'s' if items != 1 else ''}"


def check_model_and_loss(model: nn.Module, loss_fn: Any, batch: tuple[Any, Any], source: str,
                         model_output: str = "auto", device: str = "meta",
                         items: int = 2) -> tuple[list[str], bool, str]:
    """One micro-batch of ``items`` items (two; one to learn whether a micro-batch of one works), on the model's
    device (meta: no memory): the model takes the inputs, the loss takes what ``model_output`` selects of its output
    and the label. Returns (problems, whether the output has one
    score per label element: what binary metrics need, a line saying what the loss takes); all empty when the model
    cannot run on ``device`` (on_meta_failed)."""
    inputs, label = batch
    try:
        out = run_batch(model, inputs, device)
    except IdRangeError as e:
        first = "its first item alone" if items == 1 else f"a batch of its first {items} items"
        return [f"data ({source}): {e} ({first}). Raw feature ids? Set "
                f"tables.{e.name}.hash={e.rows} to hash them into the table's rows inside its lookup (any int64 id; "
                f"the table then trains outside the parts, with a row-sparse optimizer), or map them to rows "
                f"0 .. {e.rows - 1:,} in the dataset."], False, ""
    except Exception as e:  # noqa: BLE001
        if device == "meta" and on_meta_failed(e):
            return [], False, ""
        shapes, how = describe_inputs(inputs)
        return [f"model ({source}): its forward fails on {batch_words(items)} (inputs {shapes}): "
                f"{first_words(e)}. The model is called as {how} with every item's inputs (all but the label), "
                f"batched."], False, ""
    label = move_to(label, device)
    try:
        picked = select_output(out, model_output)
    except (KeyError, IndexError, AttributeError) as e:
        return [f"model_output={model_output}: the model's output ({type(out).__name__}) has no {e}. Set "
                f"model_output to one of its keys or attributes, or auto."], False, ""
    if model_output != "auto" and torch.is_tensor(out):
        return [f"model_output={model_output}: the model returns a tensor {tuple(out.shape)}, which the loss takes "
                f"as it is; model_output picks a key or attribute of a dict, tuple or ModelOutput. Remove "
                f"model_output (or set it to auto)."], False, ""
    if not torch.is_tensor(picked):
        fields = f" (its keys: {', '.join(out)})" if isinstance(out, Mapping) else ""
        return [f"model_output={model_output}: the loss would get a {type(picked).__name__} of the model's "
                f"{type(out).__name__}{fields}, not a tensor. Set model_output to the key or attribute path of the "
                f"tensor the loss takes (e.g. model_output=logits)."], False, ""
    line = describe_output(out, model_output)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # e.g. MSELoss broadcasting a target of another size
            value = loss_fn(picked, label)
    except Exception as e:  # noqa: BLE001
        if device == "meta" and "meta" in str(e).lower() and "size" not in str(e).lower():
            return [], False, line
        return [f"loss ({source}): {type(loss_fn).__name__} rejects the model's output {_shape_words(picked)} "
                f"against the label {_shape_words(label)}: {first_words(e)}. Make the model's output and the "
                f"dataset's label the shapes and dtypes the loss expects.{_token_hint(loss_fn, picked, label)}"], \
            False, line
    problem = scalar_loss_problem(value, loss_fn, f"loss ({source})", items)
    if problem:
        return [problem], False, line
    return [], torch.is_tensor(label) and picked.numel() == label.numel(), line


def _token_hint(loss_fn: Any, picked: Any, label: Any) -> str:
    """For torch's CrossEntropyLoss on (batch, sequence, vocab) logits, which wants the classes in dimension 1: the
    loss that takes them as they come."""
    if not isinstance(loss_fn, nn.CrossEntropyLoss) or not torch.is_tensor(picked) or picked.dim() < 3:
        return ""
    shift = " shift: true for a causal LM's next-token labels," if torch.is_tensor(label) and \
        label.shape == picked.shape[:-1] else ""
    return (f" For {tuple(picked.shape)} logits with the classes last, use loss={{_target_: "
            f"launcher.losses.TokenCrossEntropy}} (it flattens them;{shift} ignore_index -100).")


def _shape_words(t: Any) -> str:
    if not torch.is_tensor(t):
        return f"a {type(t).__name__}"
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def scalar_loss_problem(value: Any, loss_fn: Any, where: str, items: int = 2) -> str:
    """'' when the loss returned one number (a tensor of one element) for the batch; else the problem: backward()
    and the logged loss need a scalar, not one value per sample (``reduction: none``)."""
    if torch.is_tensor(value) and value.numel() == 1:
        return ""
    got = f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else f"a {type(value).__name__}"
    reduction = getattr(loss_fn, "reduction", None)
    fix = (f"Set loss.reduction=mean (it is {reduction}: one value per sample)" if isinstance(reduction, str)
           and reduction not in ("mean", "sum") else "Make the loss return one number for the batch (e.g. its "
           "values' .mean()), or set its reduction to mean")
    return (f"{where}: {type(loss_fn).__name__} returns {got} on {batch_words(items)}; the loss must return a "
            f"scalar (one number, which backward() and the logged loss take). {fix}.")


def unused_parameters(model: nn.Module, loss_fn: Any, batch: tuple[Any, Any], model_output: str = "auto",
                      device: str = "meta") -> tuple[str, ...] | None:
    """The trainable parameters (by name) that get no gradient from the loss of ``batch`` on the model's device: the
    forward never reaches them (a layer built and not called, a branch not taken for these items); every one when
    the loss reaches none. None when it cannot tell there (the forward, loss or backward cannot run on ``device``:
    what a rank would hit is check_model_and_loss's to say)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    inputs, label = batch
    try:
        value = loss_fn(select_output(call(model, move_to(inputs, device)), model_output), move_to(label, device))
        if not (torch.is_tensor(value) and value.requires_grad):
            return tuple(n for n, _ in params)
        grads = torch.autograd.grad(value.sum(), [p for _, p in params], allow_unused=True)
    except Exception:  # noqa: BLE001
        return None
    return tuple(n for (n, _), g in zip(params, grads) if g is None)

