"""The CUDA paths, on a host with CUDA devices (skipped elsewhere, saying why): cuda:<local rank> devices, nccl,
bf16 on the device (FSDP2's MixedPrecisionPolicy and DeepSpeed's bf16), BatchNorm in bf16 on the device, host tables
whose rows travel host -> device through pinned memory without blocking. Each against the same run's reference.
Run them with ``./run.sh test -m gpu`` on a GPU machine (docs/gpu.md says which of them have run where)."""

import json

import pytest

from tests.integration.test_engines import losses, parts, run

torch = pytest.importorskip("torch")

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device (this host has none: torch.cuda.is_available() "
                                                   "is False)")]

ON_GPU = ["cluster.device=cuda", "cluster.backend=nccl", "trainer.log_every=1", "trainer.checkpoint_every=0",
          "eval.batches=1"]
GPT = ["recipe=gpt", "model.layers=2", "model.width=64", "model.heads=4", "model.seq_len=32", "trainer.steps=8",
       "batch.global_size=16", "batch.micro_batches=2", "optimizer.lr=0.01", *ON_GPU]


def worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def test_bf16_on_one_gpu_with_fsdp_and_deepspeed(tmp_path):
    fsdp = run(tmp_path, "fsdp", [*GPT, "cluster.nproc_per_node=1", "precision=bf16", "parallel.data_parallel=fsdp"])
    ds = run(tmp_path, "ds", [*GPT, "cluster.nproc_per_node=1", "precision=bf16", "parallel.data_parallel=deepspeed"])
    fp32 = run(tmp_path, "fp32", [*GPT, "cluster.nproc_per_node=1"])
    assert parts(fsdp) == ["fsdp"] and parts(ds) == ["deepspeed"]
    assert json.loads((fsdp / "rank.0" / "mesh.json").read_text())["rank"] == 0
    for run_dir in (fsdp, ds):  # bf16 against fp32: rounding, not another training
        assert worst(losses(run_dir), losses(fp32)) <= 2e-2


def test_host_tables_reach_the_gpu_through_pinned_memory_and_match_device_tables(tmp_path):
    common = ["recipe=wide_deep", "model.rows_per_table=2000", "batch.global_size=512", "trainer.steps=8",
              "cluster.nproc_per_node=1", *ON_GPU]
    host = run(tmp_path, "host", [*common, "placement.host_device_mix=1", "placement.pin_memory=true"])
    device = run(tmp_path, "device", common)
    memory = json.loads((host / "rank.0" / "memory.json").read_text())
    assert {t["torch_device"] for t in memory["tables"].values()} == {"cpu"}
    assert "cuda" in memory["devices"]["params"]
    assert worst(losses(host), losses(device)) <= 1e-5


def test_batchnorm_in_bf16_on_the_gpu(tmp_path):
    res = run(tmp_path, "resnet", ["recipe=resnet", "model.width=4", "model.blocks=[1,1,1,1]", "data.image_size=16",
                                   "batch.global_size=16", "trainer.steps=6", "parallel.pipeline_stages=1",
                                   "precision=bf16", "cluster.nproc_per_node=1", *ON_GPU])
    got = losses(res)
    assert got[6] < got[1]


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices for nccl between ranks")
def test_pipeline_and_tensor_parallel_over_nccl_match_one_gpu(tmp_path):
    one = run(tmp_path, "one", [*GPT, "cluster.nproc_per_node=1"])
    pipe = run(tmp_path, "pipe", [*GPT, "cluster.nproc_per_node=2", "parallel.pipeline_stages=2"])
    tp = run(tmp_path, "tp", [*GPT, "cluster.nproc_per_node=2", "parallel.tp=2"])
    assert worst(losses(pipe), losses(one)) <= 1e-5 and worst(losses(tp), losses(one)) <= 1e-4


def test_host_modules_cross_to_the_gpu_and_match_the_device_run(tmp_path):
    """placement.modules on one GPU: mnist_mlp's Dense layers on the host CPU (inputs copied there, outputs back to
    cuda) against every layer on the GPU; and a HostModule alone: its output on cuda, its gradients on the host."""
    from launcher.worker.host_modules import HostModule

    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, device="cuda", requires_grad=True)
    out = HostModule(layer, "layer")(x)
    out.sum().backward()
    assert out.device.type == "cuda" and layer.weight.grad.device.type == "cpu" and x.grad.device.type == "cuda"
    mnist = ["recipe=mnist_mlp", "trainer.steps=8", "data.samples=512", "data.eval_samples=64", *ON_GPU]
    host = run(tmp_path, "host", [*mnist, "cluster.nproc_per_node=1"])
    device = run(tmp_path, "device", [*mnist, "cluster.nproc_per_node=1",
                                       "placement.modules={dense1: device, dense2: device, dense3: device}"])
    assert worst(losses(host), losses(device)) <= 1e-5
