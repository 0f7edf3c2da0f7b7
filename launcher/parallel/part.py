"""What the parts and their registry share: the checkpoint formats a part saves its state in. A leaf: each part's
module (ddp.py, fsdp.py, ...) imports it, and registry.py imports the parts, so a part never imports the registry
back."""

from __future__ import annotations

__all__ = ["DCP", "DEEPSPEED"]

DCP = "dcp"
"""torch.distributed.checkpoint: sharded tensors saved with their global shapes, loadable on another layout."""
DEEPSPEED = "deepspeed"
"""DeepSpeed's own checkpoint files: resumable on the layout they were saved with."""
