"""parallel.sync_batchnorm: planned as a part before data parallelism, refused where it would do nothing (dp 1, a
model with no BatchNorm); its GroupBatchNorm is nn.BatchNorm on one rank (forward, gradients, running statistics,
evaluation) and computes in fp32 under bf16 parameters. That 2 ranks equal one process per step is
tests/integration/test_pipeline.py's."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.errors import ConfigError
from launcher.parallel.group_batchnorm import GroupBatchNorm, convert
from tests.conftest import init_one_process_group, plan_of


def test_it_is_a_part_before_data_parallelism_and_refused_where_it_would_do_nothing(cpu_host):
    plan = plan_of(["recipe=resnet", "parallel.pipeline_stages=1", "parallel.sync_batchnorm=true"], cpu_host)
    assert [p.name for p in plan.parts] == ["recompute", "sync_batchnorm", "ddp"]
    with pytest.raises(ConfigError, match=r"parallel.sync_batchnorm=true: dp is 1 \(world 2 = pipeline_stages 2 × "
                                          r"tp 1\), so every BatchNorm already sees the whole micro-batch"):
        plan_of(["recipe=resnet", "parallel.sync_batchnorm=true"], cpu_host)  # resnet's own 2 stages
    with pytest.raises(ConfigError, match=r"parallel.sync_batchnorm=true: the model \(recipe gpt\) has no BatchNorm"):
        plan_of(["recipe=gpt", "parallel.sync_batchnorm=true"], cpu_host)


@pytest.fixture(scope="module")
def one_rank_group():
    init_one_process_group()
    yield
    dist.destroy_process_group()


def test_on_one_rank_it_is_batchnorm_and_computes_in_fp32_under_bf16(one_rank_group):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.BatchNorm1d(64))
    reference = copy.deepcopy(model)
    model, count = convert(model, None)
    assert count == 2 and isinstance(model[1], GroupBatchNorm) and isinstance(model[4], GroupBatchNorm)
    assert sorted(model.state_dict()) == sorted(reference.state_dict())  # a checkpoint loads either way
    x = torch.randn(5, 3, 6, 6)
    for _ in range(2):
        for m in (model, reference):
            m(x).square().mean().backward()
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), name  # running statistics, counts
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
    model.eval(), reference.eval()
    assert torch.allclose(model(x), reference(x), atol=1e-5)
    model.train()
    for p in model.parameters():  # as FSDP2 and DeepSpeed hand them in bf16; the statistics stay fp32
        p.data = p.data.to(torch.bfloat16)
    out = model(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and model[1].running_mean.dtype == torch.float32
