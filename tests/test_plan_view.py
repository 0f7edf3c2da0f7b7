"""The plan a dry run prints (issue 45): compact by default, about 40 lines at 100 columns for every shipped recipe,
no table row wrapped at 100 or 80 columns, every note on a line of its own; the whole tree with
output.full_plan=true and always in the run dir's plan.txt. The dry runs run the CLI's main in this process."""

from __future__ import annotations

import json
import re
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from launcher.cli import main
from launcher.report.plan_compact import compact_plan_view
from launcher.report.plan_view import engine_config_view
from launcher.rundir import RunDir
from launcher.terminal import one_line_table
from tests.conftest import ALL_RECIPES, plan_of

GUIDE = re.compile(r"^[│├└─ ]*")
"""A tree line's guides (│ ├── └──) before its text."""

RULE = re.compile(r"^─+$")
"""The rule under a compact table's header."""


def dry_run(args: list[str], tmp_path: Path, columns: int, monkeypatch, capsys) -> tuple[list[str], RunDir]:
    """main(args + dry_run=true) at ``columns`` columns in tmp_path: its stdout's lines and the run dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    assert main([*args, "dry_run=true"]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines(), RunDir((tmp_path / "log_output" / "latest").resolve())


def table_rows(lines: list[str], title: str) -> list[str]:
    """The rows of the compact table titled ``title``...: the lines after its header's rule, up to the next line that
    is no row (a table's rows are followed by a line of another kind: another title, the tree, the last lines)."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    assert RULE.match(lines[start + 2]), lines[start:start + 3]
    rows = []
    for line in lines[start + 3:]:
        if line.startswith(("the whole plan", "sharding (", "dry run:", "DeepSpeed")):
            break
        rows.append(line)
    return rows


def names_in_order(plan: dict) -> list[str]:
    return [t["name"] for t in plan["placement"]["tables"]] + ["dense network"]


def check_one_line_rows(lines: list[str], plan: dict) -> None:
    """Each table and the dense network is one row, which starts with its name (cut with … when narrow)."""
    rows = table_rows(lines, "placement (")
    names = names_in_order(plan)
    assert len(rows) == len(names), rows
    for row, name in zip(rows, names):
        shown = row.split("   ")[0].rstrip("…")
        assert name.startswith(shown) and len(shown) >= 8, (row, name)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_a_default_dry_run_fits_100_columns_in_about_40_lines(recipe, tmp_path, monkeypatch, capsys):
    lines, run = dry_run([f"recipe={recipe}"], tmp_path, 100, monkeypatch, capsys)
    plan = run.read_plan()
    assert len(lines) <= 45, "\n".join(lines)
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    check_one_line_rows(lines, plan)
    assert "implementation:" not in "\n".join(lines)  # a part's config: plan.txt's, not the compact view's
    notes = [GUIDE.sub("", line) for line in lines if GUIDE.sub("", line).startswith("note: ")]
    assert len(notes) == len(plan["notes"]), (notes, plan["notes"])  # every note, one line each
    for shown, note in zip(notes, plan["notes"]):
        assert f"note: {note}".startswith(shown.rstrip("…")), (shown, note)
    assert lines[-2].startswith("the whole plan: output.full_plan=true, or plan.txt in the run dir")


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_at_80_columns_no_table_row_wraps(recipe, tmp_path, monkeypatch, capsys):
    lines, run = dry_run([f"recipe={recipe}"], tmp_path, 80, monkeypatch, capsys)
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    check_one_line_rows(lines, run.read_plan())
    assert len(lines) <= 50, "\n".join(lines)


def test_the_full_plan_flag_prints_the_whole_tree_and_plan_txt_always_has_it(tmp_path, monkeypatch, capsys):
    lines, run = dry_run(["recipe=wide_deep", "output.full_plan=true"], tmp_path, 100, monkeypatch, capsys)
    text = "\n".join(lines)
    for part in ("parts, in the order they apply", "implementation: torch DistributedDataParallel", "├── ranks",
                 "rank 1: (pp 0 dp 1 tp 0), node 0, local rank 1", "memory of one rank at its peak",
                 "its state on"):
        assert part in text, part
    whole = run.plan_text.read_text()
    plan = run.read_plan()
    for part in ("parts, in the order they apply", "implementation: torch DistributedDataParallel", "├── ranks",
                 "a copy per rank: 16.6 MB (+ states 33.3 MB) per rank, 99.8 MB per host", "its state on"):
        assert part in whole, part
    for term in plan["peak"]["terms"]:  # every term, none summed into "N more"
        assert f"│ {term['name']} " in whole, term["name"]
    assert "lists every term" not in whole
    flat = " ".join(whole.replace("│", " ").split())
    for note in plan["notes"]:
        assert " ".join(note.split()) in flat, note


def test_the_default_dry_runs_plan_txt_is_the_whole_plan(tmp_path, monkeypatch, capsys):
    lines, run = dry_run(["recipe=resnet"], tmp_path, 80, monkeypatch, capsys)
    whole = run.plan_text.read_text()
    assert "stage 0 (rank 0): head, layer1, layer2" in whole and "rank 1: (pp 1 dp 0 tp 0)" in whole
    assert "loss: the last stage's" in whole  # the pipeline part's config
    assert "rank 1: (pp 1 dp 0 tp 0)" not in "\n".join(lines)
    assert re.search(r"^\s*(│\s+)?├── stage 0 \(rank 0\): 23,752 params", "\n".join(lines), re.M)


def test_operators_sharding_is_one_line_each_at_80_columns(cpu_host):
    plan = plan_of(["recipe=gpt", "cluster.nproc_per_node=2", "parallel.tp=2"], cpu_host)
    out = StringIO()
    console = Console(file=out, width=80, color_system=None)
    for view in compact_plan_view(plan, 80):
        console.print(view)
    lines = out.getvalue().splitlines()
    rows = table_rows(lines, "sharding (")
    assert len(rows) == len(plan.sharding.ops) and max(map(len, lines)) <= 80
    assert all(row.startswith(op.name[:8]) for row, op in zip(rows, plan.sharding.ops)), rows


def test_a_narrow_table_drops_optional_columns_then_cuts_the_shrinking_ones():
    rows = [["a_very_long_table_name_indeed", "1,000×16", "host, ps over 8", "1.0 MB (+ 2.0 MB)", "8.0 MB", "adam"]]
    cols = ("table / module", "size", "lives on", "per rank", "per host", "optimizer")

    def shown(width: int) -> list[str]:
        out = StringIO()
        Console(file=out, width=width, color_system=None).print(
            one_line_table("placement", cols, rows, width, shrink=(0, 2), optional=(4, 1)))
        return out.getvalue().splitlines()

    wide = shown(120)
    assert "per host" in wide[1] and wide[3].startswith("a_very_long_table_name_indeed")
    narrow = shown(60)
    assert len(narrow) == 4 and max(map(len, narrow)) <= 60  # title, header, rule, one row
    assert "per host" not in narrow[1] and "size" not in narrow[1]
    assert "1.0 MB (+ 2.0 MB)" in narrow[3] and "…" in narrow[3]


def test_the_compact_deepspeed_config_is_the_same_json():
    config = {"train_batch_size": 32, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
              "bf16": {"enabled": True}}
    out = StringIO()
    Console(file=out, width=300, color_system=None).print(engine_config_view(config, full=False))
    assert json.loads(out.getvalue()) == config
    assert len(out.getvalue().splitlines()) == len(config) + 2  # one line per top-level key
