"""Build (or load from cache) DeepSpeed's JIT C++ ops: ``python -m launcher.worker.build_ops <op> ...``.

Run by the launcher once before the ranks start (launch/ops.py), with the ranks' PATH and accelerator, so the
minutes a first build takes are paid once per venv and toolchain, in TORCH_EXTENSIONS_DIR, with a message, instead
of silently inside every rank. ``BUILDERS`` is torch-free: the plan checks ``script_ops`` names against it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass


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


def build_op(accelerator, name: str) -> float:
    """Build (or load) one op; seconds taken. SystemExit naming the op when this accelerator has no builder."""
    op = BUILDERS.get(name)
    if op is None:
        raise SystemExit(f"unknown DeepSpeed op {name!r}; known: {', '.join(sorted(BUILDERS))}")
    builder = accelerator.create_op_builder(op.builder)
    if builder is None or type(builder).__name__ == "NotImplementedBuilder":
        raise SystemExit(f"DeepSpeed's {accelerator.device_name()} accelerator has no {op.builder} ({name})")
    t0 = time.monotonic()
    builder.load(verbose=False)
    return time.monotonic() - t0


def main(names: list[str]) -> None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    for name in names:
        print(f"built {name} in {build_op(accelerator, name):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
