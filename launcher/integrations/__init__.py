"""Where other libraries' contracts meet ours: accelerate and HF Trainer get the compiled plan through the
environment ``accelerate launch`` sets (accelerate.py); HF Trainer's metrics come back through its own callback
channel (hf_trainer.py). Torch-free and pure at import: the rank-side pieces import their library lazily."""

from launcher.integrations.accelerate import ScriptUse, accelerate_handover, scan_script

__all__ = ["ScriptUse", "accelerate_handover", "scan_script"]
