"""Hostile input: every bad override exits 2 with one paragraph naming the key, before anything exists.

A property test draws bad overrides over every section of the config (unknown keys, also with + and ++, near-miss
spellings, wrong types, out-of-range and non-finite numbers, impossible splits, bad enum values, bad paths and
names) and runs the CLI in-process on each. Every generator yields values known to be invalid: an accepted one is a
validation hole (fixed in launcher/) or a wrong generator (fixed here). Launching is guarded: reaching launch_run,
writing a dry run or starting a process fails the test instead of running anything.
"""

from __future__ import annotations

import string
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import launcher.launch
import launcher.facts.host
from launcher.cli import main
from launcher.plan import HostFacts
from launcher.plan.rules import check_output
from omegaconf import OmegaConf

EXAMPLES = 200


@dataclass(frozen=True)
class Bad:
    """One bad input: ``line`` as typed on the command line (after ``extra``), and the key its message must name."""

    section: str
    recipe: str
    line: str
    names: str
    extra: tuple[str, ...] = ()

    def argv(self, log_dir: Path) -> list[str]:
        recipe = [f"recipe={self.recipe}"] if self.recipe else []
        return [*recipe, f"output.log_dir={log_dir}", *self.extra, self.line]


def _q(text: str) -> str:
    """A string in Hydra's quoted override grammar."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---- value generators: each yields override values (as typed) that are invalid for its kind of key ----

_WORDS = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True).filter(
    lambda w: w not in ("true", "false", "null", "nan", "inf", "on", "off", "yes", "no"))
NOT_INT = st.sampled_from(["abc", "1.5", "-2.5", "[1,2]", "{a:1}", "true", "1e3x", "null", "''"])
NOT_FLOAT = st.sampled_from(["abc", "[0.1]", "{a:1}", "true", "null", "1..2", "''"])
NOT_BOOL = st.sampled_from(["maybe", "2", "-1", "1.5", "[true]", "{a:1}", "null", "truee"])
NOT_A_NAME = ["1", "-3", "2.5", "true", "false"]
"""Values Hydra reads as a number or a boolean, not a name (of a config group's option)."""
NON_FINITE = st.sampled_from(["nan", "inf", "-inf", "1e400", "-1e400"])
HUGE_INT = st.sampled_from([str(2**64), str(10**30), str(-(2**64))])


def ints_below(low: int) -> st.SearchStrategy[str]:
    """Integers < low (also huge negative ones), and values that are not integers at all."""
    return st.one_of(st.integers(min_value=-10**6, max_value=low - 1).map(str), st.just(str(-(10**30))), NOT_INT)


def count_below(low: int, sentinel: int | None = None) -> st.SearchStrategy[str]:
    """ints_below(low), skipping an allowed sentinel (-1 = infer)."""
    ints = st.integers(min_value=-10**6, max_value=low - 1).filter(lambda v: v != sentinel).map(str)
    return st.one_of(ints, NOT_INT)


def floats_outside(rule: str) -> st.SearchStrategy[str]:
    """Floats outside ``rule`` (positive, non_negative, non_positive, unit), non-finite ones and non-numbers."""
    bad = {"positive": st.floats(max_value=0, allow_nan=False), "non_negative": st.floats(max_value=-1e-9,
           allow_nan=False), "non_positive": st.floats(min_value=1e-9, allow_nan=False, allow_infinity=False),
           "unit": st.one_of(st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False),
                             st.floats(min_value=1.0, allow_nan=False, allow_infinity=False))}[rule]
    return st.one_of(bad.filter(lambda v: v == v and abs(v) < 1e300).map(repr), NON_FINITE, NOT_FLOAT)


def enum_outside(valid: tuple[str, ...], case_insensitive: bool = False) -> st.SearchStrategy[str]:
    fold = (lambda s: s.lower()) if case_insensitive else (lambda s: s)
    near = [v[:-1] for v in valid if len(v) > 1] + [v + "x" for v in valid] + [v.upper() for v in valid
                                                                                if not case_insensitive]
    ok = {fold(v) for v in valid}
    return st.one_of(_WORDS, st.sampled_from(near), st.just("[a,b]")).filter(lambda w: fold(w) not in ok)


# ---- the config's keys: (section, recipe, key, bad values, extra overrides, the key the message names) ----

