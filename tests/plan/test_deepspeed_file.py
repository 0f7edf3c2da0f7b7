"""deepspeed.config: a file's intents are adopted where ours are not set, conflicts stop the plan naming both sides,
"auto" is resolved or refused, the rest passes through to DeepSpeed, and DeepSpeed's parser checks the merged config
(the rule: launcher/parallel/deepspeed_file.py; a real run: tests/integration/test_grad_clip.py)."""

import json
import re

import pytest

from launcher.errors import ConfigError
from launcher.launch.deepspeed_check import check_with_deepspeed, read_deepspeed_file
from launcher.config import compose_config
from tests.conftest import plan_of
from launcher.parallel import engine_config

GPT = ["recipe=gpt", "smoke=true"]
EXAMPLE = {
    "train_batch_size": 8,
    "gradient_clipping": 1.0,
    "steps_per_print": 2000,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 2e7,
                          "allgather_bucket_size": 2e8},
}


def inline(d: dict) -> str:
    return "deepspeed.config=" + json.dumps(d).replace('"', "")  # YAML flow style: JSON without quotes


def test_the_files_intents_become_the_plan(cpu_host):
    plan = plan_of([*GPT, inline(EXAMPLE)], cpu_host)
    assert [p.name for p in plan.parts] == ["deepspeed"]  # a DeepSpeed config makes auto choose deepspeed
    assert plan.zero_stage == 2 and plan.placement.optimizer_location == "host" and plan.placement.pin_memory
    ds = engine_config(plan)
    assert ds["gradient_clipping"] == 1.0 and ds["steps_per_print"] == 2000
    assert ds["zero_optimization"]["overlap_comm"] is True and ds["zero_optimization"]["reduce_bucket_size"] == 2e7
    assert any(n.startswith("zero.stage=2 from deepspeed.config") for n in plan.notes)
    bucket = next(t for t in plan.peak.terms if t.name == "zero reduce bucket")
    assert "2e+07" in bucket.source and "twice: overlap_comm" in bucket.source  # the file's keys reach the memory plan


@pytest.mark.parametrize("ours, file, said", [
    ("zero.stage=3", {"zero_optimization": {"stage": 2}}, "zero_optimization.stage=2 in the inline config conflicts "
                                                          "with zero.stage=3"),
    ("batch.global_size=16", {"train_batch_size": 8}, "train_batch_size=8 .* conflicts with batch.global_size=16"),
    ("precision=fp32", {"bf16": {"enabled": True}}, "bf16.enabled=true .* conflicts with precision=fp32"),
    ("optimizer.target=device", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
     "offload_optimizer.device=cpu .* conflicts with optimizer.target .*set optimizer.target=CPU"),
    ("trainer.grad_clip=0.5", {"gradient_clipping": 1.0}, "gradient_clipping=1.0 .* conflicts with trainer.grad_clip"),
    ("optimizer.lr=0.1", {"optimizer": {"type": "Adam", "params": {"lr": 0.001}}}, "optimizer.params.lr=0.001 .* "
                                                                                   "conflicts with optimizer.lr=0.1"),
])
def test_a_key_we_set_must_agree(cpu_host, ours, file, said):
    with pytest.raises(ConfigError, match=said):
        plan_of([*GPT, ours, inline(file)], cpu_host)


def test_auto_is_resolved_from_the_plan_or_refused(cpu_host):
    plan = plan_of([*GPT, inline({"train_batch_size": "auto", "gradient_accumulation_steps": "auto",
                                  "zero_optimization": {"stage": 1},
                                  "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto",
                                                                               "warmup_num_steps": "auto"}}})],
                   cpu_host)
    ds = engine_config(plan)
    assert ds["train_batch_size"] == plan.batch.global_size and ds["gradient_accumulation_steps"] == 1
    assert ds["scheduler"]["params"] == {"warmup_max_lr": plan.optimizer.lr, "warmup_num_steps": 0}
    with pytest.raises(ConfigError, match="reduce_bucket_size=\"auto\" .*HF derives it from model.config.hidden_size"):
        plan_of([*GPT, inline({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})], cpu_host)


