"""HF Trainer's own DeepSpeed values (launcher/integrations/trainer_args.py): the handed-over config agrees with the
script's TrainingArguments, or the run is refused before launch naming both; never a rank stopped by transformers'
"mismatch TrainingArguments values" check."""

from __future__ import annotations

import ast
import dataclasses
import json

import pytest

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.integrations.trainer_args import DEFAULTS, UNKNOWN, read_trainer_args, reconcile, script_value
from launcher.launch.planning import plan_run

CALL = 'from transformers import TrainingArguments\nargs = TrainingArguments("out", {kw})\n'


def _args(text: str):
    return read_trainer_args(ast.parse(text), "train.py")


def _config() -> dict:
    return {"bf16": {"enabled": True}, "fp16": {"enabled": False}, "gradient_accumulation_steps": 2,
            "gradient_clipping": 0.5, "zero_optimization": {"stage": 2}}


def test_the_defaults_are_transformers_own():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    fields = {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments)}
    assert {k: fields[k] for k in DEFAULTS} == DEFAULTS


def test_what_the_scripts_text_shows():
    closed = _args(CALL.format(kw="bf16=True, gradient_accumulation_steps=4, ddp_backend='gloo'"))
    assert (closed.source, dict(closed.values), closed.where) == ("code", {"bf16": True,
                                                                          "gradient_accumulation_steps": 4},
                                                                  "train.py line 2")
    assert script_value(closed, (), ("max_grad_norm",)) == 1.0  # left out: transformers' default
    for hidden in ("**extra", "bf16=use_bf16"):  # not visible: never guessed
        assert script_value(_args(CALL.format(kw=hidden)), (), ("bf16", "bf16_full_eval")) is UNKNOWN
    two = CALL + 'more = TrainingArguments("b")\n'
    assert script_value(_args(two.format(kw="")), (), ("bf16",)) is UNKNOWN
    parsed = _args("from transformers import HfArgumentParser, TrainingArguments\n"
                   "p = HfArgumentParser(TrainingArguments)\n")
    assert parsed.source == "command line"
    line = ["--output_dir", "o", "--bf16", "--gradient_accumulation_steps", "4", "--max_grad_norm=0.5"]
    assert [script_value(parsed, line, n) for n in (("bf16",), ("gradient_accumulation_steps",),
                                                    ("max_grad_norm",), ("fp16",))] == [True, 4, 0.5, False]
    assert script_value(parsed, ["--bf16", "false"], ("bf16",)) is False
    assert script_value(parsed, ["args.json"], ("bf16",)) is UNKNOWN  # HfArgumentParser's file form


def test_values_without_an_intent_are_left_to_the_trainer():
    config = _config()
    problems, notes = reconcile(config, set(), _args(CALL.format(kw="")), ())
    assert (problems, notes) == ([], [])
    assert [config["bf16"]["enabled"], config["fp16"]["enabled"], config["gradient_accumulation_steps"],
            config["gradient_clipping"], config["zero_optimization"]] == ["auto"] * 4 + [{"stage": 2}]


def test_an_intent_the_script_contradicts_is_refused_naming_both():
    intents = {"precision", "batch.grad_accum", "trainer.grad_clip"}
    agree = _args(CALL.format(kw="bf16=True, gradient_accumulation_steps=2, max_grad_norm=0.5"))
    config = _config()
    assert reconcile(config, intents, agree, ()) == ([], [])
    assert config == _config()
    problems, _ = reconcile(_config(), intents, _args(CALL.format(kw="gradient_accumulation_steps=2")), ())
    assert len(problems) == 2  # bf16 left at its default False; max_grad_norm at 1.0
    assert "precision makes the DeepSpeed config's bf16.enabled=True" in problems[0]
    assert "bf16=False (train.py line 2 or its defaults)" in problems[0] and "drop precision" in problems[0]
    assert "trainer.grad_clip" in problems[1] and "max_grad_norm=1.0" in problems[1]
    problems, notes = reconcile(_config(), intents, _args(CALL.format(kw="**extra")), ())
    assert problems == [] and "cannot see" in notes[0] and "bf16.enabled=True (precision)" in notes[0]


def test_an_hf_trainer_script_with_deepspeed_intents_plans_or_is_refused(tmp_path, monkeypatch, cpu_host):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    intents = ["zero.stage=2", "optimizer.target=CPU", "trainer.grad_clip=0.5"]
    script.write_text(CALL.format(kw="ddp_backend='gloo', gradient_accumulation_steps=4"))
    with pytest.raises(ConfigError, match=r"max_grad_norm=1.0 .*Set max_grad_norm to match in the script"):
        plan_run(compose_config([f"script={script}", *intents], None), cpu_host)
    script.write_text(CALL.format(kw="ddp_backend='gloo', max_grad_norm=0.5, gradient_accumulation_steps=4"))
    plan = plan_run(compose_config([f"script={script}", *intents], None), cpu_host)[0]
    handed = json.loads(plan.ranks[0].env["ACCELERATE_DEEPSPEED_CONFIG_FILE"])
    assert handed["gradient_clipping"] == 0.5 and handed["gradient_accumulation_steps"] == "auto"
    assert handed["bf16"] == handed["fp16"] == {"enabled": "auto"}  # no precision intent: TrainingArguments decide
    # bf16 on a CPU host: transformers refuses TrainingArguments(bf16=True) without use_cpu, which rules DeepSpeed out
    script.write_text(CALL.format(kw="ddp_backend='gloo', bf16=True"))
    with pytest.raises(ConfigError, match=r"precision=bf16 .* HF Trainer script on a CPU host.*use_cpu"):
        plan_run(compose_config([f"script={script}", "precision=bf16", *intents], None), cpu_host)
