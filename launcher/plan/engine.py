"""Which engine drives the dense network: parallel.engine=auto|ddp|deepspeed, decided from what the run needs.

torch DDP is the natural engine of plain data parallelism (ZeRO 0, no offload, fp32): it needs no DeepSpeed import,
no JIT-built op and no config file. DeepSpeed is the engine of ZeRO 1-3, ZeRO-Offload and bf16/fp16 master weights.
"""

from __future__ import annotations

from launcher.plan.parallel import ParallelDims
from launcher.plan.registry import ENGINES, unknown


def plan_engine(requested: str, zero_stage: int, offload: bool, precision: str,
                dims: ParallelDims | None) -> tuple[str, list[str], list[str]]:
    """(engine name, problems, notes)."""
    choices = ("auto", *(n for n in ENGINES if n != "pipeline"))  # a pipeline follows from pipeline_stages
    if requested not in choices:
        return "deepspeed", [unknown("parallel.engine", requested, choices)], []
    if dims is not None and dims.pp > 1:  # rules.check_pipeline refused what a pipeline cannot take
        return "pipeline", [], [f"parallel.pipeline_stages={dims.pp} -> DeepSpeed's PipelineModule, 1F1B schedule"]
    needs = []  # what only DeepSpeed does, in the user's keys
    if zero_stage > 0:
        needs.append(f"zero.stage={zero_stage}")
    if offload:
        needs.append("offload (optimizer.target=CPU or placement.offload_params)")
    if precision != "fp32":
        needs.append(f"precision={precision}")
    problems, notes = [], []
    if requested == "auto":
        engine = "deepspeed" if needs else "ddp"
        why = f"DeepSpeed for {', '.join(needs)}" if needs else "torch DDP: ZeRO 0, no offload, fp32 (DeepSpeed adds nothing)"
        notes.append(f"parallel.engine=auto -> {engine} ({why})")
    else:
        engine = requested
        if engine == "ddp" and needs:
            problems.append(
                f"parallel.engine=ddp runs plain data parallelism in fp32; this run asks for {', '.join(needs)}. "
                f"Set parallel.engine=deepspeed (or auto), or drop those settings."
            )
    if engine == "deepspeed" and dims is not None and dims.dp != dims.world_size:
        problems.append(
            f"parallel.engine=deepspeed with dp({dims.dp}) < world_size {dims.world_size}: DeepSpeed's data-parallel "
            f"groups would span the tp/pp ranks too. Set parallel.engine=ddp (zero.stage=0, fp32) or parallel.tp=1."
        )
    return engine, problems, notes
