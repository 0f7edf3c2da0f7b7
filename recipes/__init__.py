"""Recipes: what to train. Installed as ``launcher.recipes``.

Each recipe is a package that stands alone (recipes never import or inherit from each other):

- ``__init__.py`` (torch-free, imported when a config is composed): ``ModelConfig`` and ``DataConfig`` dataclasses,
  registered in Hydra's ConfigStore so every recipe key is typed; ``tables(model_cfg)`` (embedding tables,
  name -> (rows, dim)) and ``dense_param_count(model_cfg)`` (all other parameters) for placement and memory;
  ``problems(model_cfg, data_cfg, micro_group)`` for recipe-specific checks.
- ``model.py``: the ``nn.Module`` named by ``ModelConfig._target_``. ``forward(*inputs)`` returns what the loss takes.
  A recipe with tables also exposes ``tables`` (ModuleDict of nn.Embedding, named as in ``tables()``),
  ``table_rows(*inputs)`` (name -> row ids), and ``body(*inputs, **looked_up_rows)`` (everything else), so the
  launcher can keep tables out of the DeepSpeed engine and look them up on the host.
- ``data.py``: the data source named by ``DataConfig._target_``, with
  ``train_batches(rank, world_size, micro_size, seed)`` and ``eval_batches(rank, world_size, micro_size, count)``,
  each an iterator of ``(inputs: tuple[Tensor, ...], labels: Tensor)``. Micro-batch ``k`` of rank ``r`` is rows
  ``[r*micro, (r+1)*micro)`` of one "global micro-batch" of ``micro * world_size`` rows, so a 1-process run with
  ``micro * world_size`` rows sees exactly the same samples as ``world_size`` ranks.

``conf/recipe/<name>.yaml`` picks the schemas and sets the recipe's defaults.
"""

from launcher.recipes import quickstart, wide_deep

RECIPES = {"quickstart": quickstart, "wide_deep": wide_deep}

__all__ = ["RECIPES"]
