"""No key silently ignored, over the whole schema (issue 45).

Every key of the generated reference (launcher/report/config_reference.py: the root schema, each built-in recipe's
model keys and each of its data options' keys) is set on the command line to a value other than the one the recipe
composes, composed and planned in-process at dry-run level (the plan, then the run dir a dry run writes; no process),
and must do one of:

- change ``plan.json`` (what the ranks read), a rank's environment, or where / what the dry run writes;
- be refused as bad input (``ConfigError``, exit 2) by a message naming the key;
- be named in a plan note (how the launcher reports a key it changed or did not apply).

A key whose only effect is at run time (or on the console), where no plan can show it, is listed in ``RUN_TIME``
with what of the run dir or the summary it changes. Hydra's own ``hydra.*`` settings are walked too: each is refused,
but ``hydra.searchpath``, which composes. Competing keys (steps and epochs, a recipe's default and the user's value):
the one the user wrote wins, or both written are refused naming both. The keys are read from the schema, so a new
key is walked the day it is added (and fails the walk until its type or VALUES gives it a value to be walked with).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from launcher.config import compose_config
from launcher.errors import ConfigError
from launcher.launch import write_dry_run
from launcher.launch.planning import plan_run
from launcher.recipes import RECIPES
from launcher.report.config_reference import schema_keys
from launcher.schema import HeteroConfig

HOME = "wide_deep"
"""The recipe the root keys are walked on: the one with tables (so tables.<name>.* and placement act)."""
TABLE = "deep_embedding"
"""The table ``tables.<name>.*`` is walked on."""
WHOLE = ("model", "data", "loss")
"""Root rows that stand for a recipe's own sections: walked key by key (model.*, data.* per recipe; loss._target_)."""

VALUES: dict[str, Any] = {
    # A valid value other than the recipe's, where the type alone gives none (a string's choices, an empty list or
    # dict, a sentinel whose obvious neighbour means the same); every other key gets bool: not; int: +1 (-1: 2);
    # float: x2 (0: 0.5); a list of numbers: its first number so changed.
    "recipe.name": "gpt",
    "loss._target_": "torch.nn.MSELoss",
    "model._target_": "torch.nn.Identity", "data._target_": "torch.utils.data.TensorDataset",
    "eval_data": {"_target_": "torch.utils.data.TensorDataset"},
    "val_data": {"_target_": "torch.utils.data.TensorDataset"},
    "model_output": "logits", "data_inputs": ["x"], "data_label": "y",
    "loader.collate_fn": "torch.utils.data.default_collate", "loader.num_workers": 1, "loader.pin_memory": True,
    "loader.prefetch_factor": 4, "loader.persistent_workers": False,
    "optimizer.name": "sgd", "optimizer.betas": [0.8, 0.99], "optimizer.target": "CPU",
    "optimizer.cpu_impl": "deepspeed",
    "tables.<name>.optimizer": "sgd", "tables.<name>.betas": [0.8, 0.99], "tables.<name>.hash": 1000,
    "tables.<name>.hash_fn": "mod",
    "trainer.checkpoint_dir": "ckpts", "trainer.resume_from": "nowhere/step1", "trainer.resume": "latest",
    "trainer.early_stop.metric": "auc", "trainer.early_stop.mode": "max",
    "eval.metrics": "loss",
    "batch.global_size": 1024, "batch.micro_size": 512,
    "parallel.dp": 1,  # -1 infers 2 here: 2 would mean the same
    "parallel.stages": {"deep": 0}, "parallel.partition": "uniform", "parallel.schedule": "gpipe",
    "parallel.sharding": {"matmul": [[2, 1], [1, 1]]}, "parallel.search_mode": "recursive_programming",
    "parallel.data_parallel": "fsdp",
    "deepspeed.config": {"gradient_clipping": 1.0}, "deepspeed.given": ["zero.stage"], "deepspeed.source": "x.json",
    "placement.ps_init": "blocks", "placement.tables": {TABLE: "host"}, "placement.pin_memory": "true",
    "placement.prefetch": 2, "placement.mode": "auto", "placement.modules": {"mlp": "host"},
    "precision": "bf16",
    "cluster.launch": "elastic", "cluster.launcher_args": ["--verbose"], "cluster.nnodes": 2,
    "cluster.rdzv_endpoint": "127.0.0.1:29401", "cluster.rdzv_id": "walk",
    "cluster.rdzv_backend": "etcd-v2", "cluster.rdzv_conf": {"read_timeout": 9},
    "cluster.local_addr": "127.0.0.1", "cluster.nproc_per_node": "1", "cluster.master_addr": "localhost",
    "cluster.backend": "nccl", "cluster.device": "cuda",  # gloo / cpu are what auto picks on this host
    "launcher.malloc": "glibc",  # the ranks' LD_PRELOAD where tcmalloc is installed; the plan's note says so anyway
    "cluster.rank_table_file": "ranks.json", "cluster.hostfile": "hosts", "cluster.include": "h1",
    "cluster.exclude": "h1",
    "output.log_dir": "elsewhere", "output.run_name": "walk", "output.console": "all",
    "logger": "none", "recompute": ["all"],
    "smoke_profile": {"model": {"embed_dim": 2}}, "smoke_changes": ["trainer.steps: 1 -> 2"],
    "script": "train.py", "script_args": ["--lr"], "script_ops": ["cpu_adam"],
    "model.field_sizes": [50] * 26,
    "data.interactions": [[0, 2]],
    # data=tabular: columns of tests/data/make_ctr_csv.py's file
    "data.path": "{other}", "data.label": "bought", "data.positive": "no", "data.negative": "yes",
    "data.categorical": ["city"], "data.continuous": ["hours"], "data.drop": ["user_id", "job"],
    "data.crosses": [["job", "device"]], "data.eval_path": "{other}",
}
"""Keys with an explicit probe value. ``{csv}`` is the walk's data file, ``{other}`` another one."""
DATA_OPTIONS = {"tabular": ("data.path={csv}", "data.label=clicked", "data.positive=yes", "data.drop=[user_id]",
                            "batch.global_size=64")}
