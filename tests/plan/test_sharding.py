"""Op-level sharding and tensor parallel are planned before launch: strategies in MindSpore's notation become dp × tp,
per-operator placements, shapes and named collectives (the dry run's table); every bad strategy is one sentence."""

import io

import pytest
from rich.console import Console

from launcher.errors import ConfigError
from launcher.plan import HostFacts, LaunchPlan
from launcher.report.plan_view import sharding_table
from tests.conftest import plan_of

HOST8 = HostFacts(hostname="h", cpu_count=8, accelerators=0, extensions_dir="/x")
SEMI_AUTO = ["recipe=quickstart", "parallel=semi_auto"]


def rows(plan) -> dict[str, list[str]]:
    table = sharding_table(plan.sharding)
    cells = [list(c.cells) for c in table.columns]
    return {cells[0][i]: [col[i] for col in cells[1:]] for i in range(len(cells[0]))}


def test_quickstart_semi_auto_as_the_issue_states():
    plan = plan_of(SEMI_AUTO, HOST8)
    assert (plan.world_size, plan.dims.dp, plan.dims.tp) == (8, 2, 4)
    assert [p.name for p in plan.parts] == ["tensor_parallel", "ddp"]
    assert (plan.batch.global_size, plan.batch.micro_size) == (16, 8)  # 2 samples per card × 8 cards
    r = rows(plan)
    assert r["fc1 (matmul)"] == [
        "[[2,4],[4,1]]", "x (16, 32), w (32, 16), out (16, 16)", "x (8, 8), w (8, 16), out (8, 16) partial",
        "slice over tp (4 ranks, no communication): Replicate → Shard(1) of the input x (8, 32); "
        "all-reduce over tp (4 ranks): Partial → Replicate of fc1's output (8, 16)"]
    assert r["relu (relu)"] == ["[[2,1]] propagated", "x (16, 16)", "x (8, 16)", "none"]
    assert r["fc2 (matmul_1)"] == ["[[2,1],[1,1]] propagated", "x (16, 16), w (16, 16), out (16, 16)",
                                   "x (8, 16), w (16, 16), out (8, 16)", "none"]
    assert plan.sharding.gradients == "gradients: all-reduce over dp (2 ranks) and divide by 2, every parameter"
    out = io.StringIO()
    Console(file=out, width=250).print(sharding_table(plan.sharding))
    assert "sharding (parallel.sharding, sharding_propagation; dp 2 × tp 4; w as (in, out))" in out.getvalue()
    assert LaunchPlan.from_dict(plan.to_dict()) == plan  # plan.json round-trips


def test_module_names_and_a_column_split_propagate_megatron_style():
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=4", "batch.micro_size=8",
                    "parallel.sharding={fc1: [[1,1],[1,4]]}"], HOST8)
    r = rows(plan)
    assert r["fc1 (matmul)"][2:] == ["x (8, 32), w (32, 4), out (8, 4)", "none"]
    assert r["relu (relu)"][:1] == ["[[1,4]] propagated"]  # keeps its input's split
    assert r["fc2 (matmul_1)"][0] == "[[1,4],[4,1]] propagated"  # row split: no redistribution before it
    assert r["fc2 (matmul_1)"][3] == "all-reduce over tp (4 ranks): Partial → Replicate of fc2's output (8, 16)"


def test_a_column_split_last_operator_is_gathered_for_the_loss():
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=2", "parallel.sharding={fc2: [[1,1],[1,2]]}"], HOST8)
    assert rows(plan)["fc2 (matmul_1)"][3] == ("all-gather over tp (2 ranks): Shard(1) → Replicate of fc2's output "
                                               "(16, 16) for the loss")


def test_gpt_tp_plan_is_megatron_with_whole_heads_per_rank():
    plan = plan_of(["recipe=gpt", "cluster.nproc_per_node=4", "parallel.tp=2"], HOST8)
    assert (plan.dims.dp, plan.dims.tp, plan.sharding.source) == (2, 2, "parallel.tp")
    assert [p.name for p in plan.parts] == ["tensor_parallel", "ddp"]
    r = rows(plan)
    assert r["blocks.0.attn.qkv (matmul)"][:3] == ["[[2,1],[1,2]] colwise", "x (32, 63, 64), w (64, 192), "
                                                   "out (32, 63, 192)", "x (16, 63, 64), w (64, 96), out (16, 63, 96)"]
    assert r["blocks.1.mlp.2 (matmul_7)"][2:] == [
        "x (16, 63, 128), w (128, 64), out (16, 63, 64) partial",
        "all-reduce over tp (2 ranks): Partial → Replicate of blocks.1.mlp.2's output (16, 63, 64)"]


def test_plain_tp_override_and_every_recipe_still_compose():
    plan = plan_of(["recipe=quickstart", "parallel.tp=2"], HOST8)
    assert [(o.name, o.kind) for o in plan.sharding.ops] == [("fc1", "colwise"), ("fc2", "rowwise")]
    assert plan_of(["recipe=quickstart"], HOST8).sharding is None


