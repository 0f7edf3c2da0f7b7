"""fsdp: sharded data parallelism with torch FSDP2 (``fully_shard``), the ZeRO semantics torch brings itself.

- zero.stage >= 1: parameters, gradients and optimizer states are sharded over the dp group (a parameter is
  all-gathered for its layer's forward and backward; gradients are reduce-scattered). FSDP2 always shards the
  parameters too, so ZeRO-1 and ZeRO-2 get at least the saving they ask for; below ZeRO-3 (and in a pipeline, whose
  micro-batches reuse them) a layer keeps its gathered parameters from its forward to its backward
  (``reshard_after_forward=False``), as ZeRO-2 keeps whole parameters.
- zero.stage = 0 (with bf16 or offload): the dp group replicates (HSDP with a shard group of one rank).
- precision=bf16: ``MixedPrecisionPolicy`` computes in bf16 from fp32 master parameters and reduces gradients in
  fp32 (DeepSpeed's bf16 does the same).
- optimizer.target=CPU or placement.offload_params: ``CPUOffloadPolicy`` keeps the fp32 parameters, their gradients
  and the optimizer step on the host; each layer's parameters come to the device for its compute.

Each of the recipe's layers() is an FSDP unit (its all-gather overlaps the previous one's compute), the chunk the
root; a layer whose weight another layer shares (a tied head) stays in the root's unit. It composes with tensor
parallel (2-D: DTensor shards on tp, FSDP on dp) and pipelines (one FSDP root per stage; the stage drives its
post-backward reduce), and checkpoints through DCP."""

from __future__ import annotations

from typing import Any

from launcher.plan.intents import Intents, clip_config
from launcher.parallel.part import DataParallelPart
from launcher.plan.memory import state_floats
from launcher.constants import FSDP_STEP
from launcher.units import WIDTH, Bytes, Term, shard
from launcher.plan.registry import CPU_OPTIMIZERS


class ShardedDataParallel(DataParallelPart):
    """No set_sync: gradients are reduce-scattered after every micro-batch and accumulate sharded (FSDP2's
    default)."""

    name = "fsdp"
    client_optimizer = False

    def cannot(self, i: Intents) -> str:
        if i.precision == "fp16":
            return "fp16 needs a loss scaler, which only the deepspeed part brings here"
        if i.offload_optimizer and CPU_OPTIMIZERS[i.cpu_impl].flat_partitions:
            return ("optimizer.cpu_impl=deepspeed runs DeepSpeedCPUAdam on DeepSpeed's flat fp32 partitions, not on "
                    "FSDP2's DTensor shards")
        if i.client_optimizer:
            return ("fsdp replaces the parameters with sharded DTensors, and a script's runtime.prepare() gets an "
                    "optimizer built over the old ones")
        return ""

    def zero_stage(self, i: Intents) -> int:
        return i.zero

    def locations(self, i: Intents) -> tuple[str, str]:
        """FSDP2's CPUOffloadPolicy keeps the fp32 parameters, their gradients and the optimizer step on the host
        together: optimizer.target=CPU moves the parameters too (each layer's come to the device for its compute)."""
        return ("host", "host") if i.offload else ("device", "device")

    def shard_ways(self, i: Intents) -> int:
        return i.dims.dp if i.zero >= 1 else 1

    def why(self, i: Intents) -> str:
        wants = i.needs or ["zero.stage=0"]
        moved = "; CPUOffloadPolicy keeps the parameters on the host as well" if i.offload_optimizer and \
            not i.offload_params else ""
        return f"torch FSDP2 for {', '.join(wants)}{moved}"

    def config(self, i: Intents) -> dict[str, Any]:
        ways = self.shard_ways(i)
        return {
            "shard": ways,
            "replicate": i.dims.dp // ways,
            "reshard_after_forward": i.zero >= 3 and i.dims.pp == 1,
            "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"} if i.precision == "bf16" else None,
            "offload": {"pin_memory": i.pin_memory} if i.offload else None,
            "units": "each layer of layers() whose weights no other layer shares, then the whole model",
            **clip_config(i),
        }

    def memory(self, i: Intents, params: int) -> tuple[Bytes, Bytes]:
        """At rest: fp32 parameter shards (the master weights), fp32 gradient shards, optimizer state shards. During
        a step (``gathered``, on the device): the whole compute-dtype parameters of every unit when they stay
        gathered from forward to backward (below ZeRO-3, and in pipelines), and in a pipeline the whole gradients a
        stage accumulates until its last micro-batch; at ZeRO-3 one unit's at a time (not counted)."""
        ways = self.shard_ways(i)
        n = shard(params * 4, ways)
        dense = Bytes(params=n, grads=n, optimizer=shard(params * state_floats(i.optimizer) * 4, ways))
        width = WIDTH.get(i.precision, 4)
        whole = params * width if ways > 1 and self.config(i)["reshard_after_forward"] is False else 0
        whole += params * width if ways > 1 and i.dims.pp > 1 else 0
        if i.offload:
            return dense, Bytes(gathered=whole)
        return Bytes(), Bytes(**{**dense.__dict__, "gathered": whole})

    step_overhead_s = FSDP_STEP.value
    """Seconds its per-unit hooks add to a step beyond compute and traffic (launcher/constants.py)."""

    def buffers(self, i: Intents, params: int) -> tuple[Term, ...]:
        """When FSDP2 reshards after the forward (ZeRO-3): the unit it runs and the one it prefetches, whole, and the
        unit's gradients before their reduce-scatter. Unit sizes are not traced: a quarter of the model each."""
        if not self.config(i)["reshard_after_forward"] or self.shard_ways(i) == 1:
            return ()
        unit = -(-params // 4) * WIDTH.get(i.precision, 4)
        return (Term("fsdp unit buffers", "device", 3 * unit, phase="backward", basis="estimate",
                     source="two gathered units (running, prefetched) and one unit's unsharded gradients; a unit "
                            "taken as a quarter of the model"),)

    # -- in a rank ---------------------------------------------------------------------------------------------------
    def apply(self, chunks: list[Any], rt: Any) -> None:
        import torch
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        cfg = rt.config(self.name)
        mesh = rt.mesh["dp_shard"] if cfg["replicate"] == 1 else rt.mesh["dp_replicate", "dp_shard"]
        mp = cfg["mixed_precision"]
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, mp["param_dtype"]),
                                      reduce_dtype=getattr(torch, mp["reduce_dtype"])) if mp else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=cfg["offload"]["pin_memory"]) if cfg["offload"] else OffloadPolicy()
        kwargs = {"mesh": mesh, "mp_policy": policy, "offload_policy": offload,
                  "reshard_after_forward": cfg["reshard_after_forward"]}
        for c in chunks:
            if not cfg["offload"]:  # with offload each unit goes to the device one at a time
                c.module.to(rt.device)  # (fully_shard moves it, shards it, offloads the shards): never the whole model
            for layer in _units(c):
                fully_shard(layer, **kwargs)
            fully_shard(c.module, **kwargs)



def _units(chunk: Any) -> list[Any]:
    """The chunk's layers that can be FSDP units of their own: they hold parameters and share none with another
    layer (a tied weight must live in one unit: the root's)."""
    owners: dict[int, set[str]] = {}
    for name, layer in chunk.layers:
        for p in layer.parameters():
            owners.setdefault(id(p), set()).add(name)
    shared = {n for names in owners.values() if len(names) > 1 for n in names}
    return [layer for name, layer in chunk.layers
            if name not in shared and layer is not chunk.module and any(True for _ in layer.parameters())]


PART = ShardedDataParallel()
