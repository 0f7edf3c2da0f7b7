"""DeepSpeed's JIT ops: found in our cache when built, reported missing (and so built once, with a message) when not."""

import dataclasses

from launcher.launch.ops import missing_ops
from tests.conftest import plan_of


def test_missing_ops_in_an_empty_cache(tmp_path, cpu_host):
    host = dataclasses.replace(cpu_host, extensions_dir=str(tmp_path))
    plan = plan_of(["recipe=quickstart", "parallel.data_parallel=deepspeed"], host)
    assert plan.ds_ops == ("deepspeed_shm_comm",)
    assert missing_ops(plan) == ["deepspeed_shm_comm"]
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"")
    assert missing_ops(plan) == []


def test_cache_dir_is_per_python_torch_and_deepspeed(cpu_host):
    name = cpu_host.extensions_dir.rsplit("/", 1)[-1]
    assert name.startswith("py3") and "-torch" in name and "-deepspeed" in name
