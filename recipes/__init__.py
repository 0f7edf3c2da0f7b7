"""Recipes: what to train. Installed as ``launcher.recipes``.

Each recipe is a package that stands alone (recipes never import or inherit from each other) and follows the
contract in ``launcher/contract.py`` (checked here, when it is registered):

- ``__init__.py`` (torch-free, imported when a config is composed): the ``model`` and ``data`` schemas (dataclasses,
  stored in Hydra's ConfigStore so every key is typed) and ``RECIPE``, an object with the contract's hooks: data
  facts, the resolved model spec, table sizes and parameter counts for the plan, recipe-specific checks, ``layers``.
- ``model.py``: the ``nn.Module`` named by the model's ``_target_``; ``forward(*inputs)`` returns what the loss takes.
  Its ``nn.Embedding`` tables are ordinary modules: the launcher swaps them for host or device lookups when the plan
  trains them outside the engine (``launcher/tables/lookup.py``), by the module paths ``tables()`` names.
- ``data.py``: the data source named by the data's ``_target_`` (``contract.DataSource``).

``conf/recipe/<name>.yaml`` picks the schemas and sets the recipe's defaults.
"""

from launcher.contract import register
from launcher.recipes import gpt, mnist_mlp, quickstart, resnet, wide_deep

RECIPES = register(gpt.RECIPE, mnist_mlp.RECIPE, quickstart.RECIPE, resnet.RECIPE, wide_deep.RECIPE)

__all__ = ["RECIPES"]
