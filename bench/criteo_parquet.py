"""A Criteo-shaped click log as a directory of Parquet files, with a planted signal (so AUC means something).

    .venv/bin/python bench/criteo_parquet.py OUT_DIR [--rows 5000000] [--group 250000] [--groups-per-file 10]
                                             [--seed 0] [--ids hex|int64] [--workers 2]

Columns, as in Criteo's Kaggle/Terabyte logs: ``label`` (int8, 0/1), ``I1``..``I13`` (int64 counts, some missing)
and ``C1``..``C26`` (categorical). Field f's values are ranks k in [1, V_f] drawn from a bounded Zipf law (P(k) ∝
k^-ZIPF_S, V_f Criteo's own cardinalities per field, from 3 to 10 M) and written as raw 64-bit ids: splitmix64 of
(field, k), as 16 hex digits (``--ids hex``, Criteo writes 8) or as int64 (``--ids int64``: then give
``data.categorical=[C1,...,C26]``, since a Parquet number column is continuous). Some fields miss values (null), as
Criteo's do.

The click probability is sigmoid(bias + sum_d w_d log1p(I_d) + sum_f e_f(k_f) + e(k_C1, k_C2)) with per-id effects
e_f(k) = EFFECT * u(f, k) * k^-DECAY (u uniform in [-1, 1) from a hash: frequent ids matter more) and one pairwise
interaction; ``bayes_auc`` printed at the end is the AUC of those true probabilities on the first row group, the
ceiling of any model. Every row group is drawn from its own seed (seed, group): the files are the same whatever
--workers, and a 5 M-row directory is the first 5 M rows of a 50 M-row one with the same --group and --seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

CARDINALITIES = [1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 8_351_593, 3_194, 27,
                 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15, 286_181, 105, 142_572]
"""Distinct values of C1..C26 in Criteo's Kaggle log."""
MISSING = {2: 0.03, 3: 0.03, 11: 0.03, 15: 0.03, 18: 0.44, 19: 0.44, 20: 0.03, 21: 0.76, 24: 0.44, 25: 0.44}
"""Share of nulls of some categorical fields (0-based), roughly Criteo's."""
DENSE_MISSING = [0.45, 0.0, 0.2, 0.2, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.2]
ZIPF_S = 1.1
EFFECT, DECAY, BIAS = 1.0, 0.25, -1.6
DENSE, SPARSE = 13, 26
HEX = np.array([f"{i:02x}".encode() for i in range(256)], "S2").view(np.uint16)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = (x + np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(field: int, k: np.ndarray, salt: int) -> np.ndarray:
    """u in [-1, 1) per (field, k), the same in every row group and process."""
    h = _splitmix64(k.astype(np.uint64) * np.uint64(1_000_003) + np.uint64(field * 7919 + salt * 104729))
    return (h >> np.uint64(11)).astype(np.float64) / 2.0**53 * 2 - 1


def _zipf(rng: np.random.Generator, n: int, v: int) -> np.ndarray:
    """n ranks in [1, v], P(k) ∝ k^-ZIPF_S (inverse CDF of the bounded continuous law, floored)."""
    a = 1 - ZIPF_S
    k = ((v ** a - 1) * rng.random(n) + 1) ** (1 / a)
    return np.minimum(k.astype(np.int64), v)


def _hex(ids: np.ndarray):
    """uint64 ids -> a pyarrow string array of 16 hex digits each."""
    import pyarrow as pa

    digits = HEX[ids.astype(">u8").view(np.uint8).reshape(len(ids), 8)]
    return pa.array(np.ascontiguousarray(digits).view("S16").reshape(len(ids))).cast(pa.string())


def row_group(seed: int, group: int, rows: int, ids: str = "hex"):
    """(pyarrow Table of one row group, its true click probabilities)."""
    import pyarrow as pa

    rng = np.random.default_rng([seed, group])
    weights = np.random.default_rng([seed, 1 << 20]).normal(0, 0.15, DENSE)
    logit = np.full(rows, BIAS)
    cols = {}
    for d in range(DENSE):
        counts = np.floor(rng.lognormal(1.0 + 0.2 * d, 1.2, rows)).astype(np.int64)
        missing = rng.random(rows) < DENSE_MISSING[d]
        logit += np.where(missing, 0.0, weights[d] * (np.log1p(counts) - 1.5))
        cols[f"I{d + 1}"] = pa.array(counts, mask=missing)
    ranks = []
    for f, v in enumerate(CARDINALITIES):
        k = _zipf(rng, rows, v)
        missing = rng.random(rows) < MISSING.get(f, 0.0)
        logit += np.where(missing, 0.0, EFFECT * _uniform(f, k, seed) * k.astype(np.float64) ** -DECAY)
        ranks.append(k)
        uniq, inverse = np.unique(k, return_inverse=True)
        raw = _splitmix64(uniq.astype(np.uint64) + np.uint64((f + 1) << 40))
        dictionary = _hex(raw) if ids == "hex" else pa.array(raw.view(np.int64))
        indices = pa.array(inverse.astype(np.int32), mask=missing)
        cols[f"C{f + 1}"] = pa.DictionaryArray.from_arrays(indices, dictionary)
    pair = ranks[0] * CARDINALITIES[1] + ranks[1]
    logit += EFFECT * _uniform(99, pair, seed) * ((ranks[0] * ranks[1]).astype(np.float64) ** -DECAY)
    p = 1 / (1 + np.exp(-logit))
    label = (rng.random(rows) < p).astype(np.int8)
    table = pa.table({"label": pa.array(label), **cols})
    return table, p


def _write_file(out: str, seed: int, first_group: int, groups: int, rows_left: int, group_rows: int, ids: str):
    import pyarrow.parquet as pq

    path = Path(out) / f"part-{first_group // groups:05d}.parquet"
    writer = None
    written = 0
    for g in range(first_group, first_group + groups):
        n = min(group_rows, rows_left - written)
        if n <= 0:
            break
        table, _ = row_group(seed, g, n, ids)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema, compression="snappy", store_schema=False)
        writer.write_table(table, row_group_size=n)
        written += n
    if writer is not None:
        writer.close()
    return str(path), written


