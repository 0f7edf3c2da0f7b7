"""A model's tables, dense parameters and layers, read off the model built on the ``meta`` device (no memory): the
``ModelFacts`` of a recipe in the user's folder (``launcher/facts/user_code.py``) and of a script's model
(``launcher/runtime/__init__.py``). Which embeddings may move out of the parallel parts is ``launcher.tables.movable``'s call
(the table lookup knows what it reproduces); a weight shared with another module keeps its embedding inside too.
Also what the first items' loss trains (``gradient_facts``) and the state dict a resumed checkpoint must hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from launcher.contract import ModelFacts
from launcher.errors import few, first_words
from launcher.facts.layer_sizes import layer_sizes
from launcher.tables import movable
from launcher.usercode.forward_check import unused_parameters
from launcher.usercode.recipe import units


SHARDED_TORCHREC = "torchrec.distributed"
"""TorchRec's sharded modules (DistributedModelParallel, ShardedEmbeddingBagCollection) live under this package."""


def meta_model(spec: dict[str, Any], source: str) -> tuple[nn.Module | None, list[str]]:
    """(a user recipe's model built from its ``spec`` on the meta device, problems naming ``source``)."""
    if str(spec["_target_"]).startswith(SHARDED_TORCHREC):
        return None, [f"model._target_={spec['_target_']} ({source}): a sharded TorchRec module shards and places its "
                      f"tables itself, in a process group it needs at construction. Give the unsharded model (its "
                      f"EmbeddingBagCollection / EmbeddingCollection inside): hetero-launch places its tables "
                      f"(placement.host_device_mix, placement.ps, placement.tables.<name>). To run "
                      f"DistributedModelParallel yourself, use a script= job."]
    try:
        with torch.device("meta"):
            model = instantiate(spec, _convert_="all")
    except Exception as e:  # noqa: BLE001
        said = str(e.__cause__ or e).lower()
        cuda, meta = "cuda" in said, "meta" in said  # .cuda() in its constructor; a parameter's value read there
        return None, [f"model ({source}): building {spec['_target_']}{' on the meta device' if meta or cuda else ''} "
                      f"failed: "
                      f"{first_words(e.__cause__ or e)}." + (" Build the model where it is made (no .cuda(), "
                      ".to('cuda') or device='cuda' in its constructor): hetero-launch puts each rank's model on its "
                      "device (cluster.device)." if cuda else " The launcher builds the model on the meta device "
                      "(shapes, no memory) to plan it before any rank starts, and a meta tensor has no values: read "
                      "no parameter's value in the constructor (.item(), .numpy(), .tolist(), float(tensor)); keep it "
                      "a tensor, or compute it in forward." if meta else "")]
    if not isinstance(model, nn.Module):
        return None, [f"model._target_={spec['_target_']} ({source}) built a {type(model).__name__}, not a "
                      f"torch.nn.Module."]
    return model, []


def model_facts_on_meta(model: nn.Module) -> ModelFacts:
    """Tables (every nn.Embedding / nn.EmbeddingBag that can train outside the engine), dense parameters, layers
    (``units``: top-level children, a ModuleList opened to its items), of a model built on the meta device."""
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    tables, kept_inside, kept, sparse = {}, [], [], []
    for path, m in model.named_modules():
        if not isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
            continue
        if m.sparse:
            sparse.append(path)
        why = movable(m)
        if not why and len(names_of.get(id(m.weight), [])) > 1:
            others = [n for n in names_of[id(m.weight)] if n != path + '.weight']
            why = f"its weight is shared with {', '.join(others)}"
        if why:
            kept_inside.append(f"{path} ({why})")
            kept.append((path, why))
        else:
            tables[path] = (m.num_embeddings, m.embedding_dim)
    aliases, collections = torchrec_names(model, tables)
    table_ids = {id(model.get_submodule(p).weight) for p in tables}
    dense = sum(p.numel() for p in model.parameters() if id(p) not in table_ids)
    layered = units(model)
    layers = tuple(n for n, _ in layered)
    layer_params, tied = layer_sizes(layered)
    total = dense + sum(r * d for r, d in tables.values())
    lines = [f"model: {type(model).__module__}.{type(model).__name__}, {total:,} "
             f"parameters: tables {', '.join(f'{p} {r:,}×{d}' for p, (r, d) in tables.items()) or 'none'}; "
             f"dense {dense:,}; layers {', '.join(layers) or '-'}"]
    lines += collections
    if kept_inside:
        lines.append(f"model: embeddings that always train inside the engine: {'; '.join(kept_inside)}")
    return ModelFacts(tables=tables, dense_params=dense, layers=layers, layer_params=layer_params, tied=tied,
                      layer_paths={n: n for n in layers}, lines=tuple(lines), kept=tuple(kept),
                      aliases=tuple(aliases.items()), modules=module_params(model, set(tables)),
                      module_io=linear_io(model), sparse_grads=tuple(sparse))


