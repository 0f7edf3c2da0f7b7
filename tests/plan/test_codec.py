"""plan.json round-trips through the one generic codec (launcher/codec.py): every real plan shape, written as the
launcher writes it (asdict, then JSON) and read as a rank reads it, is the plan it was; and the codec rebuilds what
JSON flattens (tuples, nested dataclasses, optional ones) by the field types alone."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from launcher.codec import from_plain
from launcher.plan import LaunchPlan
from launcher.plan.types import HostFacts
from tests.conftest import plan_of

PLANS = {
    "quickstart": ["recipe=quickstart"],
    "wide_deep, tables on the host": ["recipe=wide_deep", "placement.host_device_mix=1"],
    "gpt, a 2-stage pipeline": ["recipe=gpt", "parallel.pipeline_stages=2", "batch.micro_batches=4"],
    "quickstart, op sharding tp 4": ["recipe=quickstart", "cluster.nproc_per_node=4", "batch.micro_size=8",
                                   "parallel.sharding={fc1: [[1,1],[1,4]]}"],
}


@pytest.mark.parametrize("overrides", PLANS.values(), ids=PLANS.keys())
def test_a_plan_read_back_from_its_json_is_the_plan(overrides):
    host = HostFacts(hostname="h", cpu_count=8, accelerators=0, extensions_dir="/x")
    plan = plan_of(overrides, host)
    read = LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert read == plan
    assert read.to_dict() == plan.to_dict()
    assert isinstance(read.ranks, tuple) and isinstance(read.parts[0].dims, tuple)


def test_the_plans_cover_the_optional_parts():
    host = HostFacts(hostname="h", cpu_count=8, accelerators=0, extensions_dir="/x")
    plans = [plan_of(o, host) for o in PLANS.values()]
    assert any(p.pipeline is not None for p in plans) and any(p.sharding is not None for p in plans)
    assert any(t.location == "host" for p in plans for t in p.placement.tables)
    assert all(p.peak is not None and p.budget is not None for p in plans)


@dataclass(frozen=True)
class Inner:
    pair: tuple[float, float]
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outer:
    inner: Inner
    maybe: Inner | None = None
    many: tuple[Inner, ...] = ()
    by_name: dict[str, Inner] = field(default_factory=dict)
    free: dict[str, Any] = field(default_factory=dict)
    number: int | str = 0


def test_the_codec_rebuilds_what_json_flattens():
    plain = {"inner": {"pair": [1.0, 2.0], "names": ["a"]}, "maybe": None, "many": [{"pair": [3, 4]}],
             "by_name": {"x": {"pair": [5, 6]}}, "free": {"k": [1, 2]}, "number": "auto"}
    assert from_plain(Outer, plain) == Outer(Inner((1.0, 2.0), ("a",)), None, (Inner((3, 4)),),
                                             {"x": Inner((5, 6))}, {"k": [1, 2]}, "auto")
    assert from_plain(Outer, {"inner": {"pair": [0, 0]}, "maybe": {"pair": [1, 1]}}).maybe == Inner((1, 1))
    with pytest.raises(TypeError, match="unexpected keyword argument 'typo'"):
        from_plain(Outer, {"inner": {"pair": [0, 0]}, "typo": 1})
