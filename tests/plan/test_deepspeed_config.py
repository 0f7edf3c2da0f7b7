"""The emitted DeepSpeed config is parsed by DeepSpeed's own DeepSpeedConfig, at the planned data-parallel size."""

import pytest

pytest.importorskip("deepspeed")
import torch.distributed as dist  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.constants import TRAIN_BATCH_SIZE  # noqa: E402

from tests.conftest import ALL_RECIPES, init_one_process_group, plan_of  # noqa: E402
from launcher.parallel import engine_config


class _DataParallelTopology:
    """DeepSpeedConfig asks an "mpu" for the data-parallel size; this one answers the plan's dp."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    # DeepSpeedConfig asks deepspeed.comm for the rank (and then the mpu for dp): a real 1-process gloo group.
    import deepspeed

    init_one_process_group()
    deepspeed.init_distributed(dist_backend="gloo")
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("recipe", ALL_RECIPES)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deepspeed_parses_our_config(recipe, stage, precision, cpu_host):
    plan = plan_of([f"recipe={recipe}", f"zero.stage={stage}", f"precision={precision}", "parallel.data_parallel=deepspeed",
                    "parallel.pipeline_stages=1"], cpu_host)
    ds = DeepSpeedConfig(dict(engine_config(plan)), mpu=_DataParallelTopology(plan.dims.dp))
    assert ds.train_batch_size == plan.batch.global_size
    assert ds.train_micro_batch_size_per_gpu == plan.batch.micro_size
    assert ds.gradient_accumulation_steps == plan.batch.grad_accum
    assert ds.zero_optimization_stage == stage
    assert ds.gradient_clipping == 0.0  # DeepSpeed's default clips at 1.0; DDP does not clip
    assert ds.bfloat16_config.enabled == (precision == "bf16")
    assert not ds.float16_config.enabled


@pytest.mark.parametrize(
    "overrides",
    [
        ["optimizer.target=CPU"],
        ["optimizer.target=CPU", "zero.stage=1", "optimizer.cpu_impl=deepspeed"],
        ["zero.stage=3", "placement.offload_params=true", "precision=bf16"],
        ["zero.stage=3", "placement.offload_params=true", "optimizer.target=CPU"],
    ],
)
def test_deepspeed_parses_our_offload_configs(overrides, cpu_host):
    plan = plan_of(["recipe=wide_deep", "placement.host_device_mix=1", *overrides], cpu_host)
    ds = DeepSpeedConfig(dict(engine_config(plan)), mpu=_DataParallelTopology(plan.dims.dp))
    zc = ds.zero_config
    assert (zc.offload_optimizer is not None) == (plan.placement.optimizer_location == "host")
    assert (zc.offload_param is not None) == (plan.placement.param_location == "host")
    if zc.offload_optimizer is not None:
        assert zc.offload_optimizer.device == "cpu" and zc.offload_optimizer.pin_memory is False
    torch_on_host = plan.placement.optimizer_location == "host" and plan.placement.cpu_impl == "torch"
    assert ds.zero_force_ds_cpu_optimizer == (not torch_on_host)


def test_deepspeed_rejects_a_batch_that_does_not_divide(cpu_host):
    # Guards the test above: the parser really checks our numbers against dp.
    plan = plan_of(["recipe=wide_deep", "parallel.data_parallel=deepspeed"], cpu_host)
    bad = {**engine_config(plan), TRAIN_BATCH_SIZE: plan.batch.global_size + plan.dims.dp}
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        DeepSpeedConfig(bad, mpu=_DataParallelTopology(plan.dims.dp))


def test_only_keys_deepspeed_knows(cpu_host):
    from deepspeed.runtime import constants
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    known = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)} | {"zero_optimization"}
    plan = plan_of(["recipe=wide_deep", "zero.stage=2"], cpu_host)
    assert set(engine_config(plan)) <= known, set(engine_config(plan)) - known
    zero_fields = set(DeepSpeedZeroConfig.model_fields) | {
        f.alias for f in DeepSpeedZeroConfig.model_fields.values() if f.alias
    }
    assert set(engine_config(plan)["zero_optimization"]) <= zero_fields
    for forbidden in ("sparse_gradients", "optimizer", "cpu_offload"):
        assert forbidden not in engine_config(plan)
    assert "auto" not in str(engine_config(plan))