"""What a data option needs set to compose (its required keys) and plan (a batch the walk's 400-row file holds),
beyond ``data=<option>``."""
TABULAR = ("data=tabular", *DATA_OPTIONS["tabular"])
ELASTIC = ("cluster.launch=elastic", "cluster.nnodes=2", "cluster.rdzv_endpoint=127.0.0.1:29400")
CONTEXT: dict[str, tuple[str, ...]] = {
    # keys walked a second time with other settings than the home recipe's: where it has nothing for them to act on
    # (alone there they must be refused or noted), or where they compete with a default
    "trainer.steps": TABULAR, "trainer.epochs": TABULAR,  # data=tabular trains 5 epochs by default
    "smoke_profile": ("smoke=true",),  # the profile is read by smoke=true only
    **{f"cluster.{k}": ELASTIC for k in ("rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "local_addr", "rdzv_timeout_s",
                                         "heartbeat_timeout_s")},  # read by cluster.launch=elastic only
}

RUN_TIME: dict[str, str] = {
    # keys whose only effect is where no plan or dry-run file can show it: what of the run dir or summary it changes
    "output.stderr_tail": "junit.xml's failure text and the failure report printed at the end: the last lines of a "
                          "failed rank's stderr (test_stderr_tail_is_what_junit_keeps below)",
    "output.full_plan": "the plan printed on the console only (compact or whole); plan.txt is whole either way",
    "launcher.watchdog_s": "summary.json status hung, the stalled rank named (tests/integration/test_faults.py)",
    "launcher.max_restarts": "attempt.<k>/ folders and summary.json's attempts (tests/integration/test_resume.py)",
    "dry_run": "no rank.<N>/, no summary.json: nothing starts (tests/test_cli.py)",
}


