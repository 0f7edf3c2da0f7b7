"""The parallel parts are a registry: each part one module of launcher/parallel/ that says what it can do, and the
choice a filter over what they say. No code outside that package compares a part's name as a string (the knowledge
of what a part can do has one owner)."""

from pathlib import Path

import pytest

from launcher.parallel import DATA_PARALLEL, PARTS, SLOTS
from launcher.parallel.registry import DCP, DataParallelPart
from tests.name_check import name_comparisons as comparisons

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, name) of every comparison (==, !=, in, match case) of a part's name as a string literal."""
    return comparisons(source, set(PARTS))


def test_the_check_finds_what_it_looks_for():
    assert name_comparisons("if plan.engine == 'deepspeed': pass") == [(1, "deepspeed")]
    assert name_comparisons("x = e in ('ddp', 'pipeline')") == [(1, "ddp"), (1, "pipeline")]
    assert name_comparisons("match e:\n    case 'fsdp':\n        pass") == [(2, "fsdp")]
    assert name_comparisons("names = ['ddp']\nd = {'ddp': 1}") == []  # naming is not comparing


def test_no_code_outside_the_parallel_package_compares_part_names():
    offenders = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        if (LAUNCHER / "parallel") in path.parents:
            continue
        offenders += [f"{path.relative_to(LAUNCHER.parent)}:{line}: {name}"
                      for line, name in name_comparisons(path.read_text())]
    assert not offenders, offenders


def test_every_part_says_what_the_plan_and_the_ranks_ask_of_it():
    assert [PARTS[n].slot for n in PARTS] == ["tensor_parallel", "recompute", "normalization", "data_parallel",
                                               "data_parallel", "data_parallel", "pipeline"]
    assert set(SLOTS) == {p.slot for p in PARTS.values()}
    for part in PARTS.values():
        for hook in ("problems", "config", "why", "apply"):
            assert callable(getattr(part, hook)), (part.name, hook)
        assert isinstance(part.dims, tuple) and part.checkpoint
    for name in DATA_PARALLEL:
        for hook in ("cannot", "zero_stage", "memory", "ops", "set_sync", "attach"):
            assert callable(getattr(PARTS[name], hook)), (name, hook)
    assert [n for n in DATA_PARALLEL if PARTS[n].checkpoint != DCP] == ["deepspeed"]


def test_a_part_without_an_answer_of_its_own_cannot_be_built():
    """part.py's protocols answer for a part only where a default answer exists; the rest are abstract."""
    class Half(DataParallelPart):
        name = "half"

        def config(self, i):
            return {}

        def why(self, i):
            return "half a part"

        def apply(self, chunks, rt):
            pass

    with pytest.raises(TypeError, match="cannot|zero_stage|locations|memory"):
        Half()
    assert PARTS["ddp"].shard_ways(None) == 1 and PARTS["ddp"].ops(None) == ()  # the defaults a part inherits