Q, GPT, WD, RN = "quickstart", "gpt", "wide_deep", "resnet"
VALUE_CASES: list[tuple[str, str, str, st.SearchStrategy[str], tuple[str, ...], str | None]] = [
    # trainer
    ("trainer", Q, "trainer.steps", ints_below(1), (), None),
    ("trainer", Q, "trainer.log_every", ints_below(1), (), None),
    ("trainer", Q, "trainer.checkpoint_every", ints_below(-1), (), None),
    ("trainer", Q, "trainer.epochs", st.one_of(floats_outside("non_negative"), st.just("1e300")), (), None),
    ("trainer", Q, "trainer.seed", st.one_of(HUGE_INT, st.integers(max_value=-1).map(str), NOT_INT), (), None),
    ("trainer", Q, "trainer.resume_from", st.sampled_from(["/nonexistent/ckpt/step3", "no/such/dir", ".", "/"]),
     (), None),
    # eval
    ("eval", Q, "eval.every", ints_below(0), (), None),
    ("eval", Q, "eval.batches", ints_below(0), (), None),
    ("eval", Q, "eval.max_batches", ints_below(0), (), None),
    ("eval", Q, "eval.metrics", enum_outside(("auto", "loss", "binary")), (), None),
    # batch
    ("batch", Q, "batch.global_size", count_below(1, -1), (), None),
    ("batch", Q, "batch.micro_size", count_below(1, -1), (), None),
    ("batch", Q, "batch.grad_accum", count_below(1, -1), (), None),
    ("batch", Q, "batch.micro_batches", count_below(1, -1), (), None),
    ("batch", Q, "batch.global_size", st.sampled_from(["3", "5", "7", "9", "18"]), ("batch.micro_size=4",),
     "batch"),  # global not micro × accum × dp
    ("batch", Q, "batch.micro_size", st.sampled_from(["33", "1000", str(10**9)]), (), "batch.micro_size"),
    # parallel
    ("parallel", Q, "parallel.dp", count_below(1, -1), (), None),
    ("parallel", Q, "parallel.dp", st.sampled_from(["3", "4", "5", "64"]), (), "parallel.dp"),
    ("parallel", Q, "parallel.tp", ints_below(1), (), None),
    ("parallel", Q, "parallel.tp", st.sampled_from(["3", "5", "7"]), (), "tp"),
    ("parallel", Q, "parallel.pipeline_stages", ints_below(1), (), None),
    ("parallel", Q, "parallel.pipeline_stages", st.sampled_from(["3", "5"]), (), "pipeline_stages"),
    ("parallel", GPT, "parallel.tp", st.just("4"), ("cluster.nproc_per_node=4", "model.heads=2"), "parallel.tp"),
    ("parallel", Q, "parallel.data_parallel", enum_outside(("auto", "ddp", "fsdp", "deepspeed")), (), None),
    ("parallel", Q, "parallel.schedule", enum_outside(("1f1b", "gpipe", "interleaved_1f1b")), (), None),
    ("parallel", GPT, "parallel.stages_per_rank", ints_below(1), ("parallel.pipeline_stages=2",
                                                                  "parallel.schedule=interleaved_1f1b"), None),
    ("parallel", RN, "parallel.partition", enum_outside(("parameters", "uniform")), ("parallel.stages={}",), None),
    ("parallel", Q, "parallel.search_mode", enum_outside(("sharding_propagation",)), (), None),
    ("parallel", RN, "parallel.stages.fc", st.sampled_from(["2", "-1", "7"]), (), "parallel.stages"),
    ("parallel", Q, "parallel.sharding.fc1", st.sampled_from(["[[3,1],[1,1]]", "[[0,1],[1,1]]", "[[2]]", "abc",
                                                              "[[-2,1],[1,1]]"]), (), "parallel.sharding"),
    ("parallel", Q, "parallel.sharding.nosuchop", st.just("[[2,1],[1,1]]"), (), "nosuchop"),
    # zero
    ("zero", Q, "zero.stage", st.one_of(st.integers(min_value=4, max_value=10**6).map(str),
                                         st.integers(max_value=-1).map(str), NOT_INT), (), None),
    # placement
    ("placement", WD, "placement.host_device_mix", st.one_of(st.integers(min_value=2).map(str),
                                                               st.integers(max_value=-1).map(str), NOT_INT), (), None),
    ("placement", Q, "placement.offload_params", NOT_BOOL, (), None),
    ("placement", Q, "placement.pin_memory", enum_outside(("auto", "true", "false"), case_insensitive=True), (),
     None),
    ("placement", WD, "placement.tables.deep_embedding", enum_outside(("host", "device")), (), None),
    ("placement", Q, "placement.tables.nosuch", st.sampled_from(["host", "device"]), (), "placement.tables.nosuch"),
    ("placement", Q, "placement.offload_params", st.just("true"), (), None),  # needs zero.stage=3
    ("placement", WD, "placement.prefetch", st.one_of(st.integers(min_value=9).map(str),
                                                        st.integers(max_value=-1).map(str), NOT_INT),
     ("placement.host_device_mix=1",), None),
    ("placement", Q, "placement.prefetch", st.sampled_from(["1", "2"]), (), None),  # no host table: would do nothing
    # precision
    ("precision", Q, "precision", enum_outside(("fp32", "bf16", "fp16")), (), None),
    ("precision", Q, "precision", st.just("fp16"), ("smoke=false", "cluster.device=cpu"), None),
    # cluster
    ("cluster", Q, "cluster.nnodes", st.one_of(st.integers(min_value=2).map(str), ints_below(1)), (), None),
    ("cluster", Q, "cluster.node_rank", st.one_of(st.integers(min_value=1).map(str),
                                                   st.integers(max_value=-1).map(str), NOT_INT), (), None),
    ("cluster", Q, "cluster.nproc_per_node", st.one_of(st.integers(max_value=0).map(str), NOT_INT,
                                                        st.sampled_from(["autos", "AUTO", "1.0", "0x2"])), (), None),
    ("cluster", Q, "cluster.master_port", st.one_of(st.integers(min_value=65536).map(str),
                                                     st.integers(max_value=-1).map(str), NOT_INT), (), None),
    ("cluster", Q, "cluster.backend", enum_outside(("auto", "gloo", "nccl")), (), None),
    ("cluster", Q, "cluster.backend", st.just("nccl"), (), None),  # no CUDA device on this (guarded) host
    ("cluster", Q, "cluster.device", enum_outside(("auto", "cpu", "cuda")), (), None),
    ("cluster", Q, "cluster.device", st.just("cuda"), (), None),
    # output
    ("output", Q, "output.stderr_tail", ints_below(0), (), None),
    # debug
    ("debug", Q, "debug.fail_rank", st.one_of(ints_below(-1), st.integers(min_value=2, max_value=10**6).map(str)),
     (), None),
    ("debug", Q, "debug.fail_step", ints_below(-1), (), None),
    # launcher
    ("launcher", Q, "launcher.watchdog_s", floats_outside("non_negative"), (), None),
    ("launcher", Q, "launcher.max_restarts", ints_below(0), (), None),
    ("trainer", Q, "trainer.resume", st.sampled_from(["latest", "/nonexistent/run", "no/such/run", "."]), (), None),
    # optimizer
    ("optimizer", Q, "optimizer.name", enum_outside(("sgd", "momentum", "adam", "adamw")), (), None),
    ("optimizer", Q, "optimizer.lr", floats_outside("positive"), (), None),
    ("optimizer", Q, "optimizer.momentum", floats_outside("non_negative"), (), None),
    ("optimizer", Q, "optimizer.eps", floats_outside("positive"), (), None),
    ("optimizer", Q, "optimizer.weight_decay", floats_outside("non_negative"), (), None),
    ("optimizer", Q, "optimizer.betas", st.sampled_from(["[0.9]", "[0.9,0.99,0.999]", "[]", "[1.0,0.9]", "[0.9,-0.1]",
                                                         "[nan,0.9]", "[0.9,inf]", "[a,b]", "0.9"]), (), None),
    ("optimizer", Q, "optimizer.target", enum_outside(("device", "cpu"), case_insensitive=True), (), None),
    ("optimizer", Q, "optimizer.cpu_impl", enum_outside(("torch", "deepspeed")), (), None),
    # tables (wide_deep has two: deep_embedding (lazy_adam), wide_embedding (ftrl))
    ("tables", WD, "tables.deep_embedding.optimizer",
     enum_outside(("lazy_adam", "sparse_adam", "ftrl", "sgd", "momentum", "dense")), (), None),
    ("tables", WD, "tables.deep_embedding.lr", floats_outside("positive"), (), None),
    ("tables", WD, "tables.deep_embedding.eps", floats_outside("positive"), (), None),
    ("tables", WD, "tables.deep_embedding.betas", st.sampled_from(["[1.5,0.9]", "[0.9,nan]", "[-0.1,0.9]"]), (),
     None),
    ("tables", WD, "tables.wide_embedding.l1", floats_outside("non_negative"), (), None),
    ("tables", WD, "tables.wide_embedding.l2", floats_outside("non_negative"), (), None),
    ("tables", WD, "tables.wide_embedding.lr_power", floats_outside("non_positive"), (), None),
    ("tables", WD, "tables.wide_embedding.initial_accumulator", floats_outside("positive"), (), None),
    ("tables", Q, "tables.nosuch.lr", st.just("0.1"), (), "tables.nosuch"),
    # model and data, per recipe
    ("model", Q, "model.hidden", ints_below(1), (), None),
    ("model", Q, "model.in_features", ints_below(1), (), None),
    ("model", GPT, "model.heads", st.sampled_from(["3", "5", "7", "0", "-2"]), (), None),
    ("model", GPT, "model.layers", ints_below(1), (), None),
    ("model", GPT, "model.seq_len", ints_below(3), (), None),
    ("model", GPT, "model.mlp_ratio", ints_below(1), (), None),
    ("model", GPT, "model.vocab_size", ints_below(1), (), None),
    ("model", GPT, "model.dropout", floats_outside("unit"), (), None),
    ("model", GPT, "model.tie_head", NOT_BOOL, (), None),
    ("model", WD, "model.embed_dim", ints_below(1), (), None),
    ("model", WD, "model.hidden", st.sampled_from(["[0]", "[16,-1]", "[a]", "5"]), (), None),
    ("model", WD, "model.num_sparse", ints_below(1), (), None),
    ("model", RN, "model.width", ints_below(1), (), None),
    ("model", RN, "model.blocks", st.sampled_from(["[1,1]", "[1,1,1,0]", "[1,1,1,1,1]", "[]"]), (), None),
    ("model", RN, "model.classes", ints_below(2), (), None),
    ("data", Q, "data.samples", ints_below(16), (), None),
    ("data", Q, "data.in_features", st.sampled_from(["7", "33", "0"]), (), None),
    ("data", Q, "data.seed", st.one_of(HUGE_INT, st.integers(max_value=-1).map(str)), (), None),
    ("data", GPT, "data.candidates", st.one_of(ints_below(1), st.sampled_from(["33", "1000"])), (), None),
    ("data", GPT, "data.skew", floats_outside("non_negative"), (), None),
    ("data", RN, "data.image_size", ints_below(1), (), None),
    ("data", RN, "data.noise", floats_outside("non_negative"), (), None),
    ("data", WD, "data", st.just("tabular"), ("data.path=/nonexistent/file.csv", "data.label=y", "data.positive=1"),
     "data.path"),
    # the root
    ("root", Q, "recompute", st.sampled_from(["[nosuch]", "[fc1,fc9]", "[ALL]"]), (), "recompute"),
    ("root", Q, "smoke", NOT_BOOL, (), None),
    ("root", Q, "dry_run", NOT_BOOL, (), None),
    ("root", Q, "recipe", st.sampled_from(["quickstrat", "../quickstart", "quickstart/..", "QUICKSTART", "x"]), (),
     "recipe"),
    ("root", Q, "parallel", st.sampled_from(["semi_autp", "nosuch"]), (), "parallel"),
    # a config group takes one option by name: not null, a number, a boolean, a list or a mapping (Hydra raised
    # there), nor another recipe's data
    ("root", "", "recipe", st.sampled_from(["null", "[quickstart]", "{a:1}", "[]", *NOT_A_NAME]), (), "recipe"),
    ("root", Q, "parallel", st.sampled_from(["null", "[semi_auto]", "{a:1}", *NOT_A_NAME]), (), "parallel"),
    ("root", Q, "placement", st.sampled_from(["null", "[auto]", "{a:1}", *NOT_A_NAME]), (), "placement"),
    ("data", WD, "data", st.sampled_from(["null", "[tabular]", "{a:1}", "markov", "images", *NOT_A_NAME]), (), "data"),
    ("data", GPT, "data", st.sampled_from(["null", "tabular", "[markov]", "synthetic_ctr", *NOT_A_NAME]), (), "data"),
    # a section of keys takes its keys one at a time, not a single value (model=foo failed on an interpolation
    # into it; trainer=5 got Hydra's "int is not a subclass of TrainerConfig")
    *(("root", Q, section, st.sampled_from(["foo", "[1,2]", *NOT_A_NAME]), (), section)
      for section in ("model", "trainer", "optimizer", "batch", "eval", "cluster", "zero", "parallel.stages")),
    ("root", Q, "recipe.name", _WORDS.filter(lambda w: w != "quickstart"), (), None),
    ("root", "", "script", st.sampled_from(["/nonexistent/train.py", "no_such.py", "/", "."]), (), None),
    ("root", "", "script", st.just("/nonexistent/train.py"), ("smoke=true",), "smoke"),
]


