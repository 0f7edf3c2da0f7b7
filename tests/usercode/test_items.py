"""Models and data as they come: items as DataLoader batches them (tuples with Python numbers, dicts), outputs as
HuggingFace returns them (model_output), the token loss a causal LM needs; a HuggingFace GPT-2 from YAML alone."""

import json
import os
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import default_collate

from launcher.errors import ConfigError
from launcher.losses import TokenCrossEntropy
from launcher.usercode.items import select_output, split_item
from tests.conftest import plan_of, run_cli

transformers = pytest.importorskip("transformers", reason="transformers is not installed (it is in the test extra: "
                                                          "pip install -e '.[test]')")

HF_GPT2 = """# @package _global_
recipe: {name: hf_gpt2}
model:
  _target_: transformers.GPT2LMHeadModel
  config: {_target_: transformers.GPT2Config, vocab_size: 32, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2,
           use_cache: false, resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}  # dropout: ranks draw other masks
data: {_target_: launcher.recipes.gpt.data.MarkovTokenDataset, vocab_size: 32, seq_len: 32, samples: 2048,
       candidates: 1}
eval_data: {_target_: launcher.recipes.gpt.data.MarkovTokenDataset, vocab_size: 32, seq_len: 32, samples: 64,
            candidates: 1, split_seed: 1}
loss: {_target_: launcher.losses.TokenCrossEntropy, shift: true}
optimizer: {name: adamw, lr: 0.02}
trainer: {steps: 20, log_every: 1, checkpoint_every: -1}
"""


def test_tuple_items_with_python_numbers_and_dict_items_split_as_the_ranks_split_them():
    inputs, label = split_item(default_collate([(torch.ones(3), 1), (torch.zeros(3), 0)]))
    assert inputs[0].shape == (2, 3) and label.tolist() == [1, 0] and label.dtype == torch.int64
    items = [{"input_ids": torch.arange(4), "mask": torch.ones(4), "labels": torch.arange(4)}] * 2
    inputs, label = split_item(default_collate(items))
    assert list(inputs) == ["input_ids", "mask"] and label.shape == (2, 4)
    inputs, label = split_item(default_collate(items), ["input_ids"], "mask")
    assert list(inputs) == ["input_ids"] and label.dtype == torch.float32


def test_model_output_auto_takes_logits_of_a_model_output_and_a_path_takes_what_it_names():
    out = transformers.modeling_outputs.CausalLMOutput(logits=torch.ones(2, 3), hidden_states=(torch.zeros(1),))
    assert select_output(out) is out.logits and select_output(out, "hidden_states.0").shape == (1,)
    assert select_output((torch.zeros(2), torch.ones(1))).shape == (2,)
    with pytest.raises(KeyError):
        select_output({"scores": torch.zeros(1)}, "logits")


def test_token_cross_entropy_with_shift_is_huggingfaces_own_causal_lm_loss():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1,
                                                                 n_head=2))
    ids = torch.randint(32, (3, 16))
    ids[0, 5] = -100  # a padding label counts for nothing, as in HuggingFace's loss
    out = model(input_ids=ids.clamp(min=0), labels=ids)
    ours = TokenCrossEntropy(shift=True)(out.logits, ids)
    assert torch.allclose(ours, out.loss, rtol=1e-6)
    flat = F.cross_entropy(out.logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(ours, flat)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf_project")
    (folder / "conf" / "recipe").mkdir(parents=True)
    (folder / "conf" / "recipe" / "hf_gpt2.yaml").write_text(HF_GPT2)
    return folder


def test_a_huggingface_causal_lm_plans_from_yaml_alone(hf_folder, cpu_host):
    cwd = os.getcwd()
    os.chdir(hf_folder)
    try:
        plan = plan_of(["recipe=hf_gpt2", "placement.host_device_mix=1"], cpu_host, config_dir="conf")
        with pytest.raises(ConfigError, match=r"model_output=loss: the model's output "
                                              r"\(CausalLMOutputWithCrossAttentions\) has no 'loss'"):
            plan_of(["recipe=hf_gpt2", "model_output=loss"], cpu_host, config_dir="conf")
        with pytest.raises(ConfigError, match=r"placement.tables.transformer.wte: recipe hf_gpt2's embedding "
                                              r"transformer.wte trains inside the parts: its weight is shared with "
                                              r"lm_head.weight. Untie"):
            plan_of(["recipe=hf_gpt2", "+placement.tables.transformer.wte=host"], cpu_host, config_dir="conf")
    finally:
        os.chdir(cwd)
    notes = "\n".join(plan.notes)
    assert "8 samples per rank and micro-batch" in notes and plan.batch.micro_size == 8
    assert {t.name: t.location for t in plan.placement.tables} == {"transformer.wpe": "host"}
    assert ("placement.host_device_mix=1 leaves inside the parts: transformer.wte (its weight is shared with "
            "lm_head.weight)") in notes
    assert plan.data["data_inputs"] == [] and plan.model_output == "auto"


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "rank.0" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "event" not in r}


@pytest.mark.integration
def test_a_huggingface_gpt2_trains_on_two_ranks_with_host_tables_as_on_one(hf_folder, tmp_path):
    """GPT-2 from YAML alone, with its position table on the host, on 1 rank, on 2 data-parallel ranks, and as 2
    pipeline stages cut by torch's tracer at a block (it is no chain: its blocks sit in a ModuleList; its head is
    tied to the token embedding across the stages): the same loss at every step."""
    runs = {}
    layouts = {"one": ["cluster.nproc_per_node=1"], "dp2": ["cluster.nproc_per_node=2"],
               "pp2": ["cluster.nproc_per_node=2", "parallel.pipeline_stages=2", "+parallel.stages={transformer.h.1: 1}",
                       "batch.micro_batches=4"]}
    for name, args in layouts.items():
        cwd = tmp_path / name
        cwd.mkdir()
        (cwd / "conf").symlink_to(hf_folder / "conf")
        res = run_cli(["--config-dir", "conf", "recipe=hf_gpt2", "placement.host_device_mix=1",
                       "batch.global_size=32", *args], cwd)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "model_output=auto took `logits`" in res.stdout.replace("\n", " ")
        runs[name] = (cwd / "log_output" / "latest").resolve()
    one = _losses(runs["one"])
    for name in ("dp2", "pp2"):
        other = _losses(runs[name])
        worst = max(abs(one[s] - other[s]) / abs(one[s]) for s in one)
        assert one.keys() == other.keys() and worst <= 1e-5, (name, worst, one, other)
    plan = json.loads((runs["pp2"] / "plan.json").read_text())
    assert plan["pipeline"]["split"] == "trace"
    assert [s["layers"][0] for s in plan["pipeline"]["stages"]] == ["transformer.wte", "transformer.h.1"]
    two = _losses(runs["dp2"])
    summary = json.loads((runs["dp2"] / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["eval"]["n"] == 64
