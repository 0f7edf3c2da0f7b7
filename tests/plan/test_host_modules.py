"""placement.modules as planned: modules resolved by path or glob against the model's modules, their bytes on the
host and out of what the parts train, and every way of asking that cannot work refused before launch."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError
from tests.conftest import plan_of
from tests.usercode.readme_project import write_project


def test_the_seeds_network_puts_its_three_dense_layers_on_the_host(cpu_host):
    assert plan_of(["recipe=mnist_mlp"], cpu_host).placement.modules == ()  # device is the default
    p = plan_of(["recipe=mnist_mlp", "+placement.modules={dense*: host}"], cpu_host)
    assert [(m.name, m.params) for m in p.placement.modules] == [("dense1", 784 * 512 + 512),
                                                               ("dense2", 512 * 512 + 512), ("dense3", 512 * 10 + 10)]
    n = sum(m.params for m in p.placement.modules)
    assert p.placement.dense_params == 0 and p.memory.params == n
    assert (p.memory.host.params, p.memory.host.grads, p.memory.host.optimizer) == (4 * n, 4 * n, 0)  # SGD: no state
    assert p.memory.device.params == 0


def test_globs_nesting_and_device_entries(cpu_host):
    adam = plan_of(["recipe=mnist_mlp", "optimizer.name=adam", "+placement.modules={dense*: host, dense1: device, "
                                                                   "dense2: device}"], cpu_host)
    assert [m.name for m in adam.placement.modules] == ["dense3"]
    assert adam.memory.host.optimizer == 2 * 4 * (512 * 10 + 10)  # Adam: two states per parameter
    assert adam.placement.dense_params == 784 * 512 + 512 + 512 * 512 + 512
    wd = plan_of(["recipe=wide_deep", "+placement.modules={mlp: host, mlp.*: host, wide_dense: device}"], cpu_host)
    assert [m.name for m in wd.placement.modules] == ["mlp"]  # mlp.0, mlp.2 ... are inside it
    glob = plan_of(["recipe=wide_deep", "+placement.modules={mlp.*: host}"], cpu_host)
    assert [m.name for m in glob.placement.modules] == ["mlp.0", "mlp.2", "mlp.4"]


def test_a_submodule_of_your_own_model_from_yaml(tmp_path, cpu_host):
    project = write_project(tmp_path)
    (project / "conf" / "recipe" / "my_ctr_host.yaml").write_text(
        (project / "conf" / "recipe" / "my_ctr.yaml").read_text().replace("recipe: {name: my_ctr}",
                                                                           "recipe: {name: my_ctr_host}")
        + "placement:\n  modules: {mlp.0: host}\n")
    p = plan_of(["recipe=my_ctr_host"], cpu_host, config_dir=str(project / "conf"))
    assert [(m.name, m.params) for m in p.placement.modules] == [("mlp.0", (2 * 16 + 4) * 64 + 64)]
    assert any("mlp.0 (2,368 parameters) on the host" in n for n in p.notes)
    with pytest.raises(ConfigError, match=r"placement.modules.head=host: no module of the model is at 'head'. Its "
                                          r"modules with parameters: mlp, mlp.0, mlp.2"):
        plan_of(["recipe=my_ctr_host", "+placement.modules.head=host"], cpu_host, config_dir=str(project / "conf"))


@pytest.mark.parametrize("more, says", [
    (["+placement.modules.dense9=host"], "placement.modules.dense9=host: no module of the model is at 'dense9'"),
    (["+placement.modules.dense1=cpu"], "placement.modules.dense1=cpu is not one of host, device"),
    (["trainer.grad_clip=1.0"], "with trainer.grad_clip=1.0: gradient clipping"),
])
def test_what_cannot_work_is_refused_naming_the_key(cpu_host, more, says):
    with pytest.raises(ConfigError) as e:
        plan_of(["recipe=mnist_mlp", "+placement.modules={dense2: host}", *more], cpu_host)
    assert says in str(e.value), str(e.value)


def test_a_recipe_that_does_not_name_its_modules_refuses_them(cpu_host):
    with pytest.raises(ConfigError, match="recipe gpt does not name its modules"):
        plan_of(["recipe=gpt", "+placement.modules={blocks: host}"], cpu_host)


def test_placement_auto_puts_the_largest_layer_on_the_host_when_nothing_else_fits(cpu_host):
    """SGD keeps no state to offload: at 4 MB the device holds no layout of the whole network (ZeRO-3 on FSDP2, the
    closest, needs 4.8 MB), and without dense1 (1.6 MB of weights) it peaks at 3.3 MB."""
    p = plan_of(["recipe=mnist_mlp", "placement=auto", "cluster.device_memory_gb=0.004"], cpu_host)
    assert [m.name for m in p.placement.modules] == ["dense1"] and p.auto["placement.modules"] == {"dense1": "host"}
    assert p.peak.peak("device") <= p.budget.device_usable
    said = [d for d in p.decisions if d.startswith("dense1 -> host (placement.modules): no layout fits")]
    assert said and "the closest, zero.stage=3" in said[0], p.decisions
    roomy = plan_of(["recipe=mnist_mlp", "placement=auto", "cluster.device_memory_gb=1"], cpu_host)
    assert roomy.placement.modules == ()  # what fits without never moves a dense module
    yours = plan_of(["recipe=mnist_mlp", "placement=auto", "cluster.device_memory_gb=0.005",
                     "+placement.modules={dense1: device}"], cpu_host)  # yours stays: auto takes the next largest
    assert [m.name for m in yours.placement.modules] == ["dense2"]