def _value_case(section, recipe, key, values, extra, names) -> st.SearchStrategy[Bad]:
    prefix = st.sampled_from(["", "", "++"]) if key not in ("recipe", "parallel", "placement", "data") else st.just("")
    return st.builds(lambda p, v: Bad(section, recipe, f"{p}{key}={v}", names or key, extra), prefix, values)


# ---- unknown keys: invented, near misses of real keys, with and without + / ++ ----

def _schema_keys() -> dict[str, list[str]]:
    """Dotted keys of each typed section of quickstart's config (open dicts and lists left out)."""
    from launcher.config import compose_config

    cfg = compose_config(["recipe=quickstart"])
    keys: dict[str, list[str]] = {}
    for section in ("trainer", "eval", "batch", "parallel", "zero", "placement", "cluster", "output", "debug",
                    "launcher", "optimizer", "model", "data", "recipe", "loss"):
        keys[section] = [f"{section}.{k}" for k in cfg[section].keys() if k not in ("stages", "sharding", "tables")]
    keys["root"] = [k for k in cfg.keys() if not OmegaConf.is_dict(cfg[k])]
    return keys


def _near_misses(key: str) -> st.SearchStrategy[str]:
    """A one-letter edit of the key's last part (dropped, doubled, swapped or changed)."""
    head, _, leaf = key.rpartition(".")

    def edit(kind: int, i: int, c: str) -> str:
        i %= len(leaf)
        new = [leaf[:i] + leaf[i + 1:], leaf[:i] + leaf[i] + leaf[i:], leaf[:i] + c + leaf[i + 1:],
               leaf[:i] + leaf[i + 1:i + 2] + leaf[i] + leaf[i + 2:]][kind]
        return f"{head}.{new}" if head else new

    return st.builds(edit, st.integers(0, 3), st.integers(0, 40), st.sampled_from(string.ascii_lowercase + "_"))


