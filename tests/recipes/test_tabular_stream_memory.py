"""A streamed data=tabular source's memory does not grow with the row groups it reads: Arrow's pool (mimalloc) kept
what each read freed, so a rank's memory grew with the held-out set an evaluation streamed (Encoder.read gives it
back). Measured in a fresh process, which reads and nothing else: its RSS (VmRSS) before the source is built, then
after each pass over the held-out row groups, as evaluations read them (on the stream's reading thread)."""

import json
import subprocess
import sys

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GROUPS, ROWS, TEXT = 12, 20_000, 4
"""Row groups (half of them held out), rows in each, high-cardinality text columns (hashed)."""
PASSES = 4

READER = """
import json, sys
import pyarrow.parquet  # noqa: F401 (imported first, as in a rank, with torch: their memory is not the stream's)
import torch  # noqa: F401
from launcher.recipes.wide_deep._tabular_stream import StreamedTabular

def rss():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024

before = rss()
src = StreamedTabular.of(sys.argv[1], "label", "1", "", [], [], [], 0.5, None, [], 0, 1000)
passes = []
for _ in range(int(sys.argv[2])):
    for batch in src.eval_batches(0, 1, 1024, 0):
        pass
    passes.append(rss())
print(json.dumps({"before": before, "passes": passes, "groups": len(src.layout.eval)}))
"""


def _write(path) -> None:
    rng = np.random.default_rng(0)
    schema = pa.schema([("label", pa.int8()), ("x", pa.float64())] + [(f"c{j}", pa.string()) for j in range(TEXT)])
    with pq.ParquetWriter(path / "part-0.parquet", schema) as w:
        for _ in range(GROUPS):
            cols = {"label": rng.integers(0, 2, ROWS).astype(np.int8), "x": rng.normal(size=ROWS)}
            cols |= {f"c{j}": [f"{v:x}" for v in rng.integers(0, 1 << 20, ROWS)] for j in range(TEXT)}
            w.write_table(pa.table(cols, schema=schema), row_group_size=ROWS)


def test_evaluations_that_stream_the_held_out_row_groups_again_and_again_hold_the_memory_of_one(tmp_path):
    _write(tmp_path)
    out = subprocess.run([sys.executable, "-c", READER, str(tmp_path), str(PASSES)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["groups"] == GROUPS // 2
    mib = [(r - got["before"]) / 2**20 for r in got["passes"]]
    # Measured on the 2-core VM: +38 MiB over the reads, the same after every pass; 85-111 MiB, moving from pass to
    # pass, when Arrow's pool kept what it freed. What a rank needs: one row group as read and decoded
    # (~1 MiB here), its dictionaries' texts while they are hashed, the statistics sample, numpy's and pyarrow's own.
    assert max(mib) <= 60, f"the stream's memory after each pass (MiB over the process before it): {mib}"
    assert max(mib[1:]) - mib[0] <= 10, f"it grew after the first pass over the held-out row groups: {mib}"