@dataclasses.dataclass(frozen=True)
class Case:
    recipe: str
    key: str
    """The key as the reference writes it (tables.<name>.lr)."""
    setting: tuple[str, ...] = ()
    """Overrides the case is composed with before its own (a data option, CONTEXT)."""

    @property
    def path(self) -> str:
        return self.key.replace("<name>", TABLE)


def reference_keys(cls: type, prefix: str = "") -> list[str]:
    """The reference's rows that are keys (a section's own row left out)."""
    rows = [k.path for k in schema_keys(cls, prefix)]
    return [r for r in rows if not any(o.startswith(f"{r}.") for o in rows)]



def cases() -> list[Case]:
    root = [k for k in reference_keys(HeteroConfig) if k not in WHOLE]
    out = [Case(HOME, k) for k in root] + [Case(HOME, k, CONTEXT[k]) for k in root if k in CONTEXT]
    out.append(Case(HOME, "loss._target_"))
    for name, recipe in sorted(RECIPES.items()):
        out += [Case(name, k) for k in reference_keys(recipe.model_config, "model.")]
        for i, (option, node) in enumerate(recipe.data_configs.items()):  # the first is the recipe's default
            setting = () if i == 0 else (f"data={option}", *DATA_OPTIONS.get(option, ()))
            out += [Case(name, k, setting) for k in reference_keys(node, "data.")]
    return out


def probe(key: str, now: Any) -> Any:
    """A value other than ``now`` of the same type (VALUES first)."""
    if key in VALUES:
        return VALUES[key]
    if isinstance(now, ListConfig):
        now = OmegaConf.to_container(now, resolve=True)
    if isinstance(now, bool):
        return not now
    if isinstance(now, int):
        return now + 1 if now >= 0 else 2
    if isinstance(now, float):
        return now * 2 if now else 0.5
    if isinstance(now, list) and now and all(isinstance(x, (int, float)) for x in now):
        return [probe(key, now[0]), *now[1:]]
    raise KeyError(f"{key}={now!r}: its type gives no other value to walk it with; add one to VALUES")


ABSENT = object()
"""A key the composed config does not hold (an entry of a dict)."""


def overrides(key: str, value: Any, now: Any, csv: str) -> list[str]:
    """``key=value`` in Hydra's override grammar; a dict the config holds already as ``++key.entry=value`` lines
    (Hydra merges a dict given whole into the one there, and refuses a new entry in a typed dict)."""
    if isinstance(now, DictConfig) and isinstance(value, dict):
        return [line for k, v in value.items() for line in overrides(f"{key}.{k}", v, now.get(k, ABSENT), csv)]
    return [f"{'++' if now is ABSENT else ''}{key}={spell(value, csv)}"]


def spell(v: Any, csv: str) -> str:
    """A value as the command line writes it (``{csv}``, ``{other}``: the walk's data files)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, str):
        v = v.format(csv=csv, other=str(Path(csv).with_name("other.csv")))
        return v if re.fullmatch(r"[\w./:-]+", v) else f"'{v}'"
    if isinstance(v, list):
        return "[" + ",".join(spell(x, csv) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{spell(x, csv)}" for k, x in v.items()) + "}"
    return repr(v)


def observe(cfg: DictConfig, host, where: Path, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a key can change, planned and dry-run in ``where``: the plan (less its notes), each rank's environment,
    the notes and lines shown before launch, and the run dir (where it is, what the backend writes besides the plan:
    the checkpoint link, job.sbatch). The dry run is left out where the plan differs from ``base`` already."""
    where.mkdir()
    os.chdir(where)
    plan, lines = plan_run(cfg, host)
    seen = plan.to_dict()
    notes = {*seen.pop("notes", ()), *seen.pop("decisions", ()), *lines}
    env = {r["rank"]: r.pop("env") for r in seen.get("ranks", ())}
    out = {"plan": seen, "env": env, "notes": notes, "run dir": None}
    if base is not None and any(out[k] != base[k] for k in ("plan", "env", "notes")):
        return out
    was, cfg.dry_run = cfg.dry_run, True  # no space kept for a summary: nothing will run
    run_dir = write_dry_run(cfg, plan)
    cfg.dry_run = was
    written = {p.name: os.readlink(p) if p.is_symlink() else p.read_text(errors="replace")
               for p in sorted(run_dir.path.rglob("*")) if (p.is_file() or p.is_symlink()) and p.name not in SAME_FILES}
    place = re.sub(r"\d{8}-\d{6}", "<time>", os.path.relpath(run_dir.path, where))
    out["run dir"] = (place, written)
    return out