def unknown_keys(keys: dict[str, list[str]]) -> dict[str, st.SearchStrategy[Bad]]:
    """Per section: a key it does not have (invented, or one letter off a real one), plain or with + / ++."""
    known = {k for ks in keys.values() for k in ks} | {"data", "model", "tables", "parallel", "recipe", "loss", "eval",
                                                        "trainer", "batch", "zero", "placement", "cluster", "output",
                                                        "debug", "optimizer", "smoke_profile", "eval_data"}
    out = {}
    for section, ks in keys.items():
        near = st.sampled_from(ks).flatmap(_near_misses)
        invented = _WORDS.map(lambda w, s=section: w if s == "root" else f"{s}.{w}")
        out[section] = st.builds(
            lambda p, k, v, s=section: Bad(s, Q, f"{p}{k}={v}", k),
            st.sampled_from(["", "+", "++"]), st.one_of(near, invented).filter(lambda k: k not in known
                                                                               and k.rpartition(".")[2]),
            st.sampled_from(["1", "abc", "0.5", "[1,2]"]))
    return out


# ---- bad run names: output.run_name is one folder name inside output.log_dir ----

BAD_RUN_NAMES = ["/", "..", ".", "../x", "a/../../b", "a/b", "/tmp/escape", "latest", " ", "  x", "-rf", ".hidden",
                 "x" * 256, "a\tb", "a\nb", "a\x01b", "a\x7fb", "na\u00efve", "a b", "run*", "~", "~/x", "a\\b",
                 "C:x", "..."]


