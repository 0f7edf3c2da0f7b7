"""Build (or load from cache) DeepSpeed's JIT C++ ops: ``python -m launcher.worker.build_ops <op> ...``.

Run by the launcher once before the ranks start (launch/ops.py), with the ranks' PATH and accelerator, so the
minutes a first build takes are paid once per venv and toolchain, in TORCH_EXTENSIONS_DIR, with a message, instead
of silently inside every rank. The table of ops (``BUILDERS``) is the plan's (launcher/plan/ds_ops.py), which checks
``script_ops`` names against it."""

from __future__ import annotations

import sys
import time

from launcher.plan.ds_ops import BUILDERS, DsOp

__all__ = ["BUILDERS", "DsOp", "build_op", "main"]


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
