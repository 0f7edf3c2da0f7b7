"""PURE: what each config key does on each kind of job, so that no key is silently ignored.

Job kinds: ``recipe`` (built-in), ``user_recipe`` (a recipe in your folder), and three kinds of ``script=`` job, told
apart by a static scan of the script (launcher/integrations/accelerate.py ``scan_script``): ``prepare`` (it calls
runtime.prepare()), ``accelerate`` (it imports accelerate or transformers' Trainer) and ``plain`` (neither).

A verdict is ``APPLIED``, ``REFUSED`` (a check elsewhere exits 2 naming the key), ``"refuse: why"`` (refused here)
or ``"report: why"`` (the run goes on; the plan and the summary name the key as "not applied: why"). A plain
script's intents are reported, not refused: the scan reads the script only, and a module it imports may call
runtime.prepare() (the summary then drops them: prepare() wrote prepared.json)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

APPLIED, REFUSED = "applied", "refused"
SCRIPT_KINDS = ("prepare", "accelerate", "plain")
JOB_KINDS = ("recipe", "user_recipe", *SCRIPT_KINDS)
INTERNAL = ("deepspeed.given", "deepspeed.source", "smoke_changes")
"""Keys the launcher sets itself (never a user's)."""

_OWN_LOOP = ("refuse: a script builds its own model, data, optimizer and loop, and nothing in it reads this key. "
             "Remove it (pass the value to your script after --), or run your model as a recipe")
_PLAIN = "report: the script neither calls runtime.prepare() nor uses accelerate, so nothing in it reads this intent"
_LAUNCH = {k: APPLIED for k in JOB_KINDS}
_COLD = ("report: a script's ranks always start as `python <script>`, a fresh interpreter each (its own __main__); "
         "launcher.warm_start is for a recipe's ranks on CPU")
_NO_HOST_MODULES = ("refuse: runtime.prepare() and accelerate do not put a dense module on the host (placement.modules "
                    "is built for recipes). Remove placement.modules, or run your model as a recipe")


def _k(recipe: str = APPLIED, prepare: str = APPLIED, accelerate: str = APPLIED, plain: str = _PLAIN,
       user_recipe: str | None = None) -> dict[str, str]:
    return {"recipe": recipe, "user_recipe": recipe if user_recipe is None else user_recipe, "prepare": prepare,
            "accelerate": accelerate, "plain": plain}


_RECIPE_ONLY = _k(prepare=_OWN_LOOP, accelerate=_OWN_LOOP, plain=_OWN_LOOP)
_TABLES = _k(accelerate=REFUSED)  # accelerator.prepare keeps every table in its engine (integrations/accelerate.py)

VERDICTS: dict[str, dict[str, str]] = {
    # launching and records: the launcher itself applies them, whatever runs in the ranks
    "cluster": _LAUNCH, "output": _LAUNCH, "launcher": _LAUNCH, "logger": _LAUNCH, "dry_run": _LAUNCH,
    "launcher.warm_start": _k(**{kind: _COLD for kind in SCRIPT_KINDS}),
    "output.console": _k(recipe=REFUSED, plain=APPLIED),  # check_script_ops: a recipe's ranks report otherwise
    "script": _k(recipe=APPLIED, plain=APPLIED),
    "script_args": _k(recipe=REFUSED, plain=APPLIED),
    "script_ops": _k(recipe=REFUSED, plain=APPLIED),
    # what a recipe is made of: a script brings its own
    **{k: _RECIPE_ONLY for k in ("recipe", "model", "data", "eval_data", "val_data", "loss", "model_output", "data_inputs",
                                 "data_label", "recompute", "eval", "optimizer.name", "optimizer.lr",
                                 "optimizer.momentum", "optimizer.betas", "optimizer.eps", "optimizer.weight_decay",
                                 "batch.global_size", "batch.micro_batches", "trainer", "smoke_profile",
                                 "parallel.dp", "parallel.stages", "parallel.partition", "parallel.schedule",
                                 "parallel.stages_per_rank", "parallel.search_mode", "parallel.data_parallel",
                                 "parallel.sync_batchnorm", "debug")},
    "smoke": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "trainer.resume": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "trainer.resume_from": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "trainer.grad_clip": _k(accelerate="report: accelerate's torch DDP clips only where the script calls "
                                       "accelerator.clip_grad_norm_ (HF Trainer: TrainingArguments.max_grad_norm); "
                                       "DeepSpeed (zero.stage, offload, bf16) gets it as gradient_clipping"),
    "loader": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "deepspeed.config": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "parallel.pipeline_stages": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "parallel.tp": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "parallel.sharding": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "placement.prefetch": _k(prepare=REFUSED, accelerate=REFUSED, plain=REFUSED),
    "placement.modules": _k(prepare=_NO_HOST_MODULES, accelerate=_NO_HOST_MODULES, plain=_NO_HOST_MODULES),
    # intents: runtime.prepare() applies them; accelerate gets them through accelerate launch's environment
    "precision": _k(), "zero": _k(), "optimizer.target": _k(), "optimizer.cpu_impl": _k(accelerate=REFUSED),
    "placement.offload_params": _k(), "placement.pin_memory": _k(), "placement.mode": _k(),
    "placement.reserve": _k(),
    "placement.host_device_mix": _TABLES, "placement.tables": _TABLES, "placement.ps": _TABLES,
    "placement.ps_init": _TABLES, "tables": _TABLES,
    "batch.micro_size": _k(accelerate="report: accelerate takes the micro-batch from the script's DataLoader "
                                      "(DeepSpeed's batch keys are handed over as \"auto\")"),
    "batch.grad_accum": _k(),
}


def verdict(key: str, kind: str) -> str:
    """The verdict of the most specific entry that covers ``key`` (a dotted leaf of the schema)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        entry = VERDICTS.get(".".join(parts[:n]))
        if entry is not None:
            return entry[kind]
    raise KeyError(f"{key}: no verdict in launcher/plan/script_keys.py VERDICTS; add one")


def leaves(node: Any) -> dict[str, Any]:
    """Dotted leaf keys of a config (as a dict) -> value: a section's fields, and the top-level keys that are no
    section (a dict-typed field such as tables or parallel.stages is one leaf: its entries are the user's names)."""
    out = {}
    for k, v in node.items():
        if k in _SECTIONS and isinstance(v, dict):
            out |= {f"{k}.{kk}": vv for kk, vv in v.items()}
        else:
            out[k] = v
    return out


_SECTIONS = ("recipe", "loader", "optimizer", "trainer", "eval", "batch", "parallel", "zero", "deepspeed",
             "placement", "cluster", "output", "launcher", "debug")
"""The schema's sections (dataclasses): their fields are the leaves."""


def changed_keys(cfg: DictConfig) -> dict[str, Any]:
    """The leaves whose value differs from the schema's default (unset recipe sections left out)."""
    from launcher.schema import HeteroConfig

    default = leaves(OmegaConf.to_container(OmegaConf.structured(HeteroConfig), resolve=False))
    default.update(script="", dry_run=False)  # what marks the job, not an intent
    now = leaves(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    return {k: v for k, v in now.items() if k not in INTERNAL and v not in (None, "???")
            and (k not in default or default[k] != v)}


def intents_set(cfg: DictConfig) -> list[str]:
    """'key=value' of each intent set (a key only runtime.prepare() or accelerate reads): what a run that never
    called prepare() did not apply."""
    return [f"{k}={v}" for k, v in changed_keys(cfg).items() if verdict(k, "plain") == _PLAIN]


def refusal(shown: str, said: str) -> str:
    """The problem of ``shown`` (key=value as given) whose verdict ``said`` is "refuse: why"."""
    return f"{shown} with script=: {said[len('refuse: '):]}."


def script_key_verdicts(cfg: DictConfig, kind: str) -> tuple[list[str], list[dict[str, str]]]:
    """(problems, not applied) of a script= job of this kind: each key set to other than its default whose verdict
    refuses it here, or reports it (as {"key", "value", "why"})."""
    problems, reported = [], []
    for key, value in changed_keys(cfg).items():
        v = verdict(key, kind)
        shown = f"{key}={OmegaConf.to_container(value) if isinstance(value, DictConfig) else value}"
        if v.startswith("refuse: "):
            problems.append(refusal(shown, v))
        elif v.startswith("report: "):
            reported.append({"key": key, "value": str(value), "why": v[len("report: "):]})
    return problems, reported


def not_applied_in(plan: dict, built: list[str]) -> list[str]:
    """The plan's keys that nothing in the job read ('key=value: why'); a plain script's intents are left out when
    a rank's runtime.prepare() ran after all (from a module the scan did not read: it wrote prepared.json), and a
    prepare() script's intents are added when none ran."""
    uses = plan.get("uses") or {}
    prepared = uses.get("kind") == "plain" and bool(built)
    out = [f"{n['key']}={n['value']}: {n['why']}" for n in plan.get("not_applied") or ()
           if not (prepared and "runtime.prepare()" in n["why"])]
    if uses.get("kind") == "prepare" and not built:  # the scan saw the call; this run never made it
        out += [f"{i}: the script did not call runtime.prepare() in this run" for i in uses.get("intents", ())]
    return out
