"""The ranks' allocator (launcher.malloc, launcher/plan/malloc.py): tcmalloc preloaded where the host has it, the
user's own LD_PRELOAD or glibc settings kept, an impossible choice refused before launch; and the host's libraries
found where torch's CPU launcher and Debian put them (launcher/facts/malloc.py)."""

import dataclasses

import pytest

from launcher.backends import BACKENDS
from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.facts.malloc import find_allocators, glibc_settings
from launcher.parallel import RULES
from launcher.plan.malloc import plan_malloc, preloaded
from launcher.plan.script import plan_script
from tests.conftest import plan_of

TC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
LIBS = (("tcmalloc", TC),)


def test_auto_preloads_tcmalloc_where_the_host_has_it_ahead_of_the_users_other_preloads():
    env, note, problems = plan_malloc("auto", LIBS, "", ())
    assert env == {"LD_PRELOAD": TC} and not problems and TC in note
    env, _, _ = plan_malloc("auto", LIBS, "/opt/libfoo.so", ())
    assert env == {"LD_PRELOAD": f"{TC}:/opt/libfoo.so"}  # the user's other libraries stay, after it


@pytest.mark.parametrize("choice", ["auto", "glibc"])
def test_glibc_without_tcmalloc_or_when_asked_or_when_the_user_configured_glibc(choice):
    assert plan_malloc(choice, (), "", ())[0] == {}
    assert plan_malloc("glibc", LIBS, "", ())[0] == {}
    env, note, problems = plan_malloc("auto", LIBS, "", ("MALLOC_ARENA_MAX",))
    assert env == {} and not problems and "MALLOC_ARENA_MAX" in note
    assert "libtcmalloc-minimal4" in plan_malloc("auto", (), "", ())[1]  # how to get the faster one


def test_the_users_preloaded_allocator_is_kept_and_a_choice_against_it_refused():
    je = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    env, note, problems = plan_malloc("auto", LIBS, je, ())
    assert env == {} and "jemalloc" in note and not problems
    _, _, problems = plan_malloc("tcmalloc", LIBS, je, ())
    assert len(problems) == 1 and "launcher.malloc=tcmalloc" in problems[0] and je in problems[0]
    assert plan_malloc("tcmalloc", LIBS, TC, ())[2] == []  # the same allocator: nothing to refuse


def test_tcmalloc_asked_for_on_a_host_without_it_and_an_unknown_name_are_refused_with_a_fix():
    problems = plan_malloc("tcmalloc", (), "", ())[2]
    assert len(problems) == 1 and "apt-get install libtcmalloc-minimal4" in problems[0]
    problems = plan_malloc("tcmallocc", LIBS, "", ())[2]
    assert problems and "launcher.malloc=tcmallocc is not one of auto, tcmalloc, glibc" in problems[0]


def test_preloaded_reads_library_names_not_folders():
    assert preloaded("/opt/tcmalloc/lib/libfoo.so") == ""
    assert preloaded("libfoo.so /usr/lib/libjemalloc.so.2") == "jemalloc"  # ld.so splits on spaces too
    assert preloaded("") == ""


def test_a_recipes_ranks_get_tcmalloc_and_a_scripts_when_asked(cpu_host, tmp_path):
    host = dataclasses.replace(cpu_host, malloc_libs=LIBS)
    plan = plan_of(["recipe=quickstart"], host)
    assert [r.env["LD_PRELOAD"] for r in plan.ranks] == [TC, TC]
    assert any(n.startswith("malloc: every rank preloads tcmalloc") for n in plan.notes)
    assert all("LD_PRELOAD" not in r.env for r in plan_of(["recipe=quickstart", "launcher.malloc=glibc"], host).ranks)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")

    def script_plan(overrides, on):
        return plan_script(compose_config([f"script={script}", *overrides]), on, backends=tuple(BACKENDS.values()),
                           parts=RULES)
    plan = script_plan([], host)  # a script keeps what `python script.py` has, unless asked
    assert all("LD_PRELOAD" not in r.env for r in plan.ranks) and any("script's ranks keep" in n for n in plan.notes)
    plan = script_plan(["launcher.malloc=tcmalloc"], host)
    assert [r.env["LD_PRELOAD"] for r in plan.ranks] == [TC] * plan.world_size
    with pytest.raises(ConfigError, match="launcher.malloc=tcmalloc, but this host has no tcmalloc"):
        script_plan(["launcher.malloc=tcmalloc"], cpu_host)


def test_the_host_facts_find_an_installed_library_best_first(tmp_path):
    full, minimal = tmp_path / "a", tmp_path / "b"
    full.mkdir()
    minimal.mkdir()
    (full / "libtcmalloc.so.4").write_bytes(b"")
    assert find_allocators([full, minimal]) == (("tcmalloc", str(full / "libtcmalloc.so.4")),)
    (minimal / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert find_allocators([full, minimal]) == (("tcmalloc", str(minimal / "libtcmalloc_minimal.so.4")),)
    assert find_allocators([tmp_path / "none"]) == ()
    assert glibc_settings({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PATH": "/bin"}) == ("GLIBC_TUNABLES",)