def run_names() -> st.SearchStrategy[Bad]:
    fixed = st.sampled_from(BAD_RUN_NAMES)
    drawn = st.text(alphabet=string.printable + "\u00e9\u4e00", min_size=1, max_size=20).filter(
        lambda s: check_output(OmegaConf.create({"run_name": s})) != [] and s.strip() != "" and "\x0b" not in s
        and "\x0c" not in s and "\r" not in s)
    long = st.integers(min_value=201, max_value=400).map(lambda n: "r" * n)
    return st.builds(lambda n: Bad("output", Q, f"output.run_name={_q(n)}", "output.run_name"),
                     st.one_of(fixed, drawn, long))


def bad_inputs() -> st.SearchStrategy[Bad]:
    """A section first (each about as likely), then one of its bad values or unknown keys."""
    by_section: dict[str, list[st.SearchStrategy[Bad]]] = {}
    for case in VALUE_CASES:
        by_section.setdefault(case[0], []).append(_value_case(*case))
    for section, strategy in unknown_keys(_schema_keys()).items():
        by_section.setdefault(section, []).append(strategy)
    by_section["output"].append(run_names())
    return st.sampled_from(sorted(by_section)).flatmap(lambda s: st.one_of(by_section[s]))


# ---- running the CLI on one bad input, guarded ----

