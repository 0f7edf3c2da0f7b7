"""bf16 pipelines of models nobody here wrote, from YAML alone: HuggingFace's GPT-2 and Llama (cut by torch's tracer),
torchvision's resnet18 and a timm ViT (cut from their forward's graph, at the items of their nn.Sequential stacks).
One launched 2-rank job trains every plan through the worker's own code, one 1-rank job the one-process references
(bench/composability.py).

A bf16 pipeline is held to one process in bf16 with the same part (FSDP2's mixed precision), within a bound from
the format, not from a run: bf16 keeps 8 significant bits, so one rounding moves a value by at most u = 2^-8
relative. The stages compute the same operations as one process; only where a few sums are rounded differs. At step
0 both hold the same fp32 master weights and the reported losses are one rounding apart on each side (2u); each
update adds the rounding of the gradient it applies, one on each side: at step s, 2u(1 + s). The fp32 stages equal
one process in fp32 (1e-5), so the bf16 stages differ from the fp32 stages by what bf16 itself changes in one
process plus that rounding (shown per step; Adam turns a rounding of a small gradient into a whole step of its own,
so bf16 against fp32 has no bound from the format alone). A pipeline that mixed up dtypes (an fp32 graph asserting
on bf16 tensors, a BatchNorm in bf16 beside fp32 statistics) does not run at all; one that did something wrong (a
stage's update lost) moves the loss by the step's own change, far more than 2u(1 + s).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import composability  # noqa: E402

pytestmark = pytest.mark.integration
transformers = pytest.importorskip("transformers", reason="transformers is not installed (it is in the test extra)")

U = 2.0 ** -8
"""bf16's unit roundoff: 8 significant bits."""

HF = {
    "hf_gpt2": "model: {_target_: transformers.GPT2LMHeadModel, config: {_target_: transformers.GPT2Config, "
               "vocab_size: 32, n_positions: 32, n_embd: 32, n_layer: 2, n_head: 2, use_cache: false, "
               "resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}}",
    "hf_llama": "model: {_target_: transformers.LlamaForCausalLM, config: {_target_: transformers.LlamaConfig, "
                "vocab_size: 32, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 2, "
                "num_key_value_heads: 1, max_position_embeddings: 32}}",
}
TOKENS = """data: {_target_: launcher.recipes.gpt.data.MarkovTokenDataset, vocab_size: 32, seq_len: 32, samples: 512,
       candidates: 1}
loss: {_target_: launcher.losses.TokenCrossEntropy, shift: true}
optimizer: {name: adamw, lr: 0.02}
"""
VISION = {
    "tv_resnet18": "model: {_target_: torchvision.models.resnet18, num_classes: 10}",
    "timm_vit": "model: {_target_: timm.create_model, model_name: vit_tiny_patch16_224, pretrained: false, "
                "img_size: 32, patch_size: 8, num_classes: 10, depth: 4, embed_dim: 64, num_heads: 2}",
}
IMAGES = """data: {_target_: launcher.recipes.resnet.data.SyntheticImageDataset, classes: 10, image_size: 32,
       samples: 256}
loss: {_target_: torch.nn.CrossEntropyLoss}
optimizer: {name: adamw, lr: 0.0005}
"""
INTENTS = {
    "pp 2": ["parallel.pipeline_stages=2"],
    "bf16": ["precision=bf16"],
    "host tables": ["placement.host_device_mix=1"],
    "CPU optimizer": ["optimizer.target=CPU"],
}
COMBOS = [("pp 2",), ("pp 2", "bf16"), ("pp 2", "bf16", "host tables", "CPU optimizer")]
VISION_COMBOS = [("pp 2",), ("pp 2", "bf16"), ("pp 2", "bf16", "CPU optimizer")]  # no tables
BASE = ["batch.global_size=16", "batch.micro_batches=2", "eval.batches=0", "trainer.log_every=1"]
STEPS = 3