SAME_FILES = ("config.yaml", "plan.json", "rank_env.json", "versions.json", "launcher.json", "rank_table.json",
              "ds_config.json")
"""Run dir files observed otherwise (config.yaml is the composed config: any key changes it; the rest are the plan
or the same on every run)."""


def outcome(case: Case, lines: list[str], base: dict[str, Any], host, where: Path, csv: str) -> tuple[str, str]:
    """(verdict, what was seen): refused / noted / plan / env / run dir, or silent."""
    setting = [s.format(csv=csv) for s in case.setting]
    try:
        seen = observe(compose_config([f"recipe={case.recipe}", *setting, *lines]), host, where, base)
    except ConfigError as e:
        said = " ".join(str(e).split())
        return ("refused" if case.path in said else "refused without naming the key"), said[:400]
    noted = [n for n in seen["notes"] - base["notes"] if case.path in n]
    if noted:
        return "noted", noted[0]
    for part in ("plan", "env", "run dir"):
        if seen[part] != base[part]:
            return part, ""
    return "silent", ""


@pytest.fixture(scope="module")
def walk_csv(tmp_path_factory) -> str:
    """data=tabular's file: tests/data/make_ctr_csv.py's 400 rows with a second yes/no column (bought) for data.label
    to move to; beside it other.csv (``{other}``), 300 of the rows, for data.path and data.eval_path to move to."""
    from tests.data.make_ctr_csv import write_ctr_csv

    root = tmp_path_factory.mktemp("walk")
    write_ctr_csv(str(root / "plain.csv"), 400)
    rows = (root / "plain.csv").read_text().splitlines()
    flip = {"yes": "no", "no": "yes"}
    (root / "ctr.csv").write_text("\n".join([f"{rows[0]},bought"] + [f"{r},{flip[r.rsplit(',', 1)[1]]}"
                                                                   for r in rows[1:]]) + "\n")
    (root / "other.csv").write_text("\n".join(rows[:301]) + "\n")
    return str(root / "ctr.csv")


