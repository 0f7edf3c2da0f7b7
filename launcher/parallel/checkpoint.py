"""The checkpoint of the torch-native parts, through ``torch.distributed.checkpoint`` (DCP): each rank writes the
tensors it holds with their global shapes, by the model's own names (``get_model_state_dict`` turns DDP wrappers,
FSDP2 shards and DTensor operators into them; optimizer states are flattened per parameter name, so a pipeline
rank's stages merge), and a load reshards them to the rank's layout: a checkpoint saved on dp 4 loads on dp 2, one
saved with tp 2 loads with tp 1, one saved whole loads into pipeline stages.

A weight held under several names (a head tied to its token embedding) is one parameter to torch's optimizer, whose
state dict names it once; a pipeline stage that holds only the head knows it by the head's name. Its optimizer
state is therefore saved under each of its names."""

from __future__ import annotations

from typing import Any

from torch import nn


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, **kwargs)


def _aliases(module: nn.Module) -> dict[str, list[str]]:
    """The first name of each parameter ``module`` holds under several names -> its other names."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {ns[0]: ns[1:] for ns in names.values() if len(ns) > 1}


def _with_aliases(optim: dict[str, Any], aliases: dict[str, list[str]]) -> dict[str, Any]:
    """Flattened optimizer state ("state.<name>.exp_avg", "param_groups.<name>.lr") with each tied parameter's
    entries under its other names too."""
    out = dict(optim)
    for key, value in optim.items():
        kind, _, rest = key.partition(".")
        for first, others in aliases.items():
            if rest.startswith(first + "."):
                out.update({f"{kind}.{other}{rest[len(first):]}": value for other in others})
    return out


def _states(pairs: list[tuple[nn.Module, Any]], aliases: bool) -> dict[str, dict[str, Any]]:
    """{"model": ..., "optim": ...} of every (module, optimizer) pair, by the model's names (a module with no state
    of its own, a stage of tables alone, and an optimizer with no parameters add nothing)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for module, opt in pairs:
        if module.state_dict():
            model.update(get_model_state_dict(module))
        if opt.param_groups:
            flat = get_optimizer_state_dict(module, opt, options=_options())
            optim.update(_with_aliases(flat, _aliases(module)) if aliases else flat)
    return {"model": model, "optim": optim}


def save_dcp(pairs: list[tuple[nn.Module, Any]], path: str) -> None:
    """Save the (module, optimizer) pairs of this rank (collective over every rank)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(pairs, aliases=True), checkpoint_id=path)


def load_dcp(pairs: list[tuple[nn.Module, Any]], path: str) -> None:
    """Read a DCP checkpoint into the live (module, optimizer) pairs, resharded to this rank's layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = _states(pairs, aliases=False)
    dcp.load(state, checkpoint_id=path)
    for module, opt in pairs:
        if module.state_dict():
            set_model_state_dict(module, state["model"], options=_options(strict=False))
        if opt.param_groups:
            set_optimizer_state_dict(module, opt, state["optim"], options=_options())