def test_zero3_keys_at_zero2_are_reported(cpu_host):
    plan = plan_of([*GPT, inline({"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e9}})], cpu_host)
    assert any("stage3_max_live_parameters in the inline config act at ZeRO-3 only: not applied at ZeRO-2" in n
               for n in plan.notes)


def test_an_empty_section_keeps_what_we_compiled(cpu_host):
    plan = plan_of([*GPT, "optimizer.target=CPU", inline({"zero_optimization": {}, "tensorboard": {}})], cpu_host)
    assert engine_config(plan)["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_the_optimizer_section_becomes_ours_and_is_not_emitted(cpu_host):
    # gpt's recipe sets optimizer.lr (0.005): a value of ours the file may not change (test_a_key_we_set_must_agree)
    plan = plan_of([*GPT, inline({"optimizer": {"type": "AdamW", "params": {"lr": 0.005, "weight_decay": 0.01}}})],
                   cpu_host)
    assert (plan.optimizer.name, plan.optimizer.lr, plan.optimizer.weight_decay) == ("adamw", 0.005, 0.01)
    assert "optimizer" not in engine_config(plan)


def test_optimizer_params_with_no_key_of_ours_are_refused_by_name(cpu_host):
    """The ranks give DeepSpeed a torch optimizer built from optimizer.*: an optimizer param of the file that no key
    of ours takes (amsgrad, a typo) was dropped silently."""
    file = {"optimizer": {"type": "AdamW", "params": {"lr": 0.005, "amsgrad": True, "fooo": 1}}}
    with pytest.raises(ConfigError) as e:
        plan_of([*GPT, inline(file)], cpu_host)
    said = " ".join(" ".join(e.value.problems).split())
    assert "optimizer.params.amsgrad=true in the inline config would do nothing: the ranks give DeepSpeed a torch " \
           "optimizer built from optimizer.*" in said and "optimizer.params.fooo=1 in the inline config" in said
    assert "optimizer.params.lr" in said and "Remove it." in said


def test_a_refused_offload_is_said_once_with_a_fix_that_can_be_written(cpu_host):
    with pytest.raises(ConfigError) as e:
        plan_of([*GPT, inline({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})], cpu_host)
    assert len(e.value.problems) == 1 and "nvme is not planned" in e.value.problems[0], e.value.problems
    assert "<class" not in " ".join(e.value.problems)
    with pytest.raises(ConfigError) as e:
        plan_of([*GPT, inline({"zero_optimization": {"stage": 5}})], cpu_host)
    assert len(e.value.problems) == 1 and "zero_optimization.stage=5" in e.value.problems[0], e.value.problems


def test_keys_that_would_do_nothing_are_refused(cpu_host):
    with pytest.raises(ConfigError, match="zero_optimization.overlap_comm in the inline config would do nothing: the "
                                          "run's data-parallel part is ddp, not deepspeed"):
        plan_of([*GPT, "parallel.pipeline_stages=2", inline({"zero_optimization": {"overlap_comm": True}})], cpu_host)
    with pytest.raises(ConfigError, match="activation_checkpointing .* use recompute"):
        plan_of([*GPT, inline({"activation_checkpointing": {"partition_activations": True}})], cpu_host)
    with pytest.raises(ConfigError, match="nvme is not planned"):
        plan_of([*GPT, inline({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})], cpu_host)


def test_deepspeeds_parser_checks_the_merged_config(cpu_host):
    plan = plan_of([*GPT, inline(EXAMPLE)], cpu_host)
    check_with_deepspeed(engine_config(plan), plan.dims.dp, "ds.json")  # accepted as it is
    with pytest.raises(ConfigError, match=r"DeepSpeed never reads overlap_comm \(it belongs under zero_optimization\)"):
        check_with_deepspeed({**engine_config(plan), "overlap_comm": True}, plan.dims.dp, "ds.json")
    with pytest.raises(ConfigError, match=r"never reads gradient_clippin \(did you mean gradient_clipping\?\)"):
        check_with_deepspeed({**engine_config(plan), "gradient_clippin": 1.0}, plan.dims.dp, "ds.json")
    bad = json.loads(json.dumps(engine_config(plan)))
    bad["zero_optimization"]["overlap_com"] = True
    with pytest.raises(ConfigError, match="DeepSpeed's parser refuses .*overlap_com"):
        check_with_deepspeed(bad, plan.dims.dp, "ds.json")


@pytest.mark.parametrize("extra, said", [
    ({"scheduler": {"type": "WarmupLRR", "params": {}}}, r"scheduler.type=WarmupLRR is no scheduler DeepSpeed builds "
                                                         r"\(did you mean WarmupLR\?\): one of LRRangeTest, OneCycle"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_stepz": 3}}},
     r"scheduler.params: WarmupLR does not take them \(.*warmup_num_stepz.*\). Its arguments: warmup_min_lr"),
    ({"scheduler": {"type": "StepLR", "params": {"gamma": 0.5}}},  # torch's, without its required step_size
     r"scheduler.params: StepLR does not take them \(missing a required argument: 'step_size'\)"),
    ({"steps_per_print": "x"}, r'steps_per_print="x" is no int, which DeepSpeed\'s engine computes with'),
    ({"wall_clock_breakdown": "yes"}, r'wall_clock_breakdown="yes" is no bool'),
])
def test_what_the_engine_would_fail_on_in_every_rank_is_refused(cpu_host, extra, said):
    """DeepSpeedConfig keeps the scheduler and these values as given; the engine built the scheduler (an assert, a
    TypeError) or computed with them (step % steps_per_print) in every rank."""
    plan = plan_of([*GPT, inline(EXAMPLE)], cpu_host)
    check_with_deepspeed({**engine_config(plan), "scheduler": {"type": "StepLR", "params": {"step_size": 2}}},
                         plan.dims.dp, "ds.json")  # torch's own scheduler, as DeepSpeed takes it
    with pytest.raises(ConfigError, match=said):
        check_with_deepspeed({**engine_config(plan), **extra}, plan.dims.dp, "ds.json")


def test_the_file_is_read_before_planning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text(json.dumps(EXAMPLE))
    cfg = read_deepspeed_file(compose_config([*GPT, "deepspeed.config=ds.json"]))
    assert cfg.deepspeed.source == "ds.json" and cfg.deepspeed.config.zero_optimization.stage == 2
    assert "deepspeed.config" in cfg.deepspeed.given
    for text, said in (('{"a": 1,}', "not JSON at line 1"), ('{"a": 1, "a": 2}', "key a is given twice"),
                       ("[1]", "a JSON object")):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ConfigError, match=said):
            read_deepspeed_file(compose_config([*GPT, "deepspeed.config=bad.json"]))
    with pytest.raises(ConfigError, match="cannot read it"):
        read_deepspeed_file(compose_config([*GPT, "deepspeed.config=missing.json"]))


def test_the_dry_run_shows_the_merged_config_and_a_conflict_exits_2(tmp_path, cli):
    (tmp_path / "ds_config.json").write_text(json.dumps(EXAMPLE))
    res = cli([*GPT, "deepspeed.config=ds_config.json", "dry_run=true"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    shown = res.stdout[res.stdout.index("DeepSpeed config (ds_config.json):"):]
    assert '"overlap_comm": true' in shown and '"offload_optimizer"' in shown and '"gradient_clipping": 1.0' in shown
    assert json.loads((tmp_path / "log_output" / "latest" / "ds_config.json").read_text())["zero_optimization"][
        "reduce_bucket_size"] == 2e7
    res = cli([*GPT, "deepspeed.config=ds_config.json", "zero.stage=3", "dry_run=true"], tmp_path)
    assert res.returncode == 2 and "zero_optimization.stage=2 in ds_config.json conflicts with zero.stage=3" in \
        res.stderr.replace("\n", " ")


def test_a_batch_that_does_not_divide_names_the_sizes_taken_from_the_file(cpu_host):
    """The numbers of the batch problem came partly from the file: it says which (the user never typed micro 2); and
    the file's train_batch_size, which disagrees with the recipe's global batch, is said in the same refusal (it came
    only once the batch divided, as a second refusal)."""
    with pytest.raises(ConfigError) as refusal:
        plan_of([*GPT, inline({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2})], cpu_host)
    said = str(refusal.value)
    assert re.search(r"batch does not divide: global \d+ != micro 2 .*\(Taken: batch.micro_size=2 from deepspeed.config "
                     r"the inline config \(train_micro_batch_size_per_gpu=2\)", said), said
    assert re.search(r"train_batch_size=7 in the inline config conflicts with batch.global_size=\d+", said), said
