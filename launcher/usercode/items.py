"""Data items and model outputs as third-party code makes them, for a recipe in your folder.

Batches: what the DataLoader's collate makes of a micro-batch's items (``default_collate``, or ``loader.collate_fn``).
A tuple/list is ``(input_1, ..., input_k, label)`` (tensors, Python numbers, numpy arrays; torchvision's ``(Tensor,
int)``; any structure of tensors, such as TorchRec's ``KeyedJaggedTensor``): the model is called with the inputs as
positional arguments. A dict (HuggingFace style, ``{"input_ids": ..., "labels": ...}``) gives keyword inputs:
``data_inputs`` names them (default: every key but the label) and ``data_label`` the label's key (default ``labels``,
else ``label``). Any other object (a dataclass such as TorchRec's ``Batch``) is read by its attributes the same way:
its fields, or the attributes ``data_inputs`` and ``data_label`` name.

Outputs: ``model_output`` names what of the model's output the loss (and evaluation) takes: ``auto`` takes a tensor
as it is, a dict or HuggingFace ``ModelOutput``'s ``logits`` (else its first value), a tuple's first element; a key
or attribute path (``logits``, ``out.0``) takes that."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

LABEL_KEYS = ("labels", "label")
"""data_label's default: the first of these keys an item has."""


def label_key(item: Mapping[str, Any], data_label: str) -> str | None:
    """The key of a dict item's label: data_label, or the first of LABEL_KEYS it has (None: none)."""
    if data_label:
        return data_label if data_label in item else None
    return next((k for k in LABEL_KEYS if k in item), None)


def attributes(obj: Any, data_inputs: Sequence[str] = (), data_label: str = "") -> dict[str, Any]:
    """A batch object's inputs and label by name: a dataclass's fields, else the attributes data_inputs and
    data_label name (KeyError when it has none of them)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    names = [*data_inputs, *([data_label] if data_label else [])]
    if not names:
        raise KeyError(f"no label key: a {type(obj).__name__} batch needs data_inputs and data_label naming its "
                       f"attributes")
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise KeyError(f"no attribute {', '.join(missing)} in the {type(obj).__name__} batch")
    return {n: getattr(obj, n) for n in names}


def split_item(collated: Any, data_inputs: Sequence[str] = (), data_label: str = "") -> tuple[Any, Any]:
    """(inputs, label) of a collated batch: a tuple of positional inputs, or a dict of keyword inputs (from a dict
    or a batch object's attributes)."""
    if not isinstance(collated, (Mapping, tuple, list)):
        collated = attributes(collated, data_inputs, data_label)
    if isinstance(collated, Mapping):
        key = label_key(collated, data_label)
        if key is None:
            raise KeyError(f"no label key {data_label or ' or '.join(LABEL_KEYS)}")
        names = list(data_inputs) or [k for k in collated if k != key]
        return {k: collated[k] for k in names}, collated[key]
    return tuple(collated[:-1]), collated[-1]


def move_to(batch: Any, device: Any, dtype: torch.dtype | None = None) -> Any:
    """Every tensor of ``batch`` (any nesting of tuples, lists, dicts and pytree-registered types such as TorchRec's
    KeyedJaggedTensor) on ``device``, floating ones in ``dtype``; an object with a ``to`` method that is no pytree
    (a TensorDict, HuggingFace's BatchEncoding) moves by it, as accelerate's send_to_device does. A tensor or a tuple
    of tensors (most batches) takes a direct path: called twice a step, pytree's walk costs a tiny model ~1 % of it."""
    from launcher.tables.transfer import host_to_device

    device = torch.device(device)
    if torch.is_tensor(batch):
        return host_to_device(batch, device, dtype)
    if type(batch) is tuple and all(torch.is_tensor(t) for t in batch):
        return tuple(host_to_device(t, device, dtype) for t in batch)
    from torch.utils._pytree import tree_map

    def one(x: Any) -> Any:
        if torch.is_tensor(x):
            return host_to_device(x, device, dtype)
        if callable(getattr(x, "to", None)) and not isinstance(x, type):
            return x.to(device)
        return x

    return tree_map(one, batch)


def leaves(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch structure, in pytree order."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(batch) if torch.is_tensor(t)]


def all_tensors(inputs: Any) -> bool:
    """Whether every input is a plain tensor (what torch's pipeline tracer and micro-batch split take)."""
    return all(torch.is_tensor(t) for t in input_tensors(inputs))


def batch_rows(inputs: Any) -> int:
    """Samples in a batch of inputs: the first dimension of its first tensor input, or a KeyedJaggedTensor's stride
    (its batch size)."""
    for x in input_tensors(inputs):
        if torch.is_tensor(x):
            return int(x.shape[0]) if x.dim() else 1
        if callable(getattr(x, "stride", None)):
            return int(x.stride())
    return 0


def call(model, inputs: Any):
    """model(*inputs) or model(**inputs)."""
    return model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)


def map_inputs(inputs: Any, fn) -> Any:
    """fn applied to each input tensor, keeping the tuple or dict."""
    if isinstance(inputs, Mapping):
        return {k: fn(v) for k, v in inputs.items()}
    return tuple(fn(t) for t in inputs)


def input_tensors(inputs: Any) -> list:
    return list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)


def auto_choice(out: Any) -> tuple[str, Any]:
    """(what model_output=auto takes of ``out``, as a path: '' for all of it; that value)."""
    if isinstance(out, Mapping) and out:  # a ModelOutput is an OrderedDict of its non-None fields
        key = "logits" if "logits" in out else next(iter(out))
        return key, out[key]
    if isinstance(out, (tuple, list)) and out:
        return "0", out[0]
    return "", out


def select_output(out: Any, path: str = "auto") -> Any:
    """What of ``out`` the loss takes (module docstring). KeyError/IndexError/AttributeError on a path that is not
    there."""
    if path == "auto":
        return auto_choice(out)[1]
    if torch.is_tensor(out):  # already chosen: a traced pipeline's last stage applies model_output itself
        return out
    for part in path.split("."):
        if isinstance(out, Mapping):
            out = out[part]
        elif isinstance(out, (tuple, list)) and part.lstrip("-").isdigit():
            out = out[int(part)]
        else:
            out = getattr(out, part)
    return out


def describe_output(out: Any, path: str) -> str:
    """One plan line: what the model returns and what of it the loss takes."""
    kind = type(out).__name__
    if isinstance(out, Mapping):
        kind += f" ({', '.join(out)})"
    which, picked = auto_choice(out) if path == "auto" else (path, select_output(out, path))
    shape = tuple(picked.shape) if torch.is_tensor(picked) else type(picked).__name__
    if not which:
        return f"model output: a tensor {shape}, to the loss as it is"
    how = "model_output=auto took" if path == "auto" else "model_output took"
    return f"model output: {kind}; {how} `{which}` {shape} for the loss (set model_output=<key or path> for another)"


class OutputLoss:
    """The recipe's loss on what ``model_output`` selects of the model's output (the worker's loss_fn)."""

    def __init__(self, loss_fn, path: str = "auto") -> None:
        self.loss_fn, self.path = loss_fn, path

    def __call__(self, out: Any, labels: Any):
        return self.loss_fn(select_output(out, self.path), labels)
