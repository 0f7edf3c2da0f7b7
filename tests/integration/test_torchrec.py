"""A TorchRec DLRM from YAML (docs/torchrec.md's project, written to a folder outside the repository verbatim): an
EmbeddingBagCollection of 8 tables, KeyedJaggedTensor batches from the user's collate function, dense features. On 2
gloo ranks it trains with device tables, host tables, parameter-server tables and the optimizer on the CPU, and with
raw 64-bit ids hashed inside the lookups, and as 2 pipeline stages with host tables and the optimizer on the CPU; host and ps tables match device tables with the same row-sparse optimizer
per step, and every combination matches one process (bench/composability.py trains all of them in one launched job
per world size, through the worker's own code). One real run checkpoints, reads its checkpoint back and reports the
hashed tables' collisions."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_torchrec, run_cli

needs_torchrec()
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import composability  # noqa: E402

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "torchrec.md"
_FILE = re.compile(r"^`([\w./]+\.(?:py|yaml))`:\n```\w+\n(.*?)^```", re.MULTILINE | re.DOTALL)
TABLES = [f"c{i}" for i in range(8)]
HASHED = ["+data.raw_ids=true", *(f"tables.{t}.hash=1000" for t in TABLES)]
INTENTS = {
    "device tables": ["placement.tables.c0=device"],  # every table out of the parts, on the device, row-sparse
    "host tables": ["placement.host_device_mix=1"],
    "ps": ["placement.ps=true"],
    "CPU optimizer": ["optimizer.target=CPU"],
    "raw ids hashed": HASHED,
    "pp 2": ["parallel.pipeline_stages=2"],  # cut from the forward's graph: the KeyedJaggedTensor stays on stage 0
}
COMBOS = [("device tables",), ("host tables",), ("ps",), ("CPU optimizer",), ("host tables", "raw ids hashed"),
          ("host tables", "pp 2", "CPU optimizer")]
BASE = ["data.n=2048", "eval_data.n=256", "batch.global_size=64", "batch.micro_batches=2", "eval.max_batches=2",
        "optimizer.lr=0.02"]
"""Two micro-batches a step (gradient accumulation in every layout) at a rate where each step moves the loss by
far more than the tolerance."""


def write_project(folder: Path) -> Path:
    files = dict(_FILE.findall(DOC.read_text()))
    assert {"clicks/data.py", "conf/recipe/dlrm.yaml"} <= set(files), files
    for name, text in {**files, "clicks/__init__.py": ""}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("my_recsys"))


@pytest.fixture(scope="module")
def matrix(project) -> dict:
    result = composability.run(["dlrm"], steps=3, workdir=project, intents=INTENTS, combos=COMBOS, world=2,
                               config_dir=str(project / "conf"), base=BASE)
    print(composability.table(result))
    return {tuple(r["combo"]): r for r in result["rows"]}


def test_every_combination_trains_as_one_process(matrix):
    for combo, r in matrix.items():
        assert r["status"] == "trained", r
        assert r["worst"] <= 1e-5, (combo, r["losses"], r["reference"])
        assert r["losses"][-1] < r["losses"][0], (combo, r["losses"])
        assert composability.held_as_planned(r), (combo, r["held"], r["planned"])  # tables where the plan says
        assert 0.5 < r["eval"]["auc"] <= 1 and composability.worst([r["eval"]["loss"]],
                                                                    [r["reference_eval"]["loss"]]) <= 1e-5, r


def test_host_and_ps_tables_match_device_tables(matrix):
    device = matrix[("device tables",)]["losses"]
    for combo in (("host tables",), ("ps",)):
        assert composability.worst(matrix[combo]["losses"], device) <= 1e-5, (combo, matrix[combo]["losses"], device)
    assert matrix[("device tables",)]["parts"] == "ddp" and matrix[("CPU optimizer",)]["parts"] == "deepspeed"


def test_a_run_checkpoints_its_torchrec_tables_and_reports_hash_collisions(project):
    res = run_cli(["--config-dir", "conf", "recipe=dlrm", "smoke=true", "placement.ps=true", "output.run_name=smoke",
                   *BASE, *HASHED], project)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = project / "log_output" / "smoke"
    events = [json.loads(line) for line in (run / "rank.1" / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "checkpoint_verified" for e in events)  # saved, read back, the same state
    assert (run / "checkpoints" / "step2" / "tables").is_dir()
    summary = json.loads((run / "summary.json").read_text())
    plan = json.loads((run / "plan.json").read_text())
    names = {t["alias"]: t for t in plan["placement"]["tables"]}
    assert set(names) == set(TABLES) and all(t["shards"] == 2 and t["hash_buckets"] == 1000 for t in names.values())
    paths = {t["name"] for t in names.values()}
    assert set(summary["hashing"]) == paths
    counts = summary["hashing"][names["c0"]["name"]]
    assert counts["ids"] > 0 and 0 <= counts["collided"] <= counts["distinct_ids_per_batch"]


WRAPPER = '''
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from clicks.data import FEATURES, collate


def collate_plain(items):
    """(dense, lengths, ids, label): plain tensors, the KeyedJaggedTensor is the model's to build."""
    dense, sparse, label = collate(items)
    return dense, sparse.lengths(), sparse.values(), label


class Wrapped(torch.nn.Module):
    """Builds the KeyedJaggedTensor from plain tensors inside its forward, then calls TorchRec's DLRM."""

    def __init__(self, dlrm):
        super().__init__()
        self.dlrm = dlrm

    def forward(self, dense, lengths, values):
        return self.dlrm(dense, KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths))
'''


def test_a_model_wrapping_dlrm_pipelines_as_one_process(project):
    """The split descends into a single-child wrapper: its DLRM's arches are the layers (before, 'has one layer
    (dlrm): nothing to cut'); 2 stages, with host tables too, equal one process."""
    (project / "clicks" / "wrap.py").write_text(WRAPPER)
    recipe = (project / "conf" / "recipe" / "dlrm.yaml").read_text()
    model = recipe[recipe.index("model:\n"):recipe.index("data:")]
    wrapped = "model:\n  _target_: clicks.wrap.Wrapped\n  dlrm:\n" + "".join(
        f"  {line}\n" for line in model.splitlines()[1:])
    recipe = recipe.replace(model, wrapped).replace("name: dlrm}", "name: dlrmw}")
    (project / "conf" / "recipe" / "dlrmw.yaml").write_text(
        recipe.replace("collate_fn: clicks.data.collate}", "collate_fn: clicks.wrap.collate_plain}"))
    combos = [("pp 2",), ("host tables", "pp 2")]
    result = composability.run(["dlrmw"], steps=3, workdir=project, intents=INTENTS, combos=combos, world=2,
                               config_dir=str(project / "conf"), base=BASE)
    rows = {tuple(r["combo"]): r for r in result["rows"]}
    for combo in combos:
        r = rows[combo]
        assert r["status"] == "trained", r
        assert r["worst"] <= 1e-5, (combo, r["losses"], r["reference"])
