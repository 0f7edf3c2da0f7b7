"""No key is silently ignored: every leaf of the schema has a verdict for every job kind (built-in recipe, user
recipe, a script= that calls runtime.prepare(), an accelerate / HF Trainer script, a plain script), and for the three
script kinds each key set to another valid value is planned exactly as its verdict says: refused with exit 2 naming
it, or named in the plan as "not applied: why", or applied (read: no report, and a refusal only by a check of its
value that names it; an intent changes the plan or the ranks' environment)."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.integrations import scan_script
from launcher.launch.planning import plan_run
from launcher.plan.script_keys import APPLIED, INTERNAL, JOB_KINDS, REFUSED, leaves, verdict
from launcher.schema import HeteroConfig, TableConfig
from launcher.parallel import engine_config

SCRIPTS = {
    "prepare": "from launcher import runtime\nmodel, opt = runtime.prepare(model, opt)\n",
    "accelerate": "from accelerate import Accelerator\nfrom accelerate.utils import InitProcessGroupKwargs\n"
                  "acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend='gloo')])\n",
    "plain": "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
}
VALUES = {  # a valid value other than the default, where the type alone does not give one
    "precision": "bf16", "optimizer.target": "CPU", "optimizer.cpu_impl": "deepspeed", "optimizer.name": "sgd",
    "optimizer.betas": [0.8, 0.9], "placement.pin_memory": "true", "placement.mode": "auto",
    "placement.prefetch": 2, "placement.tables": {"emb": "host"}, "placement.ps_init": "zeros",
    "tables": {"emb": TableConfig(optimizer="sgd")}, "zero.stage": 2, "batch.grad_accum": 2, "batch.micro_size": 4,
    "output.console": "all", "cluster.launch": "mpi", "cluster.backend": "gloo", "cluster.device": "cpu",
    "cluster.nproc_per_node": "2", "logger": "none", "parallel.schedule": "gpipe", "parallel.partition": "uniform",
    "parallel.data_parallel": "fsdp", "parallel.search_mode": "recursive_programming", "eval.metrics": "loss",
    "trainer.resume": "latest", "model_output": "logits", "data_inputs": ["x"], "script_ops": ["cpu_adam"],
    "loader.num_workers": 1, "loader.pin_memory": True, "loader.persistent_workers": False,
    "loader.collate_fn": "torch.utils.data.default_collate", "deepspeed.config": {"gradient_clipping": 1.0},
    "output.log_dir": "elsewhere", "dry_run": True, "recompute": ["all"],
    "smoke_profile": {"model": {"x": 1}}, "parallel.stages": {"blocks.1": 1}, "parallel.sharding": {"x": 1},
    "trainer.early_stop": {"patience": 2}, "placement.modules": {"mlp": "host"}, "val_data": {"_target_": "x.Y"},
}
COMPOSED = ("smoke",)  # refused while the config is composed (launcher/config.py), before any plan


def _probe(key: str, default):
    if key in VALUES:
        return VALUES[key]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1 if default >= 0 else 2
    if isinstance(default, float):
        return default + 0.5
    if isinstance(default, dict):
        return {"x": 1}
    if isinstance(default, list):
        return ["x"]
    return "x"


SCHEMA = {k: v for k, v in leaves(OmegaConf.to_container(OmegaConf.structured(HeteroConfig))).items()
          if k not in INTERNAL}


def test_every_key_has_a_verdict_for_every_job_kind():
    for key in SCHEMA:
        for kind in JOB_KINDS:
            v = verdict(key, kind)
            assert v in (APPLIED, REFUSED) or v.startswith(("refuse: ", "report: ")), (key, kind, v)


def test_the_scan_tells_the_three_script_kinds_apart():
    assert [scan_script(text).kind for text in SCRIPTS.values()] == list(SCRIPTS)
    hf = scan_script("from transformers import Trainer, TrainingArguments\n")
    assert hf.kind == "accelerate" and hf.trainer and not hf.names_backend
    assert scan_script("import transformers\nt = transformers.Trainer(model)\n").trainer
    assert scan_script(SCRIPTS["accelerate"]).names_backend
    assert scan_script("import launcher.runtime\nlauncher.runtime.prepare(m, o)\n").kind == "prepare"
    assert scan_script("from launcher.runtime import prepare as p\np(m, o)\n").kind == "prepare"
    assert scan_script("def (:\n").kind == "plain"


@pytest.fixture(scope="module")
def planned(tmp_path_factory, cpu_host_module):
    """{kind: (base config, base plan)} for a script of each kind, planned in a folder of its own."""
    root = tmp_path_factory.mktemp("keys")
    out = {}
    for kind, text in SCRIPTS.items():
        script = root / f"{kind}.py"
        script.write_text(text)
        cfg = compose_config([f"script={script}"], None)
        out[kind] = (cfg, plan_run(cfg, cpu_host_module)[0].to_dict())
    return out


@pytest.fixture(scope="module")
def cpu_host_module():
    from launcher.facts.host import extensions_dir
    from launcher.plan import HostFacts

    return HostFacts(hostname="ci", cpu_count=2, accelerators=0, extensions_dir=str(extensions_dir()))


INTENTS = ("precision", "zero.stage", "optimizer.target", "placement.offload_params", "batch.grad_accum")


@pytest.mark.parametrize("kind", ["prepare", "accelerate", "plain"])
def test_each_key_on_a_script_is_applied_refused_or_reported_as_its_verdict_says(kind, planned, cpu_host_module,
                                                                               monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    base, base_plan = planned[kind]
    wrong = []
    for key, default in SCHEMA.items():
        value = _probe(key, default)
        v = verdict(key, kind)
        try:
            if key in COMPOSED:
                cfg = compose_config([f"script={base.script}", f"{key}={value}"], None)
            else:
                cfg = copy.deepcopy(base)
                node = OmegaConf.select(cfg, key)  # a section of its own (trainer.early_stop) takes its fields
                section = OmegaConf.is_dict(node) and OmegaConf.get_type(node) not in (dict, None)
                OmegaConf.update(cfg, key, value, merge=section, force_add=True)
            plan = plan_run(cfg, cpu_host_module)[0].to_dict()
        except ConfigError as e:
            said = str(e)
            if (v == APPLIED or v.startswith("report: ")) and key.split(".")[-1] in said:
                continue  # a check of the value it was given (alone or with others): the key is read
            if v in (REFUSED,) or v.startswith("refuse: "):
                if key.split(".")[-1] not in said and key.split(".")[0] not in said:
                    wrong.append(f"{key}: refused without naming it: {said[:200]}")
                continue
            wrong.append(f"{key}={value}: verdict {v[:40]!r} but refused: {said[:300]}")
            continue
        reported = [n["key"] for n in plan["not_applied"]]
        if v.startswith("report: "):
            if key not in reported:
                wrong.append(f"{key}: verdict 'report' but the plan does not name it")
        elif v == APPLIED:
            if key in reported:
                wrong.append(f"{key}: verdict 'applied' but the plan reports it as not applied")
            if key in INTENTS and kind != "plain" and plan == base_plan:
                wrong.append(f"{key}={value}: an applied intent that changes nothing in the plan")
        else:
            wrong.append(f"{key}={value}: verdict {v[:40]!r} but it was planned")
    assert not wrong, "\n".join(wrong)


def test_an_accelerate_script_gets_accelerate_launchs_environment(planned, cpu_host_module, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    base, plain = planned["accelerate"]
    assert plain["ranks"][1]["env"]["ACCELERATE_USE_CPU"] == "true"  # MULTI_CPU over both ranks, as --cpu sets it
    cfg = copy.deepcopy(base)
    for key, value in (("precision", "bf16"), ("zero.stage", 2), ("optimizer.target", "CPU")):
        OmegaConf.update(cfg, key, value)
    plan = plan_run(cfg, cpu_host_module)[0]
    env = plan.ranks[0].env
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and "ACCELERATE_USE_CPU" not in env
    assert (env["ACCELERATE_DEEPSPEED_ZERO_STAGE"], env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"],
            env["ACCELERATE_MIXED_PRECISION"]) == ("2", "cpu", "bf16")
    import json

    handed = json.loads(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"])  # HfDeepSpeedConfig reads JSON text
    assert handed["train_batch_size"] == handed["train_micro_batch_size_per_gpu"] == "auto"
    assert handed["zero_force_ds_cpu_optimizer"] is False and handed["bf16"] == {"enabled": True}
    assert {k: v for k, v in handed.items() if "batch" not in k} == \
        {k: v for k, v in engine_config(plan).items() if "batch" not in k and k != "steps_per_print"}
    assert handed["gradient_clipping"] == 0.0  # left out, accelerate's engine would clip at 1.0


def test_deepspeed_through_accelerate_on_a_cpu_host_needs_the_scripts_backend(tmp_path, cpu_host_module, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for text, fix in (("from accelerate import Accelerator\n", "InitProcessGroupKwargs(backend=\"gloo\")"),
                      ("from transformers import Trainer\n", "ddp_backend=\"gloo\"")):
        script = tmp_path / "s.py"
        script.write_text(text)
        with pytest.raises(ConfigError, match="PartialState._prepare_backend") as e:
            plan_run(compose_config([f"script={script}", "zero.stage=2"], None), cpu_host_module)
        assert fix in str(e.value)


def test_the_script_only_keys_are_refused_on_a_recipe():
    from launcher.plan.script import check_script_ops

    for key, value in (("script_args", "[--lr,0.1]"), ("script_ops", "[cpu_adam]"), ("output.console", "all")):
        assert verdict(key, "recipe") == verdict(key, "user_recipe") == REFUSED
        problems = check_script_ops(compose_config(["recipe=quickstart", f"{key}={value}"], None))
        assert len(problems) == 1 and problems[0].startswith(f"{key}=") and "without script=" in problems[0]


def test_the_summary_names_intents_that_no_runtime_prepare_applied(planned, cpu_host_module, monkeypatch, tmp_path):
    """A plain script's intents are dropped from the summary when prepare() ran after all (from a module the scan did
    not read: prepared.json); a prepare() script's are added when this run never called it."""
    from launcher.plan.script_keys import not_applied_in as _not_applied

    monkeypatch.chdir(tmp_path)
    plans = {}
    for kind in ("prepare", "plain"):
        cfg = copy.deepcopy(planned[kind][0])
        OmegaConf.update(cfg, "zero.stage", 2)
        plans[kind] = plan_run(cfg, cpu_host_module)[0].to_dict()
        assert plans[kind]["uses"]["intents"] == ["zero.stage=2"]
    assert _not_applied(plans["prepare"], built=["deepspeed"]) == []
    assert _not_applied(plans["prepare"], built=[]) == ["zero.stage=2: the script did not call runtime.prepare() in "
                                                        "this run"]
    assert _not_applied(plans["plain"], built=["deepspeed"]) == []
    assert _not_applied(plans["plain"], built=[]) == ["zero.stage=2: the script neither calls runtime.prepare() nor "
                                                      "uses accelerate, so nothing in it reads this intent"]


