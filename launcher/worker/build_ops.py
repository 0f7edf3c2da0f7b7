"""Build (or load from cache) DeepSpeed's JIT C++ ops: ``python -m launcher.worker.build_ops <op> ...``.

Run by the launcher once before the ranks start, so the minute a first build takes is paid once per machine, in
TORCH_EXTENSIONS_DIR, with a message, instead of silently inside every rank.
"""

import sys

BUILDERS = {"deepspeed_shm_comm": "ShareMemCommBuilder", "cpu_adam": "CPUAdamBuilder"}


def main(names: list[str]) -> None:
    from deepspeed.accelerator import get_accelerator

    for name in names:
        builder = get_accelerator().create_op_builder(BUILDERS[name])
        builder.load(verbose=False)
        print(f"built {name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
