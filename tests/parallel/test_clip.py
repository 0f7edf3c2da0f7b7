"""trainer.grad_clip's hook (launcher/parallel/clip.py) clips as torch's clip_grad_norm_, also over DTensor shards
(a 1-rank mesh here; 2 ranks and every part: tests/integration/test_grad_clip.py)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from launcher.parallel.clip import GradClip, total_norm
from launcher.parallel.rank import Chunk
from tests.conftest import init_one_process_group


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    net(torch.randn(4, 6)).pow(2).sum().backward()
    return net


@pytest.mark.parametrize("max_norm", [0.01, 1e6])
def test_clips_as_torch(max_norm):
    ours, theirs = _net(), _net()
    clip = GradClip([Chunk(module=ours, paths=[])], max_norm, torch.device("cpu"))
    clip(None, (), {})
    norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    assert torch.allclose(clip.last, norm)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
    assert (clip.last > max_norm) == (max_norm == 0.01)  # the small bound bites, the large one does not


def test_dtensor_shards_count_once():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    init_one_process_group()
    try:
        mesh = init_device_mesh("cpu", (1,))
        plain = _net()
        expected = torch.nn.utils.get_total_norm([p.grad for p in plain.parameters()])
        params = []
        for i, p in enumerate(plain.parameters()):
            d = nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0) if i % 2 else Replicate()]))
            d.grad = distribute_tensor(p.grad, mesh, [Shard(0) if i % 2 else Replicate()])
            params.append(d)
        assert torch.allclose(total_norm(params, torch.device("cpu")), expected)
    finally:
        dist.destroy_process_group()