class Launched(BaseException):
    """Raised by the guards: bad input got as far as launching."""


def _children() -> set[str]:
    """This process's children but the warm start's forkserver, which an earlier in-process run may have left for
    the next one (tests/conftest.py _run_here)."""
    from launcher.backends.warm_start import forkserver_pid

    out = set()
    for f in Path("/proc/self/task").glob("*/children"):
        out |= set(f.read_text().split())
    return out - {str(forkserver_pid())}


@pytest.fixture
def guarded(monkeypatch):
    """Nothing can start: launch_run, write_dry_run and subprocess.Popen raise Launched; the host is a 2-core CPU
    host with no accelerator (no probe of nvidia-smi)."""

    def refuse(*args, **kwargs):
        raise Launched(f"bad input reached a launch: {repr(args)[:200]}")

    monkeypatch.setattr(launcher.launch, "launch_run", refuse)
    monkeypatch.setattr(launcher.launch, "write_dry_run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    fake = lambda: HostFacts(hostname="ci", cpu_count=2, accelerators=0,  # noqa: E731
                             extensions_dir="/nonexistent/extensions")
    monkeypatch.setattr(launcher.facts.host, "probe_host", fake)  # every caller imports it from there at call time
    monkeypatch.setenv("COLUMNS", "200")


def check_refused(argv: list[str], names: str, log_dir: Path, capsys) -> str:
    """Run main(argv) and check the refusal: exit 2, one short paragraph per problem naming ``names``, no traceback,
    no run dir, no child process. Returns stderr."""
    capsys.readouterr()
    before = _children()
    try:
        rc = main(argv)
    except Launched as e:
        pytest.fail(f"{argv[-1]!r} was accepted: {e}")
    out, err = capsys.readouterr()
    assert rc == 2, f"{argv[-1]!r}: exit code {rc}\n{out}\n{err}"
    assert "Traceback" not in out + err
    assert names in err, f"{argv[-1]!r}: the message does not name {names}:\n{err}"
    head, *problems = err.strip().split("\n  - ")
    assert head.startswith("hetero-launch:") and "\n" not in head, err
    assert 1 <= len(problems) <= 6, err
    for p in problems:
        assert "\n\n" not in p and len(p) < 800, p
    assert not log_dir.exists() or not any(log_dir.iterdir()), f"{argv[-1]!r} left {list(log_dir.iterdir())}"
    assert _children() == before == set()
    return err


def test_bad_overrides_exit_2_naming_the_key(guarded, capsys, tmp_path):
    seen: list[Bad] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(bad=bad_inputs())
    def refused(bad: Bad) -> None:
        seen.append(bad)
        log_dir = Path(tempfile.mkdtemp(dir=tmp_path)) / "logs"
        check_refused(bad.argv(log_dir), bad.names, log_dir, capsys)

    refused()
    sections = {b.section for b in seen}
    with capsys.disabled():
        print(f"\n{len(seen)} bad overrides refused over {len(sections)} sections: {', '.join(sorted(sections))}")
    assert len(seen) >= EXAMPLES
    assert sections >= {"trainer", "eval", "batch", "parallel", "zero", "placement", "precision", "cluster",
                        "output", "debug", "launcher", "optimizer", "tables", "model", "data", "root"}


# ---- confinement: the one user-named path the launcher writes to is output.log_dir/<output.run_name> ----
# output.log_dir is the root the user picks (any folder they can write); every file a run writes lies under
# log_dir/<run_name>/ with names the launcher makes (rank.N/, checkpoints/step<N>/, ...), or is log_dir/latest. The
# user's other paths (trainer.resume_from, script, data.path, --config-dir) are only read.

@pytest.mark.parametrize("name", BAD_RUN_NAMES + ["", "x" * 201])
def test_run_name_outside_one_folder_is_refused(name, tmp_path):
    if not name:  # empty: the launcher names the run <recipe>-<timestamp>
        assert check_output(OmegaConf.create({"run_name": name})) == []
        return
    problems = check_output(OmegaConf.create({"run_name": name}))
    assert len(problems) == 1 and problems[0].startswith("output.run_name=") and "\n" not in problems[0]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(name=st.text(min_size=1, max_size=260))
