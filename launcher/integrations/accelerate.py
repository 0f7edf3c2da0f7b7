"""accelerate and HF Trainer under ``script=``: which scripts use them, and the plan handed over as ``accelerate
launch`` hands it (PURE: text in, environment out; no accelerate import).

The contract, read from accelerate 1.15's installed source:

- ``accelerate/utils/launch.py`` ``prepare_simple_launcher_cmd_env`` (``accelerate launch --cpu``) sets
  ``ACCELERATE_USE_CPU`` and ``ACCELERATE_MIXED_PRECISION``; ``prepare_deepspeed_cmd_env`` (``--use_deepspeed``) sets
  ``ACCELERATE_USE_DEEPSPEED=true``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ``ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE``,
  ``ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE``, ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``,
  ``ACCELERATE_DEEPSPEED_CONFIG_FILE`` and ``ACCELERATE_MIXED_PRECISION`` next to torchrun's variables.
- ``accelerate/state.py`` ``PartialState._prepare_backend``: with ``LOCAL_RANK`` set and no accelerator, a process
  builds ``DistributedType.MULTI_CPU`` (gloo, one group over all ranks) only when ``cpu`` is true, which
  ``AcceleratorState`` takes from ``ACCELERATE_USE_CPU`` (HF Trainer's ``TrainingArguments._setup_devices`` reads the
  same variable). Without it, no backend is chosen: ``DistributedType.NO``, "1 processes" on every rank.
- ``AcceleratorState.__init__`` selects DeepSpeed only when ``ACCELERATE_USE_DEEPSPEED`` is true **and not cpu**; and
  ``PartialState`` on a host without an accelerator picks no backend unless the script passes one
  (``InitProcessGroupKwargs(backend="gloo")``, HF Trainer's ``TrainingArguments(ddp_backend="gloo")``): each rank then
  counts 1 process while DeepSpeed's group has all of them, and DeepSpeed stops at its batch check. So DeepSpeed
  through accelerate on a CPU host needs that one argument in the script; on a GPU host the environment suffices.
- ``accelerate/utils/dataclasses.py`` ``DeepSpeedPlugin.__post_init__`` reads those variables; a config (a path or
  JSON text: ``HfDeepSpeedConfig``) wins over them, its ``"auto"`` values filled by ``Accelerator._prepare_deepspeed``
  from the script's DataLoader. ``zero_force_ds_cpu_optimizer: false`` keeps the script's own optimizer with offload
  (else accelerate swaps it for DeepSpeedCPUAdam: ``map_pytorch_optim_to_deepspeed``), as ``runtime.prepare()`` does."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from launcher.integrations.trainer_args import TrainerArgs, read_trainer_args, reconcile

ACCELERATE_PACKAGES = ("accelerate", "trl")
"""Top-level packages whose import makes a script an accelerate script (TRL's trainers are HF Trainers)."""
TRAINER_NAMES = ("TrainingArguments", "Seq2SeqTrainingArguments")
"""Names from transformers that mean HF Trainer (and any name ending in Trainer)."""


@dataclass(frozen=True)
class ScriptUse:
    """What a script= job trains with, from a static scan of the script's own imports and calls (not of the modules
    it imports). ``kind``: prepare (calls launcher's runtime.prepare), accelerate (imports accelerate or transformers'
    Trainer: HF Trainer is built on accelerate), plain (neither)."""

    kind: str = "plain"
    why: str = "the script neither calls runtime.prepare() nor imports accelerate or transformers' Trainer"
    trainer: bool = False
    """HF Trainer (transformers' Trainer / TrainingArguments, TRL's trainers)."""
    names_backend: bool = False
    """The script passes accelerate a process-group backend itself (InitProcessGroupKwargs(backend=...),
    TrainingArguments(ddp_backend=...))."""
    trainer_args: TrainerArgs = TrainerArgs()
    """HF Trainer: the TrainingArguments its text shows (launcher.integrations.trainer_args)."""
    nccl_line: int = 0
    """The line of an ``init_process_group("nccl")`` (the backend written as that literal), 0 when there is none."""


def _called_name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def scan_script(source: str, name: str = "the script") -> ScriptUse:
    """The rule: a call of ``runtime.prepare`` (runtime imported from launcher) or of ``prepare`` imported from
    launcher.runtime makes it a prepare script; else an import of accelerate or trl, or of a name ending in
    ``Trainer`` or of TrainingArguments from transformers (or ``transformers.<...>Trainer`` used), an accelerate
    script; else plain. Only the script's own text is read."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as e:
        return ScriptUse(why=f"{name} could not be read as Python ({type(e).__name__}): treated as plain")
    runtime_aliases, prepare_aliases, found = set(), set(), []
    trainer = backend = False
    nccl = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if root in ACCELERATE_PACKAGES:
                    found.append(f"imports {a.name} (line {node.lineno})")
                    trainer = trainer or root == "trl"
                if a.name == "launcher.runtime":
                    runtime_aliases.add(a.asname or "launcher.runtime")
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            names = [a.name for a in node.names]
            if root in ACCELERATE_PACKAGES:
                found.append(f"imports {node.module} (line {node.lineno})")
                trainer = trainer or root == "trl"
            if root == "transformers":
                hf = [n for n in names if n.endswith("Trainer") or n in TRAINER_NAMES]
                if hf:
                    found.append(f"imports {', '.join(hf)} from {node.module} (line {node.lineno})")
                    trainer = True
            if node.module == "launcher":
                runtime_aliases |= {a.asname or a.name for a in node.names if a.name == "runtime"}
            if node.module == "launcher.runtime":
                prepare_aliases |= {a.asname or a.name for a in node.names if a.name == "prepare"}
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "transformers"
              and (node.attr.endswith("Trainer") or node.attr in TRAINER_NAMES)):
            found.append(f"uses transformers.{node.attr} (line {node.lineno})")
            trainer = True
        elif isinstance(node, ast.Call):
            keywords = {k.arg for k in node.keywords}
            backend = backend or "ddp_backend" in keywords or (
                "backend" in keywords and _called_name(node) == "InitProcessGroupKwargs")
            if _called_name(node) == "init_process_group" and _literal_backend(node) == "nccl":
                nccl = nccl or node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "prepare" and ast.unparse(f.value) in runtime_aliases) \
                    or (isinstance(f, ast.Name) and f.id in prepare_aliases):
                return ScriptUse("prepare", f"{name} calls runtime.prepare() (line {node.lineno})", nccl_line=nccl)
    if found:
        return ScriptUse("accelerate", f"{name} {found[0]}", trainer=trainer, names_backend=backend,
                         trainer_args=read_trainer_args(tree, name) if trainer else TrainerArgs(), nccl_line=nccl)
    return ScriptUse(why=f"{name} neither calls runtime.prepare() nor imports accelerate or transformers' Trainer",
                     nccl_line=nccl)


def _literal_backend(call: ast.Call) -> str:
    """The backend an ``init_process_group`` call writes as a string literal (first argument or backend=), else ''."""
    given = [k.value for k in call.keywords if k.arg == "backend"] or call.args[:1]
    return given[0].value if given and isinstance(given[0], ast.Constant) and isinstance(given[0].value, str) else ""


TABLE_KEYS = ("placement.host_device_mix", "placement.tables", "tables", "placement.ps", "placement.ps_init")


def accelerate_handover(runtime: Any, device_type: str, use: ScriptUse, ds_config: dict | None,
                        changed: set[str], script_args: tuple[str, ...] = ()) -> tuple[dict[str, str], list[str],
                                                                                        list[str]]:
    """(the variables each rank gets, problems, notes): the runtime plan (launcher.plan.script.RuntimePlan) as
    ``accelerate launch`` would set it. ``ds_config``: the plan's DeepSpeed config (None: no deepspeed part);
    ``changed``: the keys the run sets (table keys are refused: accelerate keeps every table inside its engine;
    HF Trainer's own values are reconciled); ``script_args``: the script's command line."""
    problems, notes = [], []
    table_keys = [k for k in TABLE_KEYS if k in changed]
    if table_keys:
        problems.append(f"{', '.join(table_keys)} with an accelerate script ({use.why}): accelerator.prepare() wraps "
                        f"the whole model, so every table stays inside its engine; nothing would place them. Remove "
                        f"{', '.join(table_keys)}, or call runtime.prepare(model, optimizer) instead of "
                        f"accelerator.prepare in the script.")
    if runtime.placement.cpu_impl != "torch":
        problems.append(f"optimizer.cpu_impl={runtime.placement.cpu_impl} with an accelerate script: the handed-over "
                        f"DeepSpeed config keeps the script's own optimizer on the host partition "
                        f"(zero_force_ds_cpu_optimizer: false), as runtime.prepare() does. Remove optimizer.cpu_impl "
                        f"(accelerate builds DeepSpeedCPUAdam itself from a DeepSpeed config without that key).")
    precision = "bf16" if runtime.precision == "bf16" else "no"
    env = {"ACCELERATE_MIXED_PRECISION": precision}
    if ds_config is None:  # torch DDP: accelerate's MULTI_GPU, or MULTI_CPU on the CPU (accelerate launch --cpu)
        if device_type == "cpu":
            env["ACCELERATE_USE_CPU"] = "true"
        return env, problems, notes
    if device_type == "cpu" and not use.names_backend:
        fix = ("TrainingArguments(..., ddp_backend=\"gloo\")" if use.trainer else
               "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=\"gloo\")]) (from accelerate.utils)")
        problems.append(
            f"{describe(runtime)} through accelerate on a CPU host: accelerate picks no process-group backend "
            f"without an accelerator (accelerate/state.py PartialState._prepare_backend), so each rank would count "
            f"1 process while DeepSpeed's group has them all (DeepSpeed stops at its batch check; `accelerate launch "
            f"--use_deepspeed` fails the same way here), and with ACCELERATE_USE_CPU it never selects DeepSpeed. "
            f"Pass the backend in the script: {fix}; or drop zero.stage / optimizer.target / placement.offload_params"
            f" / precision=bf16 (then accelerate runs torch DDP over the ranks), or run on a GPU host.")
    config = {k: v for k, v in ds_config.items() if k not in ("steps_per_print",)}
    config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] = "auto"  # from the script's DataLoader
    if use.trainer and device_type == "cpu" and runtime.precision == "bf16":
        return {}, problems + [
            f"precision=bf16 with {describe(runtime)} for an HF Trainer script on a CPU host: HF Trainer takes bf16 "
            f"from TrainingArguments(bf16=True), which transformers refuses without a GPU unless use_cpu=True "
            f"(training_args.py _validate_args: \"Your setup doesn't support bf16/gpu\"), and with use_cpu accelerate "
            f"never selects DeepSpeed. Drop precision=bf16 (ZeRO and the host optimizer run in fp32 here), or run on "
            f"a GPU host."], notes
    if use.trainer:  # its TrainingArguments own precision, accumulation and clipping: agree with them, or refuse
        found, more = reconcile(config, {k for k in changed if k.split(".")[0] in ("precision", "batch", "trainer")},
                                use.trainer_args, script_args)
        if found:
            return {}, problems + found, notes
        notes += more
    # (a clipping key left out is not "no clipping": accelerate's engine then clips at 1.0, measured; 0.0 is kept)
    zero = config.get("zero_optimization", {})
    env |= {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(zero.get("stage", 0)),
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": zero.get("offload_optimizer", {}).get("device", "none"),
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": zero.get("offload_param", {}).get("device", "none"),
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(config.get("gradient_accumulation_steps", 1)),
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": json.dumps(config, sort_keys=True),  # HfDeepSpeedConfig reads JSON text
    }
    return env, problems, notes


def describe(runtime: Any) -> str:
    """'deepspeed ZeRO 2, bf16, optimizer states on the host' for a runtime plan."""
    p = runtime.placement
    where = "host" if p.optimizer_location == "host" else "device"
    params = ", parameters on the host" if p.param_location == "host" else ""
    return f"{runtime.engine} ZeRO {runtime.zero_stage}, {runtime.precision}, optimizer states on the {where}{params}"