@pytest.mark.parametrize("call", ['dist.init_process_group("nccl")', "dist.init_process_group(backend='nccl')",
                                  'torch.distributed.init_process_group("nccl", rank=r, world_size=w)'])
def test_a_script_that_names_nccl_is_refused_on_a_host_without_a_gpu(tmp_path, cpu_host_module, call):
    """Every rank failed with "Distributed package doesn't have NCCL built in": a literal backend the scan reads.
    On a host with a GPU, and with the backend left out or written "gloo", it plans."""
    import dataclasses

    script = tmp_path / "train.py"
    script.write_text(f"import torch\nimport torch.distributed as dist\nr, w = 0, 1\n{call}\n")
    cfg = compose_config([f"script={script}"], None)
    with pytest.raises(ConfigError, match=r"line 4 calls init_process_group\(\"nccl\"\) on a host without a GPU: every "
                                          r"rank would fail .*Leave the backend out"):
        plan_run(cfg, cpu_host_module)
    plan_run(cfg, dataclasses.replace(cpu_host_module, accelerators=1, device_memory=1 << 34))
    for fine in ("dist.init_process_group()", 'dist.init_process_group("gloo")', "dist.init_process_group(b)"):
        script.write_text(f"import torch.distributed as dist\nb = 'nccl'\n{fine}\n")
        plan_run(compose_config([f"script={script}"], None), cpu_host_module)
