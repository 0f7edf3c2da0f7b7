"""deepspeed: DeepSpeed's ZeRO engine (stages 0-3, ZeRO-Offload, bf16/fp16 master weights) for plain data
parallelism, where it is the best tool: its config is emitted as a table, checked by DeepSpeed's own parser in the
tests, and ``deepspeed.initialize`` runs the model with a client torch optimizer.

DeepSpeed owns the backward and its data-parallel groups span every rank, so it composes with neither DTensor tensor
parallel nor torch.distributed.pipelining's schedule (the fsdp part does both). Its checkpoints are its own files.

Config keys are spelled exactly as DeepSpeed names them (deepspeed/runtime/constants.py, zero/config.py). Never
emitted: deprecated ``cpu_offload*``, ``"auto"`` (DeepSpeed does not resolve it; HF Accelerate does),
``sparse_gradients`` (rejected by DeepSpeed >= 0.19), and ``optimizer`` (the worker passes a torch optimizer; naming
one here makes DeepSpeed JIT-build fused_adam on CPU).

Memory (Rajbhandari et al., "ZeRO", 2020, section 5; deepspeed/runtime/zero/stage_1_and_2.py, stage3.py,
bf16_optimizer.py): ZeRO-1 shards optimizer states over dp ranks, ZeRO-2 also gradients, ZeRO-3 also parameters.
From ZeRO-1 up (and with bf16 at stage 0, unsharded) DeepSpeed keeps an fp32 master copy with the states."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launcher.parallel.deepspeed_file import merge, put
from launcher.plan.intents import Intents
from launcher.parallel.part import DEEPSPEED, DataParallelPart
from launcher.plan.memory import state_floats
from launcher.constants import DEEPSPEED_STEP
from launcher.units import WIDTH, Bytes, Term, shard
from launcher.plan.registry import CPU_OPTIMIZERS, DENSE_OPTIMIZERS

_SKIP = object()  # a row that does not apply to this plan emits nothing

Row = tuple[str, Callable[[Intents], Any], Callable[[Intents], str] | None]
_ROWS: list[Row] = [
    # (DeepSpeed's dotted key, its value, the intent that decides it as "our.key=value": a file given with
    # deepspeed.config must agree with those rows, and replaces the others; launcher/parallel/deepspeed_file.py)
    ("train_batch_size", lambda i: i.batch[0], lambda i: f"batch.global_size={i.batch[0]}"),
    ("train_micro_batch_size_per_gpu", lambda i: i.batch[1], lambda i: f"batch.micro_size={i.batch[1]}"),
    ("gradient_accumulation_steps", lambda i: i.batch[2], lambda i: f"batch.grad_accum={i.batch[2]}"),
    ("steps_per_print", lambda i: i.log_every, None),
    ("wall_clock_breakdown", lambda i: False, None),
    # trainer.grad_clip; DeepSpeed clips the global gradient norm at 1.0 when the key is missing, so 0.0 (off) is
    # written: the same run must take the same steps whatever runs it (a resnet pipeline took 1/5 of DDP's step).
    ("gradient_clipping", lambda i: i.grad_clip, lambda i: f"trainer.grad_clip={i.grad_clip}"),
    ("zero_optimization.stage", lambda i: PART.zero_stage(i), lambda i: f"zero.stage={i.zero}"),
    ("zero_optimization.offload_optimizer.device", lambda i: "cpu" if i.offload_optimizer else _SKIP,
     lambda i: "optimizer.target=CPU"),
    ("zero_optimization.offload_optimizer.pin_memory", lambda i: i.pin_memory if i.offload_optimizer else _SKIP,
     lambda i: f"placement.pin_memory={str(i.pin_memory).lower()}"),
    ("zero_optimization.offload_param.device", lambda i: "cpu" if i.offload_params else _SKIP,
     lambda i: "placement.offload_params=true"),
    ("zero_optimization.offload_param.pin_memory", lambda i: i.pin_memory if i.offload_params else _SKIP,
     lambda i: f"placement.pin_memory={str(i.pin_memory).lower()}"),
    # A torch optimizer stepping on DeepSpeed's host partitions (as fast as DeepSpeedCPUAdam, no JIT build:
    # docs/performance.md, P3); DeepSpeed refuses a client optimizer with offload unless told otherwise.
    ("zero_force_ds_cpu_optimizer",
     lambda i: False if i.offload_optimizer and not CPU_OPTIMIZERS[i.cpu_impl].impl else _SKIP,
     lambda i: f"optimizer.cpu_impl={i.cpu_impl}"),
    ("zero_allow_untested_optimizer",
     lambda i: PART.zero_stage(i) > 0 and not DENSE_OPTIMIZERS.get(i.optimizer, DENSE_OPTIMIZERS["sgd"]).zero_tested,
     None),
    ("bf16.enabled", lambda i: i.precision == "bf16", lambda i: f"precision={i.precision}"),
    ("fp16.enabled", lambda i: i.precision == "fp16", lambda i: f"precision={i.precision}"),
]
_OFF = {"zero_optimization.offload_optimizer.device": "none", "zero_optimization.offload_param.device": "none"}
"""Rows left out when their intent is off, and the file value that agrees with that."""


def deepspeed_config(i: Intents) -> dict[str, Any]:
    """The DeepSpeed config dict for these intents (without a deepspeed.config file's keys)."""
    out: dict[str, Any] = {}
    for dotted, row, _ in _ROWS:
        value = row(i)
        if value is not _SKIP:
            put(out, dotted, value)
    return out


def merged_config(i: Intents) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the config this run hands DeepSpeed, problems, notes): the compiled one, with deepspeed.config's file merged
    on top by launcher/parallel/deepspeed_file.py's rule."""
    compiled = deepspeed_config(i)
    if i.ds_file is None:
        return compiled, [], []
    owned = {dotted: (value, words(i)) for dotted, row, words in _ROWS
             if words is not None and (value := row(i)) is not _SKIP}
    off = {dotted: value for dotted, value in _OFF.items() if dotted not in owned}
    return merge(compiled, i.ds_file, owned, off, i.ds_source)


