"""DeepSpeed's JIT ops: one cache folder per venv and toolchain, found built only when the launcher built it for that
key, built with the ranks' own PATH, and `script_ops` checked against the builders DeepSpeed's accelerator offers."""

import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from rich.console import Console

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.facts.host import cache_key, extensions_dir, probe_toolchain, toolchain_path
from launcher.launch.ops import RankBuildWatch, is_built, missing_ops, toolchain_env, write_stamp
from launcher.backends import BACKENDS
from launcher.parallel import RULES
from launcher.plan.script import plan_script
from launcher.worker.build_ops import BUILDERS, build_op
from tests.conftest import plan_of

VENV_BIN = str(Path(sys.executable).parent)


def test_missing_ops_counts_only_a_library_built_for_this_key(tmp_path, cpu_host):
    root = tmp_path / "py311-torchX-deepspeedY-0123456789"
    host = dataclasses.replace(cpu_host, extensions_dir=str(root))
    plan = plan_of(["recipe=quickstart", "parallel.data_parallel=deepspeed"], host)
    assert plan.ds_ops == ("deepspeed_shm_comm",)
    assert missing_ops(plan) == ["deepspeed_shm_comm"]
    so = root / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    so.parent.mkdir(parents=True)
    so.write_bytes(b"lib")
    assert missing_ops(plan) == ["deepspeed_shm_comm"]  # present, but not built by the launcher for this key
    write_stamp(root, "deepspeed_shm_comm", "/bin")
    assert missing_ops(plan) == []
    stamp = so.parent / "hetero-launch.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "key": "py311-torchX-deepspeedY-other"}))
    assert missing_ops(plan) == ["deepspeed_shm_comm"]  # an op built for another key (a copied folder)
    write_stamp(root, "deepspeed_shm_comm", "/bin")
    os.utime(so, ns=(so.stat().st_atime_ns, so.stat().st_mtime_ns + 10**9))  # rebuilt since, by something else
    assert not is_built(root, "deepspeed_shm_comm") and missing_ops(plan) == ["deepspeed_shm_comm"]


def test_cache_key_names_the_versions_and_digests_the_venv_and_toolchain(cpu_host):
    name = Path(cpu_host.extensions_dir).name
    assert name.startswith("py3") and "-torch" in name and "-deepspeed" in name
    assert len(name.rsplit("-", 1)[1]) == 10
    ours = probe_toolchain()
    assert cache_key(ours) == name == cache_key(probe_toolchain())  # stable
    assert cache_key(dataclasses.replace(ours, prefix="/other/venv")) != name
    assert cache_key(dataclasses.replace(ours, ninja="/usr/bin/ninja 1.11.1")) != name
    assert cache_key(dataclasses.replace(ours, path="/somewhere/else")) == name  # PATH's other entries: no rebuild
    assert ours.prefix == os.path.realpath(sys.prefix) and ours.torch_include.endswith(os.path.join("torch", "include"))


