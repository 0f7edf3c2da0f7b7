"""A sweep's jobs: the cartesian product of its swept overrides, read with Hydra's public override parser (the basic
sweeper's semantics, without its private class)."""

import pytest

from launcher.errors import ConfigError
from launcher.launch.sweep import expand_jobs


def test_every_combination_in_the_order_the_keys_came():
    assert expand_jobs(["recipe=quickstart", "zero.stage=0,1", "trainer.seed=range(1,3)"]) == [
        ["recipe=quickstart", "zero.stage=0", "trainer.seed=1"], ["recipe=quickstart", "zero.stage=0", "trainer.seed=2"],
        ["recipe=quickstart", "zero.stage=1", "trainer.seed=1"], ["recipe=quickstart", "zero.stage=1", "trainer.seed=2"]]
    assert expand_jobs(["a=choice(x,y)", "+b=1"]) == [["a=x", "+b=1"], ["a=y", "+b=1"]]
    assert expand_jobs(["a=1", "a=2,3"]) == [["a=2"], ["a=3"]]  # a later override of a key: its values, first place
    assert expand_jobs([]) == [[]]


def test_a_sweep_without_a_list_of_values_is_refused_with_the_forms_it_takes():
    with pytest.raises(ConfigError, match=r"lr=interval\(0,1\) is a range to search, not a list of values\. A sweep takes key=a,b, key=range"):
        expand_jobs(["lr=interval(0,1)"])
    with pytest.raises(ConfigError, match=r"could not expand the sweep: .*A sweep takes key=a,b"):
        expand_jobs(["a=[1,2"])