def importable(name: str) -> bool:
    """torchvision's CUDA wheel on a CPU torch raises RuntimeError ("operator torchvision::nms does not exist") on
    import, not ImportError: any failure to import counts as not installed."""
    try:
        __import__(name)
        return True
    except Exception:  # noqa: BLE001
        return False


def _project(folder: Path, recipes: dict[str, str], rest: str) -> None:
    (folder / "conf" / "recipe").mkdir(parents=True, exist_ok=True)
    for name, model in recipes.items():
        (folder / "conf" / "recipe" / f"{name}.yaml").write_text(
            f"# @package _global_\nrecipe: {{name: {name}}}\n{model}\n{rest}")


def _matrix(folder: Path, recipes: list[str], combos: list[tuple[str, ...]]) -> dict:
    result = composability.run(recipes, STEPS, folder, INTENTS, combos, world=2, config_dir=str(folder / "conf"),
                               base=BASE)
    print(composability.table(result))
    assert not result["refused"], result["refused"]
    return {(r["recipe"], tuple(r["combo"])): r for r in result["rows"]}


def check_bf16(matrix: dict, recipe: str, combos: list[tuple[str, ...]]) -> None:
    """fp32 stages: the one-process losses (1e-5); every bf16 combination: within 2u(1 + s) of one process in bf16
    with the same part at step s, and so from the fp32 stages by bf16's own change in one process plus that; the
    loss falls."""
    fp32 = matrix[(recipe, combos[0])]
    assert fp32["worst"] <= 1e-5, (recipe, fp32["losses"], fp32["reference"])
    for combo in combos[1:]:
        r = matrix[(recipe, combo)]
        assert "fsdp" in r["parts"] and "pipeline" in r["parts"], r["parts"]
        for s, (got, one, stages32, one32) in enumerate(zip(r["losses"], r["reference"], fp32["losses"],
                                                            fp32["reference"])):
            layout = 2 * U * (1 + s)
            assert abs(got - one) / abs(one) <= layout, (recipe, combo, s, r["losses"], r["reference"])
            assert abs(got - stages32) <= abs(one - one32) + layout * abs(one) + 1e-5 * abs(one32), (recipe, combo, s)
        print(f"{recipe} {' + '.join(combo)}: bf16 stages vs fp32 stages per step "
              f"{[f'{abs(a - b) / b:.1e}' for a, b in zip(r['losses'], fp32['losses'])]}, vs one process in bf16 "
              f"{[f'{abs(a - b) / b:.1e}' for a, b in zip(r['losses'], r['reference'])]}")
        assert r["losses"] != fp32["losses"], "the bf16 run computed in fp32"
        assert min(r["losses"][1:]) < r["losses"][0], (recipe, combo, r["losses"])


@pytest.fixture(scope="module")
def hf_matrix(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("hf_bf16")
    _project(folder, HF, TOKENS)
    return _matrix(folder, list(HF), COMBOS)


@pytest.mark.parametrize("recipe", list(HF))
def test_huggingface_models_train_on_two_bf16_stages_as_fp32_within_bf16_rounding(hf_matrix, recipe):
    check_bf16(hf_matrix, recipe, COMBOS)
    plan_parts = hf_matrix[(recipe, COMBOS[2])]
    assert composability.held_as_planned(plan_parts), (plan_parts["held"], plan_parts["planned"])


@pytest.mark.skipif(not (importable("torchvision") and importable("timm")),
                    reason="torchvision and timm do not import next to this torch (run.sh installs them best-effort: "
                           "a CPU torch needs torchvision's CPU build)")
def test_torchvision_resnet18_and_a_timm_vit_train_on_two_bf16_stages(tmp_path):
    _project(tmp_path, VISION, IMAGES)
    matrix = _matrix(tmp_path, list(VISION), VISION_COMBOS)
    for recipe in VISION:
        check_bf16(matrix, recipe, VISION_COMBOS)
