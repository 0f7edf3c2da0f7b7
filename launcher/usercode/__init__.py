"""A recipe in the user's own folder: YAML naming any ``nn.Module``, map-style ``Dataset`` and loss, no recipe code.

``recipe_for`` gives the built-in recipe of a name, or a ``UserRecipe`` for a ``conf/recipe/<name>.yaml`` found on
``--config-dir``. Torch-free at import (the plan imports it); the checks that build the model on the meta device
and read the dataset (``launcher.facts.user_code``) run in the launcher's preflight, before planning."""

from launcher.usercode.recipe import UserRecipe, recipe_for

__all__ = ["UserRecipe", "recipe_for"]