def dtype_problems(model: nn.Module, precision: str, source: str) -> list[str]:
    """A model whose parameters are floats other than float32 under precision=fp32: the ranks hand it the batch's
    floats as float32 (what precision= says), so a float64 layer fails on them in every rank."""
    odd = [(n, p.dtype) for n, p in model.named_parameters() if p.is_floating_point() and p.dtype != torch.float32]
    if precision != "fp32" or not odd:
        return []
    names = few([n for n, _ in odd])
    return [f"model ({source}): its parameters {names} are {odd[0][1]}, and precision=fp32 trains in float32: the "
            f"ranks hand the model every float of the batch as float32, which its {odd[0][1]} layers would not take. "
            f"Build the model in float32 (remove its .double() / .to(dtype) / dtype= arguments): precision= sets "
            f"the training dtype (fp32, or bf16 / fp16 for mixed precision)."]


def module_params(model: nn.Module, tables: set[str]) -> dict[str, int]:
    """Parameters of every module with some, by path, but the tables and the modules that hold one (what
    placement.modules may put on the host: a table has its own placement)."""
    out = {}
    for path, m in model.named_modules():
        if not path or path in tables or any(t.startswith(path + ".") for t in tables):
            continue
        n = sum(p.numel() for p in m.parameters())
        if n:
            out[path] = n
    return out


TORCHREC_COLLECTIONS = {"embedding_bags": "embedding_bag_configs", "embeddings": "embedding_configs"}
"""A TorchRec EmbeddingBagCollection / EmbeddingCollection keeps one nn.EmbeddingBag / nn.Embedding per table in a
ModuleDict under this attribute, keyed by the table's name, and lists its configs with this method."""


def torchrec_names(model: nn.Module, tables: dict[str, tuple[int, int]]) -> tuple[dict[str, str], list[str]]:
    """({TorchRec table name: module path} for each table of an unsharded TorchRec collection whose name is unique in
    the model and no module path, plan lines naming the collections), by TorchRec's module structure (no import)."""
    found: dict[str, list[str]] = {}
    lines = []
    for path, m in model.named_modules():
        for attr, method in TORCHREC_COLLECTIONS.items():
            holder = getattr(m, attr, None)
            if not isinstance(holder, nn.ModuleDict) or not callable(getattr(m, method, None)):
                continue
            prefix = f"{path}.{attr}." if path else f"{attr}."
            names = [n for n in holder if prefix + n in tables]
            for n in names:
                found.setdefault(n, []).append(prefix + n)
            shown = ", ".join(names[:6]) + (f" ... ({len(names)} tables)" if len(names) > 6 else "")
            lines.append(f"model: TorchRec {type(m).__name__} at {path or '(the model)'}: tables {shown or 'none'} "
                         f"(placement.tables.<name> and tables.<name> take these names or the module paths)")
    return {n: paths[0] for n, paths in found.items() if len(paths) == 1 and n not in tables}, lines


def linear_io(model: nn.Module) -> dict[str, tuple[int, int]]:
    """(input, output) floats per sample of each module whose first and last nn.Linear say them (an MLP, a Linear):
    what a host module's forward copies in and out; other modules are left out (not known without a forward)."""
    out = {}
    for path, m in model.named_modules():
        linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
        if path and linears:
            out[path] = (linears[0].in_features, linears[-1].out_features)
    return out


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's state dict, name -> shape; a weight held under several names, under its first only."""
    every = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    first = {n for n, _ in model.named_parameters()}
    return {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()
            if k not in every or k in first}


def gradient_facts(model: nn.Module, facts: ModelFacts, loss_fn: Any, batch: Any, source: str,
               output: str) -> tuple[list[str], ModelFacts]:
    """(problems, facts with the parameters the loss of the first items leaves without a gradient): a model with
    nothing to train is refused here, where data parallelism would refuse it in every rank."""
    count = sum(p.numel() for p in model.parameters())
    if not any(p.requires_grad for p in model.parameters()):
        why = "it has none" if count == 0 else f"all {count:,} are frozen: requires_grad=False"
        return [f"model ({source}): none of its parameters requires a gradient ({why}): there is nothing to train. "
                f"Unfreeze what should train (parameter.requires_grad_(True)) or give a model with parameters."], facts
    unused = unused_parameters(model, loss_fn, batch, output)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if unused is not None and unused and len(unused) == len(trainable):
        return [f"model ({source}): the loss of a batch of its first 2 items reaches none of its trainable "
                f"parameters ({', '.join(trainable[:3])}{' ...' if len(trainable) > 3 else ''}): there is nothing to "
                f"train. The loss must depend on the model's output through its parameters."], facts
    return [], dataclasses.replace(facts, unused=unused or ())
