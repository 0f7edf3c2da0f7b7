"""The import graph of launcher/: no module imports itself back through others (no cycle, counting the package
__init__s Python runs on the way too), imports run down the layer order (LAYERS) but for the few listed with their
reason, the pure plan imports nothing above it, and every fact the plan reads is made under launcher/facts/. Like the part-name test (tests/parallel/test_registry.py),
read from the source with ``ast``, so a new import that breaks the layering fails here, with the path it makes.

Every import counts, at module level and inside a function: a lazy import is still a dependency (it only moves the
failure to run time). Imports under ``if TYPE_CHECKING:`` are left out: they never run. An edge goes to the module
an import names: ``from launcher.plan.memory import Bytes`` -> launcher.plan.memory, ``from launcher.plan import
memory`` -> launcher.plan.memory (a submodule), ``from launcher.plan import TablePlan`` -> launcher.plan (the package's
__init__), as import-linter's grimp counts them. The package __init__ Python also runs first on the way to a submodule
is not an edge here; ``package_cycles`` shows what counting it adds."""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[1] / "launcher"
PURE = "launcher.plan"
ABOVE_THE_PLAN = ("launcher.launch", "launcher.backends", "launcher.worker", "launcher.tables", "launcher.parallel",
                  "launcher.usercode", "launcher.facts")
LAYERS = ("loggers", "integrations", "plan", "report", "tables", "usercode", "parallel", "worker", "facts", "backends",
          "launch")
"""The packages of launcher/, bottom to top: a module imports from its own layer or below. Below them all, the root
modules (leaves: codec, units, errors, schema, contract, config, rundir, ...); above them all, the entry points
(ENTRY). The plan (pure) sits under everything that runs; the table stores, your code's adapters and the parallel
parts are what a rank applies; the worker runs them; facts are gathered (with the backends' and parts' registries)
before the plan; backends start ranks; launch runs facts -> plan -> backend -> supervise."""
ENTRY = ("launcher.cli", "launcher.__main__", "launcher.runtime")
"""The entry points: the command line, and the API of your own loop (a package: runtime.prepare() in prepare.py)."""
UPWARD = {
    "launcher.facts.preflight -> launcher.backends":
        "gather_facts hands the backends' registry to the plan (Facts.backends), and a backend's default layout reads "
        "the cluster files in facts/cluster_files.py: one of the two runs up",
    "launcher.config_overrides -> launcher.plan.registry":
        "optimizer.name=<other> on the command line sets the recipe's settings the chosen optimizer does not take "
        "aside as the config is composed (where the command line is known); which ones is the optimizer registry's "
        "(pure, torch-free) to say",
    "launcher.config -> launcher.plan.script_keys":
        "with script=, a key of the recipe's model, data or loss cannot compose (the sections are unset); it is "
        "refused in the words the plan's verdict table gives every other key a script does not read (a failed "
        "compose only)",
}
"""The imports that run up the layer order, each with why (the issue that asked for this held them at 4 or fewer)."""


