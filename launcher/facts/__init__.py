"""Facts: everything the plan reads besides the config, gathered once, before planning, into one ``Facts`` value
(``launcher.contract.Facts``) and a ``HostFacts``. The plan is pure; every read of the world it needs is here:

- ``host.py``: this host (CPUs, memory, devices, the toolchain, what the table kernels can use);
- ``cluster_files.py``: a rank table or hostfile the run is given;
- ``preflight.py``: ``gather_facts`` (the one pass: the registries handed to the plan, the recipe, its data facts,
  the model's layers and activations when the plan needs them) and the checks of a checkpoint to resume;
- ``model.py``, ``layer_sizes.py``, ``activations.py``: a model built on the ``meta`` device (no memory, no
  compute): its tables and dense parameters, each layer's parameters and shared weights, the bytes each layer keeps
  for the backward, traced through one forward. They import torch, and only when a run needs them (a dry run of a
  built-in recipe stays torch-free);
- ``user_code.py``, ``pipeline_cut.py``: a recipe of your folder: your model on the meta device, your Dataset's
  items, one batch through the model and the loss, where a pipeline may cut it.

Nothing here is imported by the plan; launcher/launch/planning.py runs facts -> plan -> launch. The package's
``__init__`` imports nothing, so that reading one fact does not import the others."""