def test_an_activated_and_a_bare_venv_get_one_path_and_one_key():
    """Called as .venv/bin/hetero-launch with a PATH that lacks .venv/bin, the toolchain is the activated one's."""
    bare = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    activated = {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"}
    assert toolchain_path(bare) == toolchain_path(activated) == activated["PATH"]
    assert cache_key(probe_toolchain(bare)) == cache_key(probe_toolchain(activated))


def test_the_prebuild_and_the_ranks_run_with_one_path(cpu_host):
    host = dataclasses.replace(cpu_host, toolchain_path=f"{VENV_BIN}:/usr/bin")
    plan = plan_of(["recipe=quickstart", "parallel.data_parallel=deepspeed"], host)
    assert {r.env["PATH"] for r in plan.ranks} == {f"{VENV_BIN}:/usr/bin"}
    env = toolchain_env(plan)
    assert env["PATH"] == f"{VENV_BIN}:/usr/bin" and env["TORCH_EXTENSIONS_DIR"] == cpu_host.extensions_dir
    assert env["DS_ACCELERATOR"] == "cpu"


def test_a_second_venv_computes_its_own_cache_folder(tmp_path, cpu_host):
    """A venv without pip that sees this one's packages (a .pth): another prefix and another ninja, another key."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv2")], check=True)
    site = next((tmp_path / "venv2" / "lib").glob("python3*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    (site / "ours.pth").write_text("\n".join([*ours, str(Path(__file__).parents[1])]) + "\n")
    code = "from launcher.facts.host import extensions_dir; print(extensions_dir())"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # not activated: no venv bin on PATH
    other = subprocess.run([str(tmp_path / "venv2" / "bin" / "python"), "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert again == str(extensions_dir()) == cpu_host.extensions_dir  # our key, from a process with a bare PATH
    assert Path(other).parent == Path(again).parent and other != again


@pytest.mark.parametrize("ops, message", [
    ("[fused_adma]", r"script_ops: 'fused_adma' is not a DeepSpeed op .* Did you mean fused_adam\? Use names from: "),
    ("[fused_lamb]", r"script_ops: fused_lamb \(FusedLambBuilder\) is not offered by DeepSpeed's cpu accelerator, "
                     r"which builds .*fused_adam.*\. Remove fused_lamb from script_ops"),
])
def test_bad_script_ops_are_named_with_the_fix(tmp_path, cpu_host, ops, message):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ConfigError, match=message):
        plan_script(compose_config([f"script={script}", f"script_ops={ops}"]), cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)


def test_script_ops_are_prebuilt_with_the_engines_and_refused_for_a_recipe(tmp_path, cpu_host):
    script = tmp_path / "train.py"
    script.write_text("from launcher import runtime\n\nmodel, optimizer = runtime.prepare(model, optimizer)\n")
    # a runtime.prepare() script, whose optimizer.target=CPU runs on DeepSpeed (a plain script's intents do nothing)
    plan = plan_script(compose_config([f"script={script}", "script_ops=[fused_adam]",
                                       "optimizer.target=CPU"]), cpu_host, backends=tuple(BACKENDS.values()), parts=RULES)
    assert plan.ds_ops == ("deepspeed_shm_comm", "fused_adam")
    with pytest.raises(ConfigError, match=r"script_ops=\[fused_adam\] without script=.*Remove script_ops"):
        plan_of(["recipe=quickstart", "script_ops=[fused_adam]"], cpu_host)


def test_an_unknown_script_op_exits_2(tmp_path, cli):
    (tmp_path / "train.py").write_text("")
    res = cli(["script=train.py", "script_ops=[nope]", "dry_run=true"], tmp_path)
    assert res.returncode == 2 and "script_ops: 'nope' is not a DeepSpeed op" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_every_cpu_op_has_a_builder_on_deepspeeds_cpu_accelerator():
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    cpu = CPU_Accelerator()
    for name, op in BUILDERS.items():
        cls = cpu.get_op_builder(op.builder)
        offered = cls is not None and cls.__name__ != "NotImplementedBuilder"
        assert offered == ("cpu" in op.devices), name
        assert not offered or cls.NAME == name
    fake = types.SimpleNamespace(create_op_builder=lambda _: None, device_name=lambda: "cuda")
    with pytest.raises(SystemExit, match=r"DeepSpeed's cuda accelerator has no FusedAdamBuilder \(fused_adam\)"):
        build_op(fake, "fused_adam")
    with pytest.raises(SystemExit, match="unknown DeepSpeed op 'nope'; known: async_io"):
        build_op(fake, "nope")


def test_a_rank_compiling_an_op_is_announced_once(tmp_path, cpu_host):
    host = dataclasses.replace(cpu_host, extensions_dir=str(tmp_path))
    plan = plan_of(["recipe=quickstart", "parallel.data_parallel=deepspeed"], host)
    console = Console(record=True, width=300)
    watch = RankBuildWatch(plan, console, every_s=0.0)
    for op, age in (("fused_adam", 10), ("deepspeed_shm_comm", 0)):  # shm: a load with nothing to build
        lock = tmp_path / op / "lock"
        lock.parent.mkdir()
        lock.write_text("")
        os.utime(lock, (time.time() - age, time.time() - age))
    watch.tick()
    watch.tick()
    text = console.export_text()
    assert text.count("a rank is compiling DeepSpeed op fused_adam") == 1 and "script_ops=[fused_adam]" in text
    assert "deepspeed_shm_comm" not in text