def module_names(root: Path = LAUNCHER) -> dict[str, Path]:
    """Dotted name -> file of every module under root (a package is its __init__.py)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: a third-party or standard module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(importer: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """Our modules one import statement of ``importer`` names (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return {m for a in node.names if (m := _known(a.name, modules))}
    base = node.module or ""
    if node.level:
        package = importer if modules[importer].name == "__init__.py" else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    found = set()
    for alias in node.names:
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known(base, modules)
        if target:
            found.add(target)
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING"):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def import_graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, anywhere in its body (TYPE_CHECKING blocks left out)."""
    modules = module_names() if modules is None else modules
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree)
        graph[name] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                       and id(node) not in skipped for t in _targets(name, node, modules)} - {name}
    return graph


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph plus what Python runs on the way: importing a.b.c from outside package a.b runs a.b's __init__."""
    out = {}
    for importer, targets in graph.items():
        out[importer] = set(targets)
        for target in targets:
            package = target.rpartition(".")[0]
            while package and importer != package and not importer.startswith(package + "."):
                out[importer].add(package)
                package = package.rpartition(".")[0]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that starts and ends at the same module) through each circle of modules, sorted."""
    return sorted(_cycle_through(c, graph) for c in circles(graph))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each reaches every other one), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):  # Tarjan's algorithm, iterative (no recursion limit on a long chain)
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    return component


def plan_imports_above(graph: dict[str, set[str]]) -> list[str]:
    """'importer -> imported' for each import from the plan into a package above it."""
    return [f"{m} -> {t}" for m in sorted(graph) if m == PURE or m.startswith(PURE + ".")
            for t in sorted(graph[m]) if any(t == p or t.startswith(p + ".") for p in ABOVE_THE_PLAN)]


def _graph_of(sources: dict[str, str], tmp_path: Path) -> dict[str, set[str]]:
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return import_graph(module_names(tmp_path / "launcher"))


def test_the_check_finds_what_it_looks_for(tmp_path):
    graph = _graph_of({
        "launcher/__init__.py": "",
        "launcher/plan/__init__.py": "from launcher.plan.a import X\n",
        "launcher/plan/a.py": "from . import b\nX = 1\n",
        "launcher/plan/b.py": "def f():\n    from launcher.plan.a import X\n",  # a lazy import closes a cycle
        "launcher/plan/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from launcher.worker import W\n",
        "launcher/plan/d.py": "import os\nfrom ..backends import base\n",
        "launcher/backends/__init__.py": "",
        "launcher/backends/base.py": "from launcher.plan import X\n",
        "launcher/worker/__init__.py": "W = 1\n",
        "launcher/tables/__init__.py": "from .t import T\n",
        "launcher/tables/t.py": "from launcher.report.r import R\nT = 1\n",
        "launcher/tables/u.py": "U = 1\n",
        "launcher/report/__init__.py": "",
        "launcher/report/r.py": "from launcher.tables.u import U\nR = 1\n",
    }, tmp_path)
    assert graph["launcher.plan"] == {"launcher.plan.a"}
    assert graph["launcher.plan.c"] == set()  # TYPE_CHECKING only
    assert graph["launcher.plan.d"] == {"launcher.backends.base"}
    assert cycles(graph) == [["launcher.plan.a", "launcher.plan.b", "launcher.plan.a"]]
    assert plan_imports_above(graph) == ["launcher.plan.d -> launcher.backends.base"]
    assert upward_imports(graph) == ["launcher.plan.d -> launcher.backends.base",  # plan < backends
                                     "launcher.report.r -> launcher.tables.u"]  # report < tables
    # report.r -> tables.u runs tables/__init__.py first, which imports tables.t, which imports report.r
    assert cycles(with_packages(graph)) == [["launcher.plan.a", "launcher.plan.b", "launcher.plan.a"],
                                            ["launcher.report.r", "launcher.tables", "launcher.tables.t",
                                             "launcher.report.r"]]


def test_no_import_cycle_in_the_launcher():
    graph = import_graph()
    found = [f"{' -> '.join(_cycle_through(c, graph))}\n  (one path through a circle of {len(c)} modules: "
             f"{', '.join(c)})" for c in circles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_plan_imports_nothing_above_it():
    above = plan_imports_above(import_graph())
    assert not above, f"the plan ({PURE}) imports from {', '.join(ABOVE_THE_PLAN)}:\n" + "\n".join(above)


def layer_of(module: str) -> int:
    """0 for a root module, 1.. for LAYERS' packages, above them the entry points."""
    if any(module == e or module.startswith(e + ".") for e in ENTRY):
        return len(LAYERS) + 1
    parts = module.split(".")
    return LAYERS.index(parts[1]) + 1 if len(parts) > 1 and parts[1] in LAYERS else 0


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'importer -> imported' for each import into a higher layer."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))


def test_no_import_cycle_counting_the_packages_python_runs_on_the_way():
    graph = with_packages(import_graph())
    found = [f"{' -> '.join(_cycle_through(c, graph))}\n  (one path through a circle of {len(c)} modules)"
             for c in circles(graph)]
    assert not found, "import cycles, counting package __init__s:\n" + "\n".join(found)


def test_imports_run_down_the_layers_but_the_listed_ones():
    packages = {m.split(".")[1] for m in module_names() if m.count(".") >= 2} - {e.split(".")[1] for e in ENTRY}
    assert packages <= set(LAYERS), f"packages with no place in LAYERS: {sorted(packages - set(LAYERS))}"
    up = upward_imports(import_graph())
    assert set(up) == set(UPWARD), (f"imports that run up the layers ({' < '.join(LAYERS)}): new "
                                    f"{sorted(set(up) - set(UPWARD))}, gone {sorted(set(UPWARD) - set(up))}")
    assert len(UPWARD) <= 4


def test_backends_import_nothing_from_launch():
    graph = import_graph()
    found = [f"{m} -> {t}" for m in graph if m.startswith("launcher.backends") for t in graph[m]
             if t.startswith("launcher.launch")]
    assert not found, found


GATHERERS = {"Facts", "HostFacts", "parse_hostfile", "parse_rank_table", "dataset_facts", "layer_facts",
             "activation_facts", "model_facts_on_meta", "inspect_user_recipe", "check_pipeline"}
"""What makes a fact the plan reads: the facts' values, the readers of the cluster files, of your Dataset, of a model
on the meta device and the checks of your code."""
RANK_SIDE = {("launcher.runtime.prepare", "model_facts_on_meta"): "runtime.prepare() reads your model's tables in a rank"}


def test_every_fact_is_gathered_under_launcher_facts():
    modules = module_names()
    found = []
    for name, path in modules.items():
        if name.startswith("launcher.facts"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if called in GATHERERS and (name, called) not in RANK_SIDE:
                    found.append(f"{name}: {called}(...)")
    assert not found, "facts gathered outside launcher/facts/:\n" + "\n".join(found)
