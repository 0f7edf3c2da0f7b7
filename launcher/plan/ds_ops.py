"""DeepSpeed's JIT C++ ops the launcher can prebuild (``script_ops``, and the ops a recipe's parts need): name ->
builder class and the devices that offer it. A pure table: the plan checks names against it, and
launcher/worker/build_ops.py builds them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUILDERS", "DsOp"]


@dataclass(frozen=True)
class DsOp:
    """One of DeepSpeed's JIT ops, as the launcher can prebuild it."""

    builder: str
    """DeepSpeed's op builder class, made by ``get_accelerator().create_op_builder(builder)``."""
    devices: tuple[str, ...]
    """Device types (cluster.device: cpu, cuda) whose DeepSpeed accelerator offers the builder. DeepSpeed's CPU
    accelerator (deepspeed/accelerator/cpu_accelerator.py) has ShareMemComm, CCLComm, FusedAdam, CPUAdam,
    CPUAdagrad, CPULion, AsyncIO and PinMemory; nothing else."""
    needs: str = ""
    """What the build needs beyond a C++ compiler and ninja ('' = nothing)."""


BUILDERS: dict[str, DsOp] = {
    "deepspeed_shm_comm": DsOp("ShareMemCommBuilder", ("cpu",)),
    "deepspeed_ccl_comm": DsOp("CCLCommBuilder", ("cpu",), "oneCCL, with CCL_ROOT set"),
    "cpu_adam": DsOp("CPUAdamBuilder", ("cpu", "cuda")),
    "cpu_adagrad": DsOp("CPUAdagradBuilder", ("cpu", "cuda")),
    "cpu_lion": DsOp("CPULionBuilder", ("cpu", "cuda")),
    "fused_adam": DsOp("FusedAdamBuilder", ("cpu", "cuda")),
    "fused_lamb": DsOp("FusedLambBuilder", ("cuda",)),
    "fused_lion": DsOp("FusedLionBuilder", ("cuda",)),
    "async_io": DsOp("AsyncIOBuilder", ("cpu", "cuda"), "libaio's headers (apt install libaio-dev)"),
    "pin_memory": DsOp("PinMemoryBuilder", ("cpu", "cuda")),
}
"""Op name (its folder in TORCH_EXTENSIONS_DIR, DeepSpeed's builder NAME) -> how to build it."""