@pytest.fixture
def walk(cpu_host, tmp_path, walk_csv, monkeypatch):
    """walk(cases) -> [(case, verdict, what was seen, value)], each case planned in a folder of its own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("launcher.launch.record.versions", dict)  # the same on every run: no git call per key
    host = dataclasses.replace(cpu_host, host_memory=24 * 2**30)  # a memory plan to check against
    bases: dict[tuple, dict[str, Any]] = {}

    def run(todo: list[Case]) -> list[tuple[Case, str, str, Any]]:
        out = []
        for n, case in enumerate(todo):
            head = (case.recipe, case.setting)
            if head not in bases:
                cfg = compose_config([f"recipe={case.recipe}", *(s.format(csv=walk_csv) for s in case.setting)])
                seen = [observe(cfg, host, tmp_path / f"base{len(bases)}-{i}") for i in (0, 1)]
                assert seen[0] == seen[1], f"{head}: planned twice, seen differently: the walk cannot tell"
                bases[head] = (seen[0], cfg)
            base, cfg = bases[head]
            now = OmegaConf.select(cfg, case.path, default=ABSENT)
            try:
                lines = overrides(case.path, probe(case.key, now), now, walk_csv)
            except KeyError as e:
                out.append((case, "no probe value", e.args[0], case.path))
                continue
            out.append((case, *outcome(case, lines, base, host, tmp_path / str(n), walk_csv), " ".join(lines)))
        return out
    return run


def problems(seen: list[tuple[Case, str, str, Any]]) -> list[str]:
    wrong = []
    for case, verdict, said, value in seen:
        key = value + (f" (with {' '.join(case.setting)})" if case.setting else "")
        if verdict == "silent" and case.key not in RUN_TIME:
            wrong.append(f"{key}: silently ignored (no change to the plan, a rank's environment or the run "
                         f"dir, no refusal, no note naming it)")
        elif verdict == "no probe value":
            wrong.append(said)
        elif verdict == "refused without naming the key":
            wrong.append(f"{key}: refused without naming the key: {said}")
        elif verdict != "silent" and case.key in RUN_TIME:
            wrong.append(f"{key}: listed in RUN_TIME but {verdict} ({said[:200]}): drop it from RUN_TIME")
    return wrong


def test_every_root_key_changes_the_plan_or_is_refused_or_noted(walk):
    started = time.perf_counter()
    seen = walk([c for c in cases() if c.recipe == HOME and not c.key.startswith(("model.", "data."))])
    print(f"{len(seen)} root keys walked in {time.perf_counter() - started:.1f} s")
    for case, verdict, said, value in seen:
        print(f"  {verdict:8} {value} {' '.join(case.setting[:1])} {said[:160]}")
    assert not (wrong := problems(seen)), "\n".join(wrong)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_model_and_data_key_changes_the_plan_or_is_refused_or_noted(recipe, walk):
    started = time.perf_counter()
    seen = walk([c for c in cases() if c.recipe == recipe and c.key.startswith(("model.", "data."))])
    print(f"{recipe}: {len(seen)} keys walked in {time.perf_counter() - started:.1f} s")
    for case, verdict, said, value in seen:
        print(f"  {verdict:8} {value} {' '.join(case.setting[:1])} {said[:160]}")
    assert not (wrong := problems(seen)), "\n".join(wrong)


def test_stderr_tail_is_what_junit_keeps(tmp_path):
    """output.stderr_tail (RUN_TIME): the lines of a failed rank's stderr that junit.xml keeps."""
    from launcher.report.junit import write_junit
    from launcher.rundir import RunDir
    from tests.test_junit import _summary

    run = RunDir(tmp_path / "run")
    run.rank(1).path.mkdir(parents=True)
    run.rank(1).stderr.write_text("".join(f"line {i}\n" for i in range(30)))
    kept = {}
    for tail in (3, 10):
        write_junit(run, _summary([0, 1], "failed"), tail)
        kept[tail] = run.junit.read_text()
    assert "line 29" in kept[3] and "line 26" not in kept[3] and "line 20" in kept[10]


HYDRA_GROUPS = ["hydra/launcher=basic", "hydra/sweeper=basic", "hydra/job_logging=default", "hydra/help=default"]


def hydra_settings() -> list[str]:
    """Every scalar of Hydra's own config a user may set (hydra.run.dir, hydra.job.chdir, ...): Hydra's HydraConf,
    walked as the reference is."""
    from hydra.conf import HydraConf

    def leaves(node: DictConfig, prefix: str) -> list[str]:
        out = []
        for k in node.keys():
            child = node._get_node(k)
            out += (leaves(child, f"{prefix}{k}.") if isinstance(child, DictConfig) and not child._is_none()
                    and len(child) else [f"{prefix}{k}"])
        return out
    return leaves(OmegaConf.structured(HydraConf), "hydra.")