class DeepSpeedZeRO(DataParallelPart):
    name = "deepspeed"
    checkpoint = DEEPSPEED
    client_optimizer = True
    config_file = True
    """Its config is written to the run dir (ds_config.json) and handed to deepspeed.initialize."""

    def cannot(self, i: Intents) -> str:
        if i.layout_words:
            return (f"DeepSpeed's engine runs the backward itself over data-parallel groups of every rank, so it "
                    f"composes with neither tensor parallel nor torch.distributed.pipelining ({', '.join(i.layout_words)})")
        return ""

    def problems(self, i: Intents) -> list[str]:
        return merged_config(i)[1]

    def notes(self, i: Intents) -> list[str]:
        return merged_config(i)[2]

    def zero_stage(self, i: Intents) -> int:
        return max(i.zero, 2) if i.offload_optimizer and i.zero == 0 else i.zero

    def locations(self, i: Intents) -> tuple[str, str]:
        """offload_param and offload_optimizer, each as asked."""
        return "host" if i.offload_params else "device", "host" if i.offload_optimizer else "device"

    def why(self, i: Intents) -> str:
        return f"DeepSpeed ZeRO-{self.zero_stage(i)} for {', '.join(i.needs) or 'zero.stage=0'}"

    def config(self, i: Intents) -> dict[str, Any]:
        return merged_config(i)[0]

    def memory(self, i: Intents, params: int) -> tuple[Bytes, Bytes]:
        zero, dp, width = self.zero_stage(i), i.dims.dp, WIDTH.get(i.precision, 4)
        master = zero >= 1 or width < 4
        where = {"host": Bytes(), "device": Bytes()}
        p_loc = "host" if i.offload_params else "device"
        o_loc = "host" if i.offload_optimizer else "device"
        where[p_loc] = where[p_loc].plus(params=shard(params * width, dp if zero >= 3 else 1))
        where["device"] = where["device"].plus(grads=shard(params * width, dp if zero >= 2 else 1))
        states = params * (state_floats(i.optimizer) + (1 if master else 0)) * 4
        where[o_loc] = where[o_loc].plus(optimizer=shard(states, dp if zero >= 1 else 1))
        if i.offload_optimizer:
            where["host"] = where["host"].plus(grads=shard(params * 4, dp))  # fp32 grad partition for the host step
        return where["host"], where["device"]

    step_overhead_s = DEEPSPEED_STEP.value
    """Seconds its engine adds to a step beyond compute and traffic (launcher/constants.py)."""

    def buffers(self, i: Intents, params: int) -> tuple[Term, ...]:
        """DeepSpeed's buffers, at its defaults or deepspeed.config's values: ZeRO-1/2 reduce gradients through a
        bucket of reduce_bucket_size (5e8) elements (the ipg buffer, allocated for the run; two with overlap_comm and
        contiguous_gradients), ZeRO-0 flattens all-reduce buckets of 5e8 elements during the backward,
        ZeRO-3 prefetches stage3_prefetch_bucket_size (5e7) parameters ahead."""
        zero, width = self.zero_stage(i), WIDTH.get(i.precision, 4)
        config = self.config(i)
        z = config.get("zero_optimization", {})
        given = " (deepspeed.config)" if i.ds_file else ""
        if zero == 3:
            prefetch = int(z.get("stage3_prefetch_bucket_size", z.get("prefetch_bucket_size", 50_000_000)))
            return (Term("zero-3 prefetch", "device", min(params, prefetch) * width * 2, phase="backward",
                         basis="estimate", source=f"stage3_prefetch_bucket_size {prefetch:.3g}{given}: the gathered "
                                                  f"parameters in use and the next ones"),)
        if zero in (1, 2):
            size = int(z.get("reduce_bucket_size", 500_000_000))
            two = z.get("overlap_comm", False) and z.get("contiguous_gradients", True)
            return (Term("zero reduce bucket", "device", min(params, size) * width * (2 if two else 1),
                         basis="estimate", source=f"reduce_bucket_size {size:.3g} elements{given}"
                         f"{', twice: overlap_comm' if two else ''}, capped by the model"),)
        return (Term("all-reduce bucket", "device", min(params, 500_000_000) * width, phase="backward",
                     basis="estimate", source="MEMORY_OPT_ALLREDUCE_SIZE 5e8 elements (DeepSpeed's constant), "
                                              "capped by the model"),)

    def ops(self, i: Intents) -> tuple[str, ...]:
        ops = ("deepspeed_shm_comm",) if i.device_type == "cpu" else ()  # DeepSpeed's CPU accelerator loads it
        if i.offload_optimizer and CPU_OPTIMIZERS[i.cpu_impl].op:
            ops += (CPU_OPTIMIZERS[i.cpu_impl].op,)
        return ops

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        """Nothing before the optimizer exists: deepspeed.initialize takes the model and the optimizer together
        (``DeepSpeedEngine``)."""

    def engine(self, chunks: list[Any], optimizer: Any, rt: Any) -> Any:
        from launcher.parallel.deepspeed_engine import DeepSpeedEngine

        config = dict(rt.config(self.name))
        tested = {c for spec in DENSE_OPTIMIZERS.values() if spec.zero_tested for c in [spec.impl.rsplit(".", 1)[1]]}
        if config["zero_optimization"]["stage"] > 0 and type(optimizer).__name__ not in tested:
            config["zero_allow_untested_optimizer"] = True  # a script's own optimizer, which the plan could not know
        return DeepSpeedEngine(chunks[0].module, optimizer, config=config, backend=rt.plan.backend)


PART = DeepSpeedZeRO()
