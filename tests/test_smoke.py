"""smoke=true: every recipe brings a profile; a smoke run keeps the recipe's structure at a tiny size, on 2 gloo
ranks on the CPU even on a GPU host; the user's overrides still win; the plan says what changed. check and -m plan
every job before anything starts."""

import pytest

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.plan import HostFacts
from tests.conftest import ALL_RECIPES, plan_of, run_cli


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_every_recipe_has_a_smoke_profile(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    assert len(cfg.smoke_profile) > 0, f"recipe {recipe} has no smoke_profile in conf/recipe/{recipe}.yaml"
    smoke = compose_config([f"recipe={recipe}", "smoke=true"])
    assert smoke.trainer.steps == 2 and any(c.startswith("trainer.steps:") for c in smoke.smoke_changes)


@pytest.mark.parametrize("overrides", [
    ["recipe=wide_deep", "placement.host_device_mix=1", "optimizer.target=CPU"],
    ["recipe=wide_deep", "zero.stage=3", "placement.offload_params=true", "precision=bf16"],
    ["recipe=gpt", "optimizer.target=CPU", "precision=bf16"],
    ["recipe=quickstart"],
])
def test_a_smoke_run_keeps_the_structure_of_the_real_run(overrides, cpu_host):
    real, smoke = plan_of(overrides, cpu_host), plan_of([*overrides, "smoke=true"], cpu_host)
    assert (smoke.engine, smoke.zero_stage, smoke.precision) == (real.engine, real.zero_stage, real.precision)
    assert [(t.name, t.location, t.optimizer) for t in smoke.placement.tables] == \
        [(t.name, t.location, t.optimizer) for t in real.placement.tables]
    assert (smoke.placement.optimizer_location, smoke.placement.param_location) == \
        (real.placement.optimizer_location, real.placement.param_location)
    assert smoke.steps == 2 and smoke.smoke and smoke.world_size == 2
    smaller = smoke.memory.host.total + smoke.memory.device.total, real.memory.host.total + real.memory.device.total
    assert smaller[0] < smaller[1] if overrides[0] != "recipe=quickstart" else smaller[0] == smaller[1]  # tiny already
    assert any("smoke=true" in n and "profile changed" in n for n in smoke.notes)


def test_the_users_overrides_win_over_the_profile(cpu_host):
    p = plan_of(["recipe=wide_deep", "smoke=true", "trainer.steps=3", "model.rows_per_table=50"], cpu_host)
    assert p.steps == 3 and p.model["rows_per_table"] == 50


def test_a_smoke_run_is_on_the_cpu_with_gloo_even_on_a_gpu_host():
    gpu_host = HostFacts(hostname="gpu", cpu_count=16, accelerators=8, extensions_dir="/x")
    p = plan_of(["recipe=quickstart", "smoke=true"], gpu_host)
    assert (p.device_type, p.backend, p.world_size) == ("cpu", "gloo", 2)
    assert all(r.device == "cpu" and r.env["DS_ACCELERATOR"] == "cpu" for r in p.ranks)
    assert plan_of(["recipe=quickstart", "cluster.nproc_per_node=2"], gpu_host).device_type == "cuda"


def test_smoke_is_for_recipes():
    with pytest.raises(ConfigError, match="smoke=true is for recipes"):
        compose_config(["script=train.py", "smoke=true"])


def test_check_plans_every_shipped_recipe_fast(tmp_path):
    import time

    t0 = time.monotonic()
    res = run_cli(["check"], tmp_path)
    assert res.returncode == 0, res.stderr
    # The whole command, Python start included: about 2 s here (resnet's pipeline imports torch to count its layers'
    # parameters on the meta device).
    assert time.monotonic() - t0 < 8
    for recipe in ALL_RECIPES:
        assert f"recipe={recipe}" in res.stdout
    assert not (tmp_path / "log_output").exists()


def test_check_expands_hydra_sweep_syntax(tmp_path, cli):
    res = cli(["check", "-m", "recipe=quickstart", "zero.stage=range(0,3)", "optimizer.lr=choice(0.1,0.2)"],
                  tmp_path)
    assert res.returncode == 0, res.stderr
    assert "6 job(s) plan" in res.stdout and "zero.stage=2 optimizer.lr=0.2" in res.stdout


def test_a_bad_value_in_a_later_job_fails_the_sweep_before_anything_starts(tmp_path, cli):
    res = cli(["-m", "recipe=quickstart", "smoke=true", "zero.stage=0,1,7"], tmp_path)
    assert res.returncode == 2
    assert "job 2 (recipe=quickstart smoke=True zero.stage=7): zero.stage=7 must be 0, 1, 2 or 3." in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_cfg_job_shows_the_smoke_config_a_run_gets(tmp_path, cli):
    res = cli(["recipe=wide_deep", "smoke=true", "--cfg", "job"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "  steps: 2\n" in res.stdout and "rows_per_table: 100\n" in res.stdout
    assert "- 'model.rows_per_table: 10000 -> 100'" in res.stdout