def test_hydra_s_own_settings_are_refused_naming_the_key_but_the_search_path(tmp_path):
    """hydra.run.dir, hydra.sweep.dir and every other key of Hydra's own config do nothing for hetero-launch (it
    composes with Hydra's compose API and runs the job itself): each is refused naming itself, the run and sweep dirs
    with the key that sets the run dir instead. hydra.searchpath composes (below)."""
    keys = hydra_settings()
    assert "hydra.run.dir" in keys and "hydra.sweep.dir" in keys and len(keys) > 30, keys
    wrong = []
    for line in [f"{k}=x" for k in keys if k != "hydra.searchpath"] + HYDRA_GROUPS:
        try:
            compose_config(["recipe=quickstart", line])
            wrong.append(f"{line}: composed")
        except ConfigError as e:
            if f"{line}: Hydra's own run settings do nothing here" not in str(e):
                wrong.append(f"{line}: refused without naming it: {e}")
    assert not wrong, "\n".join(wrong)
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        with pytest.raises(ConfigError, match=f"{key}=runs: .* set output.log_dir=runs"):
            compose_config(["recipe=quickstart", f"{key}=runs"])


def test_hydra_searchpath_is_where_config_groups_are_found(tmp_path):
    (tmp_path / "placement").mkdir()
    (tmp_path / "placement" / "walk.yaml").write_text("# @package placement\nreserve: 0.3\n")
    cfg = compose_config(["recipe=quickstart", f"hydra.searchpath=[file://{tmp_path}]", "placement=walk"])
    assert cfg.placement.reserve == 0.3


@pytest.mark.parametrize("given, planned", [
    ([], {"steps": 5 * (320 // 64)}),  # data=tabular's default: 5 epochs of 320 training rows
    (["trainer.steps=7"], {"steps": 7}),  # the user's steps over the data option's epochs
    (["trainer.epochs=2"], {"steps": 2 * (320 // 64)}),  # the user's epochs over the recipe's steps
    (["trainer.steps=7", "trainer.epochs=0"], {"steps": 7}),
    (["trainer.steps=7", "trainer.epochs=2"], "trainer.steps=7 and trainer.epochs=2 were both given"),
])
def test_steps_and_epochs_the_one_the_user_writes_wins_or_both_are_refused(given, planned, walk_csv, cpu_host,
                                                                          monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    overrides = ["recipe=wide_deep", *(s.format(csv=walk_csv) for s in TABULAR), *given]
    if isinstance(planned, str):
        with pytest.raises(ConfigError, match=planned):
            compose_config(overrides)
        return
    plan = plan_run(compose_config(overrides), cpu_host)[0]
    assert plan.steps == planned["steps"]


@pytest.mark.parametrize("recipe, given, planned", [
    # a recipe's (or data option's) value, and the user's over it
    ("wide_deep", ["optimizer.lr=0.01"], lambda p: p.optimizer.lr == 0.01),
    ("wide_deep", ["tables.deep_embedding.lr=0.05"],
     lambda p: next(t for t in p.placement.tables if t.name == "deep_embedding").lr == 0.05),
    ("resnet", [], lambda p: p.batch.grad_accum == 4 and p.pipeline.partition == "parallel.stages"),
    ("resnet", ["batch.grad_accum=2"], lambda p: p.batch.grad_accum == 2),  # over the recipe's micro_batches: 4
    ("resnet", ["batch.micro_batches=2"], lambda p: p.batch.grad_accum == 2),
    ("resnet", ["parallel.partition=uniform"], lambda p: p.pipeline.partition == "uniform"),  # over its stages
    ("resnet", ["batch.grad_accum=4", "batch.micro_batches=4"], lambda p: p.batch.grad_accum == 4),  # one number
    ("resnet", ["batch.grad_accum=2", "batch.micro_batches=4"], "batch.grad_accum=2 and batch.micro_batches=4 were "
                                                                "both given"),
    ("resnet", ["parallel.partition=uniform", "parallel.stages.layer2=1"], "parallel.partition=uniform and "
                                                                         "parallel.stages=.* were both given"),
])
def test_a_recipe_default_gives_way_to_the_user_s_value_or_both_written_are_refused(recipe, given, planned, cpu_host,
                                                                                   monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    overrides = [f"recipe={recipe}", *given]
    if isinstance(planned, str):
        with pytest.raises(ConfigError, match=planned):
            compose_config(overrides)
        return
    assert planned(plan_run(compose_config(overrides), cpu_host)[0])
