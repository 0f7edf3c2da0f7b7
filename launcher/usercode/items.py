"""Data items and model outputs as third-party code makes them, for a recipe in your folder.

Items: whatever ``DataLoader``'s ``default_collate`` batches. A tuple/list item is ``(input_1, ..., input_k, label)``
(tensors, Python numbers, numpy arrays; torchvision's ``(Tensor, int)``): the model is called with the inputs as
positional arguments. A dict item (HuggingFace style, ``{"input_ids": ..., "labels": ...}``) gives keyword inputs:
``data_inputs`` names them (default: every key but the label) and ``data_label`` the label's key (default ``labels``,
else ``label``).

Outputs: ``model_output`` names what of the model's output the loss (and evaluation) takes: ``auto`` takes a tensor
as it is, a dict or HuggingFace ``ModelOutput``'s ``logits`` (else its first value), a tuple's first element; a key
or attribute path (``logits``, ``out.0``) takes that.
"""

from __future__ import annotations

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


def split_item(collated: Any, data_inputs: Sequence[str] = (), data_label: str = "") -> tuple[Any, Any]:
    """(inputs, label) of a collated batch: a tuple of positional inputs, or a dict of keyword inputs."""
    if isinstance(collated, Mapping):
        key = label_key(collated, data_label)
        if key is None:
            raise KeyError(f"no label key {data_label or ' or '.join(LABEL_KEYS)}")
        names = list(data_inputs) or [k for k in collated if k != key]
        return {k: collated[k] for k in names}, collated[key]
    return tuple(collated[:-1]), collated[-1]


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