def test_an_accepted_run_name_is_one_folder_inside_log_dir(name):
    # OmegaConf reads "???" as a missing value and "${...}" as an interpolation: the composed config refuses those
    # before check_output sees a name (test_bad_run_name_exits_2_before_the_run_dir_exists has both)
    assume(name != "???" and "${" not in name)
    if check_output(OmegaConf.create({"run_name": name})):
        return
    log_dir = Path("/srv/logs")
    path = log_dir / name
    assert path.parent == log_dir and path.name == name and name not in (".", "..", "latest")
    assert Path(name).parts == (name,) and "/" not in name and "\x00" not in name and len(name.encode()) <= 255


@pytest.mark.parametrize("name", ["../escape", "/tmp/escape", "a/b", "latest", "r" * 256, "a\nb", "???", "${x}"])
def test_bad_run_name_exits_2_before_the_run_dir_exists(name, guarded, capsys, tmp_path):
    log_dir = tmp_path / "logs"
    err = check_refused(["recipe=quickstart", f"output.log_dir={log_dir}", "dry_run=true",
                         f"output.run_name={_q(name)}"], "output.run_name", log_dir, capsys)
    assert not (tmp_path / "escape").exists()
    assert "\n" not in err.strip().split("\n  - ")[1]  # the newline in the name is shown escaped, not printed


# ---- issue 21: probes that gave a traceback or a wrong message ----

def _refused(argv: list[str], capsys, *names: str) -> str:
    """main(argv) exits 2 with one paragraph per problem naming each of ``names``, no traceback; returns stderr."""
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in out + err, f"exit {rc}\n{out}\n{err}"
    for name in names:
        assert name in err, f"the message does not name {name}:\n{err}"
    return err


NOT_YAML = {  # file text -> what the message names
    "recipe: {name: mine}\nmodel: {_target_: m.Net, users: 100\n  items: [1, 2\n":
        "conf/recipe/mine.yaml, line 4, column 8: not valid YAML: expected ',' or '}', but got ':' (while parsing a "
        "flow mapping begun at line 3, column 8)",
    "recipe: {name: mine}\nmodel:\n\t_target_: m.Net\n": "conf/recipe/mine.yaml, line 4, column 1: not valid YAML",
    "recipe: {name: mine}\nrecipe: {name: mine}\n": "line 3, column 1: not valid YAML: found duplicate key recipe",
    "- model\n- data\n": "conf/recipe/mine.yaml: the file holds a list, not a mapping of sections",
    "recipe: {name: mine}\nmodel: \udcff\n": "conf/recipe/mine.yaml: not UTF-8 text (byte 0xff",
}


@pytest.mark.parametrize("text", NOT_YAML)
def test_a_recipe_file_that_is_not_yaml_is_named_with_its_line(text, guarded, capsys, tmp_path, monkeypatch):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "mine.yaml").write_bytes(
        ("# @package _global_\n" + text).encode("utf-8", "surrogateescape"))
    monkeypatch.chdir(tmp_path)
    err = _refused(["--config-dir", "conf", "recipe=mine", "output.log_dir=logs"], capsys, NOT_YAML[text])
    assert err.count("\n  - ") == 1 and not (tmp_path / "logs").exists()


def test_check_names_a_broken_recipe_and_plans_the_others(guarded, capsys, tmp_path, monkeypatch):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "mine.yaml").write_text("# @package _global_\nmodel: {a: [1\n")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["check", "--config-dir", "conf", "recipe=quickstart,mine"]) == 2
    out, err = capsys.readouterr()
    assert "1 job(s) plan; 1 does not" in out and "recipe=quickstart" in out, out
    assert "job 1 (recipe=mine): conf/recipe/mine.yaml, line 3" in err and "Traceback" not in out + err


@pytest.mark.parametrize("depth", [100_000, 990])
def test_a_rank_table_nested_too_deeply_is_named(depth, guarded, capsys, tmp_path):
    path = tmp_path / "deep.json"
    deep = "[" * depth + "]" * depth
    path.write_text('{"version": "1.0", "server_list": [{"device": [{"rank_id": ' + deep + "}]}]}")
    _refused(["recipe=quickstart", f"cluster.rank_table_file={path}", f"output.log_dir={tmp_path / 'logs'}"], capsys,
             f"cluster.rank_table_file={path}")


