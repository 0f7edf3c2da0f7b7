"""Inspection of a model built on the ``meta`` device (no memory, no compute), before planning.

What the planner cannot know from a recipe's torch-free hooks is measured here on the model itself: the parameters
of each of ``layers()`` and the weights layers share (``layer_sizes``), the bytes each layer keeps for the backward,
traced through one forward (``activations``), and a model's tables, dense parameters and which embeddings may move
out of the parallel parts (``model``). Unlike ``launcher/plan`` (pure, torch-free) every module here imports torch;
the launcher's preflight (``launcher/launch/preflight.py``) and the check of a user's recipe
(``launcher/usercode/check.py``) import them only when a run needs these facts, so a dry run of a built-in recipe
stays torch-free.
"""