EIGHT = ["recipe=quickstart", "cluster.nproc_per_node=8", "batch.global_size=16", "batch.micro_size=-1"]
W8 = "world_size: cluster.nnodes 1 × nproc_per_node 8"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.sharding={matmul: [[2,4],[4,2]]}"],
         rf"parallel.sharding.matmul=\[\[2,4\],\[4,2\]\]: its factors multiply to 16 \(2 × 4 × 2\), not the 8 devices "
         rf"\({W8}\)\. Make the product 8, e.g. parallel.sharding.matmul=\[\[2,4\],\[4,1\]\]\."),
        (["parallel.sharding={relu: [[1,1]]}"],
         r"parallel.sharding.relu=\[\[1,1\]\]: its factors multiply to 1 \(1 × 1\), not the 8 devices .* e.g. "
         r"parallel.sharding.relu=\[\[1,8\]\]\."),
        (["model.in_features=30"],
         r"parallel.sharding.matmul=\[\[2,4\],\[4,1\]\]: dim 1 of x \(in\) of fc1 is 30, not divisible by its factor "
         r"4\. Set model.in_features to a multiple of 4, or give a factor that divides 30\."),
        (["parallel.sharding={matmull: [[2,4],[4,1]]}"],
         r"parallel.sharding.matmull: recipe quickstart has no operator matmull\. Did you mean "
         r"parallel.sharding.matmul\? Its operators: fc1 \(matmul\), relu \(relu\), fc2 \(matmul_1\)\."),
        (["parallel.sharding={fc1: [[2,4],[2,1]]}"],
         r"x's width factor 4 differs from w's height factor 2; a matmul needs them equal"),
        (["parallel.sharding={fc1: [[2,2],[2,2]]}"],
         r"splits both w's height \(2\) and width \(2\): only one may be > 1 \(the tp group is one mesh dim\)\. "
         r"Use parallel.sharding.fc1=\[\[2,4\],\[4,1\]\] or parallel.sharding.fc1=\[\[2,1\],\[1,4\]\]\."),
        (["parallel.sharding={fc1: [[2,4],[4,1]], fc2: [[4,2],[2,1]]}"],
         r"parallel.sharding.fc2 splits the batch 4 ways and parallel.sharding.fc1 2 ways"),
        (["parallel.tp=2"], r"parallel.sharding gives dp 2 × tp 4 \(parallel.sharding.matmul=\[\[2,4\],\[4,1\]\]\), "
                            r"but parallel.dp=-1 and parallel.tp=2\. Set parallel.dp=2 parallel.tp=4"),
        (["parallel.sharding={fc1: [2,4]}"], r"parallel.sharding.fc1=\[2,4\] is not a strategy"),
        (["parallel.search_mode=recursive_programming"], r"parallel.search_mode=recursive_programming is not supported"),
        (["parallel.data_parallel=deepspeed", "zero.stage=1"],
         r"parallel.data_parallel=deepspeed: DeepSpeed's engine .* composes with neither tensor parallel nor "
         r"torch.distributed.pipelining \(parallel.sharding=\{matmul:\[\[2,4\],\[4,1\]\]\}\)\. Set "
         r"parallel.data_parallel=auto \(it picks fsdp\)\."),
    ],
    ids=["product", "product_elementwise", "divisible", "unknown_op", "x_w_mismatch", "two_d_tp", "batch_factors", "tp_contradicts",
         "form", "search_mode", "deepspeed"],
)
def test_bad_strategies_are_refused_before_launch(overrides, message):
    base = SEMI_AUTO if not any(o.startswith("parallel.sharding") for o in overrides) else EIGHT
    with pytest.raises(ConfigError, match=message):
        plan_of([*base, *overrides], HOST8)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["recipe=gpt", "parallel.tp=2", "model.heads=3", "model.width=48"],
         r"parallel.tp=2 splits attention by heads, and model.heads=3 is not divisible by 2\."),
        (["recipe=gpt", "parallel.sharding={fc1: [[1,2],[2,1]]}"],
         r"parallel.sharding: recipe gpt does not list its operators for op-level sharding"),
        (["recipe=resnet", "parallel.tp=2", "parallel.pipeline_stages=1"], r"parallel.tp=2: recipe resnet has no tensor-parallel plan"),
    ],
    ids=["heads", "gpt_sharding", "no_tp_plan"],
)
def test_tensor_parallel_refusals(overrides, message):
    with pytest.raises(ConfigError, match=message):
        plan_of(overrides, HostFacts(hostname="h", cpu_count=2, accelerators=0, extensions_dir="/x"))


@pytest.mark.parametrize("overrides, parts", [
    (["zero.stage=1"], ["tensor_parallel", "fsdp"]),
    (["precision=bf16"], ["tensor_parallel", "fsdp"]),
    (["recompute=[all]"], ["tensor_parallel", "recompute", "ddp"]),
    (["parallel.data_parallel=fsdp"], ["tensor_parallel", "fsdp"]),
])
def test_op_level_sharding_composes_with_zero_bf16_and_recompute(overrides, parts):
    plan = plan_of([*SEMI_AUTO, *overrides], HOST8)
    assert [p.name for p in plan.parts] == parts and (plan.dims.dp, plan.dims.tp) == (2, 4)


def test_a_bad_strategy_exits_2_before_any_process(tmp_path, cli):
    res = cli([*SEMI_AUTO, "cluster.nproc_per_node=4"], tmp_path)
    assert res.returncode == 2, res.stderr
    assert "its factors multiply to 8 (2 × 4 × 1), not the 4 devices" in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_smoke_keeps_the_ranks_a_strategy_spans_and_dotted_overrides_add_strategies():
    plan = plan_of([*SEMI_AUTO, "smoke=true"], HOST8)
    assert (plan.world_size, plan.steps, plan.smoke) == (8, 2, True)
    assert plan_of(["recipe=gpt", "parallel.tp=2", "smoke=true"], HOST8).world_size == 2  # smoke's 2 ranks: tp 2
    plan = plan_of(["recipe=quickstart", "cluster.nproc_per_node=2", "parallel.sharding.fc2=[[1,2],[2,1]]"], HOST8)
    assert [(o.name, o.given) for o in plan.sharding.ops] == [("fc1", False), ("relu", False), ("fc2", True)]