def write_criteo_parquet(out: str | Path, rows: int, group: int = 250_000, groups_per_file: int = 10, seed: int = 0,
                         ids: str = "hex", workers: int = 1) -> list[str]:
    """Write ``rows`` rows into ``out`` (created) as files of ``groups_per_file`` row groups of ``group`` rows (the
    last ones shorter); returns the files' paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_file = group * groups_per_file
    jobs = [(str(out), seed, start // group, groups_per_file, rows - start, group, ids)
            for start in range(0, rows, per_file)]
    if workers <= 1:
        return [_write_file(*j)[0] for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return [path for path, _ in pool.map(_write_file, *zip(*jobs))]


def bayes_auc(seed: int, rows: int = 200_000) -> float:
    """The AUC of the true click probabilities on row group 0's first ``rows`` rows (Mann-Whitney U by ranks)."""
    table, p = row_group(seed, 0, rows)
    y = table.column("label").to_numpy()
    order = np.argsort(p, kind="stable")
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    pos = y == 1
    return float((ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--group", type=int, default=250_000, help="rows per row group")
    ap.add_argument("--groups-per-file", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ids", choices=("hex", "int64"), default="hex")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args(argv)
    start = time.perf_counter()
    files = write_criteo_parquet(a.out, a.rows, a.group, a.groups_per_file, a.seed, a.ids, a.workers)
    size = sum(Path(f).stat().st_size for f in files)
    print(json.dumps({"out": a.out, "rows": a.rows, "files": len(files), "bytes": size,
                      "seconds": round(time.perf_counter() - start, 1), "bayes_auc": round(bayes_auc(a.seed), 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