@pytest.mark.parametrize("latest", ["dir", "file"])
def test_a_latest_that_is_not_a_link_exits_2_before_the_run_dir(latest, guarded, capsys, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "latest").mkdir() if latest == "dir" else (log_dir / "latest").write_text("mine")
    err = _refused(["recipe=quickstart", f"output.log_dir={log_dir}", "dry_run=true"], capsys,
                   f"{log_dir}/latest is a {'folder' if latest == 'dir' else 'file'}", f"mv {log_dir}/latest")
    assert [p.name for p in log_dir.iterdir()] == ["latest"], err  # no half-made run dir


def test_resume_latest_through_a_symlink_loop_exits_2(guarded, capsys, tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "latest").symlink_to("latest")
    _refused(["recipe=quickstart", f"output.log_dir={log_dir}", "trainer.resume=latest"], capsys,
             "trainer.resume=latest", f"{log_dir}/latest cannot be followed", "symlink")


@pytest.mark.parametrize("recipe", ["gpt", "wide_deep", "resnet"])
@pytest.mark.parametrize("nodes", [("cluster.nnodes=0",), ("cluster.nnodes=-2", "cluster.launch=elastic",
                                                            "cluster.rdzv_endpoint=node0:29400")])
def test_no_nodes_is_named_without_a_division_by_zero(recipe, nodes, guarded, capsys, tmp_path):
    err = _refused([f"recipe={recipe}", f"output.log_dir={tmp_path}", *nodes], capsys,
                   f"{nodes[0]} must be 1 or more")
    assert "world size" not in err and "dp 0" not in err  # planned on 1 node: no follow-on nonsense


@pytest.mark.parametrize("count", ["4097", "100000"])
def test_an_absurd_rank_count_per_host_is_refused(count, guarded, capsys, tmp_path):
    _refused(["recipe=quickstart", f"output.log_dir={tmp_path}", f"cluster.nproc_per_node={count}"], capsys,
             f"cluster.nproc_per_node={count}: more than 4096 ranks on one host")


def test_more_ranks_than_cores_is_a_warning_with_the_threads_each_gets(tmp_path):
    from launcher.config import compose_config
    from launcher.launch.planning import plan_run

    host = HostFacts(hostname="ci", cpu_count=2, accelerators=0, extensions_dir="/nonexistent/extensions")
    cfg = compose_config(["recipe=quickstart", "cluster.nproc_per_node=8", "data.samples=4096",
                          f"output.log_dir={tmp_path}"])
    plan, lines = plan_run(cfg, host)
    assert plan.world_size == 8 and {r.env["OMP_NUM_THREADS"] for r in plan.ranks} == {"1"}
    assert [line for line in lines if line.startswith("warning: cluster.nproc_per_node=8 puts 8 ranks on 2 CPU "
                                                      "core(s) of ci: each rank gets OMP_NUM_THREADS=1")]
    _, lines = plan_run(compose_config(["recipe=quickstart", f"output.log_dir={tmp_path}"]), host)
    assert not [line for line in lines if line.startswith("warning")]


@pytest.mark.parametrize("recipe, line, names", [
    ("quickstart", "loss.reduction=none", ("loss.reduction=none (recipe quickstart)", "must return a scalar",
                                           "Set loss.reduction=mean.")),
    ("quickstart", "loss.reduce=false", ("loss.reduce=False", "Drop loss.reduce", "set loss.reduction=mean.")),
    ("resnet", "loss.label_smoothing=abc", ("loss.label_smoothing='abc'", "takes a float for label_smoothing")),
])
def test_a_built_in_recipes_loss_arguments_are_checked(recipe, line, names, guarded, capsys, tmp_path):
    _refused([f"recipe={recipe}", f"output.log_dir={tmp_path}", line], capsys, *names)


def test_terminal_escapes_from_a_csv_header_are_shown_not_obeyed(guarded, capsys, tmp_path):
    path = tmp_path / "ctr.csv"
    path.write_text("\x1b[2J\x1b[31mage,city\x07,clicked\n" + "".join(f"{i},c{i % 3},yes\n" for i in range(40)))
    err = _refused(["recipe=wide_deep", "data=tabular", f"data.path={path}", "data.label=nope", "data.positive=yes",
                    f"output.log_dir={tmp_path / 'logs'}"], capsys, "data.label", "\\x1b[2J\\x1b[31mage",
                   "city\\x07")
    assert "\x1b" not in err and "\x07" not in err
