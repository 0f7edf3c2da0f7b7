"""Parameter-server mode (issue 23): the sharded table store against the replicated one, on wide_deep over gloo.

    .venv/bin/python bench/ps_bench.py [--worlds 2 4] [--rows-per-table 10000 100000] [--batch 2048]
                                       [--steps 30] [--warmup 5] [--repeats 3] [--no-pin] [--json PATH]
    .venv/bin/python bench/ps_bench.py --quick      (recipe sizes only, 2 repeats of 6 steps: a smoke run)

What runs: the recipe's own WideDeep (13 dense + 26 categorical fields, embed_dim 16, MLP [256, 128]) on its
synthetic_ctr data, at the recipe's global batch (2048, split over the ranks), with its table optimizers (lazy Adam
on deep_embedding, FTRL on wide_embedding, the recipe's lr / l1 / l2 / accumulator), both tables on the host.
``launcher.tables.build_tables`` builds the store from TablePlans: ``shards=1`` gives ReplicatedTables (a whole copy
per rank, sparse gradients averaged by three all-gathers, launcher/tables/sparse_comm.py reduce_tables),
``shards=world`` gives ShardedTables (one range block of rows per rank, lookups and gradients as all-to-alls,
launcher/tables/ps_comm.py). The dense part trains with DDP (gloo) and torch Adam, the same in both.

Each run is a fresh set of ``world`` gloo processes (this script with --rank): build, --warmup untimed steps, a
barrier, --steps timed steps, a barrier. Samples/s = global batch x steps / the slowest rank's time between the
barriers. The data of every step is drawn before the timed steps (both stores see the same samples), so the timing
is the model, the tables and their exchanges. Replicated and sharded runs alternate, round by round, order flipped
every round (R S, S R, ...), so a slow minute of the shared machine hits both; one thread per rank (2 cores: world
4 oversubscribes 2x, as CI does), rank r pinned to core r mod cores (--no-pin: the kernel places them; on 2 cores
that made runs bimodal, e.g. world 4 replicated at 20k or 35k samples/s, as two busy ranks shared one core).

Printed, per table size and world size:
  samples/s    median over repeats [min-max]; sharded/replicated: ratio of the medians [min-max of each round's]
  store ms     time per step inside the store (lookups, collect, step: exchanges and the row optimizers), slowest
               rank, median over repeats
  B sent       payload bytes one rank sends per step for the tables. Sharded: ``store.bytes_sent`` (ps_comm's
               count: counts + unique ids out, the rows it serves back, the gradients out), mean over the ranks
               and steps. Replicated (every rank the same, the buffers being padded): what reduce_tables' three
               all-gathers send from one rank to the world-1 others: the header (int64 counts and shares of the 2
               tables), the rows (int64 unique ids, padded to the largest rank's count: the two tables share their
               rows) and the values (fp32 (16 + 1) per unique id, padded the same), each x (world - 1), computed
               here from the data. Both are cross-checked against a count taken at the collectives inside the
               ranks (_all_gather / _all_to_all wrapped), printed below the table
  resident     table bytes one rank holds (weights + optimizer states, from store.held(): largest rank) and as a
               share of one whole copy; job = all ranks together, in copies of the tables
Then, from the data alone (the same steps): the dedup ratio on synthetic_ctr (ids looked up per step / unique ids,
per rank and over the global batch; both tables use one ids tensor, so one lookup's ids), and the owners' load under
the range partition (launcher/tables/partition.py): unique ids each owner serves per step (summed over the ranks
asking), per owner, and max/mean; and the rows each rank's table optimizers update per step (replicated: every
unique id of the global batch, on every rank; sharded: those in the busiest owner's block). Not a test: numbers
depend on the machine; the default run takes ~4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DENSE, FIELDS, DIM, HIDDEN = 13, 26, 16, [256, 128]  # conf/recipe/wide_deep.yaml
RECIPE_ROWS, RECIPE_BATCH, RECIPE_SEED = 10_000, 2048, 1234  # model.rows_per_table, batch.global_size, trainer.seed
TABLES = {  # conf/recipe/wide_deep.yaml tables: (dim, optimizer, lr, l1, l2, initial_accumulator)
    "deep_embedding": (DIM, "lazy_adam", 1e-3, 0.0, 0.0, 0.1),
    "wide_embedding": (1, "ftrl", 0.1, 1e-8, 1e-8, 1.0),
}
STORES = {"replicated": lambda world: 1, "sharded": lambda world: world}  # store -> TablePlan.shards


def table_plans(rows_per_table: int, shards: int) -> tuple:
    from launcher.plan import TablePlan

    return tuple(TablePlan(name=name, rows=FIELDS * rows_per_table, dim=dim, location="host", optimizer=opt, lr=lr,
                           betas=(0.9, 0.999), eps=1e-8, l1=l1, l2=l2, lr_power=-0.5, initial_accumulator=acc,
                           shards=shards)
                 for name, (dim, opt, lr, l1, l2, acc) in TABLES.items())


def one_copy_bytes(rows_per_table: int) -> int:
    """Both tables' weights and optimizer states, one whole copy: lazy Adam keeps 2 moments (rows x 2 x 16), FTRL
    an accumulator and a linear term (rows x 1 each); fp32."""
    rows = FIELDS * rows_per_table
    return 4 * rows * (DIM * 3 + 1 * 3)


def global_batches(rows_per_table: int, batch: int, count: int) -> list:
    from launcher.recipes.wide_deep.data import SyntheticCTR

    data = SyntheticCTR(DENSE, FIELDS, rows_per_table, 0)  # data.seed 0; the stream follows trainer.seed
    return [data.global_micro_batch(i, batch, RECIPE_SEED) for i in range(count)]


def table_ids(ids: torch.Tensor, rows_per_table: int) -> torch.Tensor:
    """The rows WideDeep looks up in both tables: field f's ids offset by f x rows_per_table."""
    return ids + torch.arange(FIELDS) * rows_per_table


# -- inside one rank ----------------------------------------------------------------------------------------------
def rank_main(spec: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    import launcher.tables.ps_comm as ps_comm
    import launcher.tables.sparse_comm as sparse_comm
    from launcher.contract import dp_share
    from launcher.recipes.wide_deep.model import WideDeep
    from launcher.tables import build_tables

    rank, world, rows_per = spec["rank"], spec["world"], spec["rows_per_table"]
    if spec["pin"]:  # before any thread starts: gloo's and torch's threads inherit it
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("stage",))
    torch.manual_seed(RECIPE_SEED)
    model = WideDeep(DENSE, FIELDS, rows_per, DIM, HIDDEN)
    shards = STORES[spec["store"]](world)
    store = build_tables([model], table_plans(rows_per, shards), torch.device("cpu"), torch.float32,
                         dist.group.WORLD, mesh.get_group(), mesh)
    if type(store).__name__ != ("ShardedTables" if shards > 1 else "ReplicatedTables"):
        raise RuntimeError(f"build_tables gave a {type(store).__name__} for shards={shards}")
    ddp = DistributedDataParallel(model)  # the dense part: wide_dense and the MLP (the tables left the model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    micro = spec["batch"] // world
    steps, warmup = spec["steps"], spec["warmup"]
    batches = [dp_share(b, rank, micro) for b in global_batches(rows_per, spec["batch"], warmup + steps)]

    # Counters: bytes at the collectives the stores call (module functions, looked up at call time), store time.
    count = {"gathered": 0, "to_all": 0, "reduces": 0, "reduce_bytes": 0, "store_s": 0.0}

    def counted_gather(t, group, w, _orig=sparse_comm._all_gather):
        count["gathered"] += t.numel() * t.element_size() * (w - 1)  # this rank's buffer to each other rank
        return _orig(t, group, w)

    def counted_to_all(send, sent, received, group, _orig=ps_comm._all_to_all):
        if len(sent) > 1:  # what goes to the other ranks (the rows for this rank stay)
            me = dist.get_rank(group)
            row = send[0].numel() * send.element_size() if send.numel() else send.element_size()
            count["to_all"] += row * sum(n for d, n in enumerate(sent) if d != me)
        return _orig(send, sent, received, group)

    sparse_comm._all_gather, ps_comm._all_to_all = counted_gather, counted_to_all
    if hasattr(store, "_reduce_sum"):  # the sharded store's two small all-reduces a step (present, finite)
        def counted_reduce(t, _orig=store._reduce_sum):
            count["reduces"] += 1
            count["reduce_bytes"] += t.numel() * t.element_size()
            return _orig(t)
        store._reduce_sum = counted_reduce
    for method in ("lookup", "collect", "step"):
        def timed(*a, _orig=getattr(store, method), **k):
            t0 = time.perf_counter()
            try:
                return _orig(*a, **k)
            finally:
                count["store_s"] += time.perf_counter() - t0
        setattr(store, method, timed)

    losses, per_step = [], []
    for i, ((dense, ids), labels) in enumerate(batches):
        if i == warmup:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
        count.update(gathered=0, to_all=0, reduces=0, reduce_bytes=0, store_s=0.0)
        loss = loss_fn(ddp(dense, ids), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        store.collect()
        opt.step()
        store.step()
        losses.append(loss.item())
        if i >= warmup:
            per_step.append({**count, "store_bytes_sent": getattr(store, "bytes_sent", None)})
    dist.barrier()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    held = sum(w.numel() * w.element_size() + sum(s.numel() * s.element_size() for s in states)
               for _, w, states in store.held().values())
    dense_grad_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters())
    dist.destroy_process_group()
    return {"wall_s": wall, "cpu_s": cpu, "losses": losses, "per_step": per_step,
            "held_bytes": held, "dense_grad_bytes": dense_grad_bytes}


# -- the parent ---------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(store: str, world: int, rows_per: int, a: argparse.Namespace) -> dict:
    """One fresh process group of ``world`` ranks; their results merged."""
    threads = max(1, len(os.sched_getaffinity(0)) // world)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(world):
            spec = {"rank": r, "world": world, "port": port, "store": store, "rows_per_table": rows_per,
                    "batch": a.batch, "steps": a.steps, "warmup": a.warmup, "threads": threads,
                    "pin": a.pin, "out": f"{tmp}/rank{r}.json"}
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
            with open(f"{tmp}/rank{r}.err", "w") as err:
                procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--rank",
                                               json.dumps(spec)], cwd=ROOT, env=env, stdout=err, stderr=err))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=600))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if codes != [0] * world:
            logs = "".join(f"---- rank {r} (exit {c}) ----\n{Path(f'{tmp}/rank{r}.err').read_text()[-3000:]}\n"
                           for r, c in enumerate(codes))
            raise RuntimeError(f"{store}, world {world}, {rows_per} rows per field failed:\n{logs}")
        ranks = [json.loads(Path(f"{tmp}/rank{r}.json").read_text()) for r in range(world)]
    wall = max(x["wall_s"] for x in ranks)
    steps = len(ranks[0]["per_step"])
    return {
        "samples_per_s": a.batch * steps / wall,
        "wall_s": wall,
        "store_ms": max(sum(s["store_s"] for s in x["per_step"]) / steps for x in ranks) * 1000,
        "cpu_s": [x["cpu_s"] for x in ranks],
        "losses": ranks[0]["losses"],
        "held_bytes": [x["held_bytes"] for x in ranks],
        "dense_grad_bytes": ranks[0]["dense_grad_bytes"],
        "per_step": [x["per_step"] for x in ranks],  # per rank, per timed step
    }


def replicated_bytes(batches: list, world: int, rows_per: int) -> list[int]:
    """Per step: bytes each rank sends in reduce_tables' three all-gathers (every rank the same: the buffers are
    padded to the largest rank's). Header: counts + shares of the 2 tables, int64. Rows: the unique ids of the
    lookup, int64 (wide_embedding shares deep_embedding's rows, so they travel once). Values: fp32 (16 + 1) per
    unique id. Each to the world - 1 other ranks (a ring all-gather passes the same amount: equal buffers)."""
    micro = batches[0][1].shape[0] // world
    out = []
    for (_, ids), _ in batches:
        rows = table_ids(ids, rows_per)
        most = max(len(torch.unique(rows[r * micro:(r + 1) * micro])) for r in range(world))
        header = 8 * 2 * len(TABLES)
        out.append((world - 1) * (header + 8 * most + 4 * (DIM + 1) * most))
    return out


def dedup_and_balance(batches: list, world: int, rows_per: int) -> dict:
    """Ids looked up per step vs unique (per rank, global), and the unique ids each owner serves per step."""
    from launcher.tables.partition import RowPartition

    micro = batches[0][1].shape[0] // world
    part = RowPartition(FIELDS * rows_per, world)
    looked, uniq, g_looked, g_uniq, served, imbalance, stepped = [], [], [], [], [], [], []
    for (_, ids), _ in batches:
        rows = table_ids(ids, rows_per)
        g_looked.append(rows.numel())
        everyone = torch.unique(rows)
        g_uniq.append(len(everyone))
        stepped.append(max(part.counts(everyone)))  # the rows the busiest owner's optimizers update
        load = torch.zeros(world, dtype=torch.int64)
        for r in range(world):
            u = torch.unique(rows[r * micro:(r + 1) * micro])
            looked.append(micro * FIELDS)
            uniq.append(len(u))
            load += torch.tensor(part.counts(u))
        served.append(load.tolist())
        imbalance.append(load.max().item() / load.float().mean().item())
    return {"ids_per_rank": statistics.mean(looked), "unique_per_rank": statistics.mean(uniq),
            "ids_global": statistics.mean(g_looked), "unique_global": statistics.mean(g_uniq),
            "served_per_owner": [statistics.mean(s[o] for s in served) for o in range(world)],
            "stepped_sharded": statistics.mean(stepped),
            "max_over_mean": statistics.mean(imbalance), "max_over_mean_worst": max(imbalance)}


def spread(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="ranks (gloo processes) per run")
    ap.add_argument("--rows-per-table", type=int, nargs="+", default=[RECIPE_ROWS, 100_000],
                    help="rows per categorical field (26 fields per table): the recipe's 10,000 and a bigger one")
    ap.add_argument("--batch", type=int, default=RECIPE_BATCH, help="global batch (split over the ranks)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each store, interleaved")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="let the kernel place the ranks (default: rank r on core r mod cores)")
    ap.add_argument("--quick", action="store_true", help="smoke run: recipe sizes, --steps 6 --warmup 2 --repeats 2")
    ap.add_argument("--json", type=Path, help="also write every run's numbers here")
    ap.add_argument("--rank", help=argparse.SUPPRESS)  # inside a rank: its spec as JSON
    a = ap.parse_args()
    if a.rank:
        spec = json.loads(a.rank)
        Path(spec["out"]).write_text(json.dumps(rank_main(spec)))
        return
    if a.quick:
        a.rows_per_table, a.steps, a.warmup, a.repeats = [RECIPE_ROWS], 6, 2, 2
    if any(a.batch % w for w in a.worlds) or min(a.worlds) < 2:
        ap.error(f"--worlds must be >= 2 and divide --batch={a.batch}; got {a.worlds}")
    started = time.perf_counter()
    results: dict[tuple[int, int, str], list[dict]] = {}
    for rows_per in a.rows_per_table:
        for world in a.worlds:
            for rep in range(a.repeats):  # interleaved, the order flipped every round
                order = list(STORES) if rep % 2 == 0 else list(STORES)[::-1]
                for store in order:
                    x = run(store, world, rows_per, a)
                    results.setdefault((rows_per, world, store), []).append(x | {"round": rep})
                    print(f"{rows_per:,} rows/field, world {world}, round {rep + 1}/{a.repeats}, {store}: "
                          f"{x['samples_per_s']:,.0f} samples/s, store {x['store_ms']:.1f} ms/step", file=sys.stderr)

    print(f"\nwide_deep (recipe sizes: {DENSE} dense + {FIELDS} categorical fields, embed_dim {DIM}, MLP {HIDDEN}; "
          f"lazy Adam + FTRL tables on the host), global batch {a.batch}, synthetic_ctr; {a.steps} timed steps after "
          f"{a.warmup} warm-up per run, {a.repeats} runs per store interleaved; {len(os.sched_getaffinity(0))} cores, "
          f"1 thread per rank, gloo\n")
    print("| rows (table) | world | store | samples/s median [min-max] | sharded/replicated [per round] | "
          "store ms/step | B sent/rank/step | resident tables/rank (of one copy) | job total |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    checks, facts = [], {}
    for rows_per in a.rows_per_table:
        whole = one_copy_bytes(rows_per)
        for world in a.worlds:
            batches = global_batches(rows_per, a.batch, a.warmup + a.steps)[a.warmup:]
            facts[(rows_per, world)] = dedup_and_balance(batches, world, rows_per)
            rep_bytes = replicated_bytes(batches, world, rows_per)
            rep, sh = results[(rows_per, world, "replicated")], results[(rows_per, world, "sharded")]
            base = statistics.median(x["samples_per_s"] for x in rep)
            rounds = [s["samples_per_s"] / r["samples_per_s"] for r, s in zip(rep, sh)]
            for store, runs in (("replicated", rep), ("sharded", sh)):
                sps = [x["samples_per_s"] for x in runs]
                if store == "replicated":
                    sent = statistics.mean(rep_bytes)
                    counted = [[s["gathered"] for s in rank] for x in runs for rank in x["per_step"]]
                    ok = all(c == rep_bytes for c in counted)
                    checks.append(f"{rows_per:,} rows/field, world {world}, replicated: the formula "
                                  f"{'equals' if ok else 'DIFFERS FROM'} the bytes counted at _all_gather on every "
                                  f"rank and step" + ("" if ok else f" (formula {rep_bytes[:3]}..., counted "
                                                                    f"{counted[0][:3]}...)"))
                    ratio = "1"
                else:
                    per_rank = [[s["store_bytes_sent"] for s in rank] for rank in runs[0]["per_step"]]
                    sent = statistics.mean(b for rank in per_rank for b in rank)
                    diff = [s["store_bytes_sent"] - s["to_all"] for x in runs for rank in x["per_step"] for s in rank]
                    reduces = runs[0]["per_step"][0][0]
                    checks.append(f"{rows_per:,} rows/field, world {world}, sharded: store.bytes_sent - bytes "
                                  f"counted at _all_to_all (to other ranks) = {min(diff)}..{max(diff)} B/step; plus "
                                  f"{reduces['reduces']} all-reduces/step of {reduces['reduce_bytes']} B in all "
                                  f"(present flags, finite check), not in bytes_sent; per-rank mean bytes_sent "
                                  + ", ".join(f"{statistics.mean(r) / 1e3:,.0f} kB" for r in per_rank))
                    ratio = (f"{statistics.median(sps) / base:.2f} "
                             f"[{min(rounds):.2f}-{max(rounds):.2f}]")
                held = max(runs[0]["held_bytes"])
                job = sum(runs[0]["held_bytes"]) / whole
                print(f"| {FIELDS * rows_per:,} | {world} | {store} | {spread(sps)} | {ratio} | "
                      f"{statistics.median(x['store_ms'] for x in runs):.1f} | {sent / 1e3:,.0f} kB | "
                      f"{held / 1e6:,.1f} MB ({held / whole:.0%}) | {job:.2f} copies |")
            losses = [max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(s["losses"], r["losses"]))
                      for r, s in zip(rep, sh)]
            checks.append(f"{rows_per:,} rows/field, world {world}: rank 0's per-step losses, sharded vs replicated "
                          f"in the same round: max relative difference {max(losses):.1e}")
    dense_bytes = results[(a.rows_per_table[0], a.worlds[0], "replicated")][0]["dense_grad_bytes"]
    print(f"\nOne copy of the tables (weights + lazy Adam moments + FTRL accumulator and linear, fp32) = "
          f"26 x rows/field x (16 x 3 + 1 x 3) x 4 B. Both stores also all-reduce the dense gradients (DDP): "
          f"{dense_bytes / 1e3:,.0f} kB a step, not in B sent.")
    for line in checks:
        print(f"  check: {line}")

    print("\nDedup on synthetic_ctr (one lookup's ids feed both tables) and owners' load under the range partition:\n")
    print("| rows (table) | world | ids/rank/step | unique/rank/step | dedup/rank | ids/step (global) | "
          "unique (global) | dedup global | unique ids served per owner per step | max/mean [worst step] | rows stepped/rank/step "
          "(replicated / sharded, busiest) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for (rows_per, world), f in facts.items():
        print(f"| {FIELDS * rows_per:,} | {world} | {f['ids_per_rank']:,.0f} | {f['unique_per_rank']:,.0f} | "
              f"{f['ids_per_rank'] / f['unique_per_rank']:.2f} | {f['ids_global']:,.0f} | {f['unique_global']:,.0f} | "
              f"{f['ids_global'] / f['unique_global']:.2f} | "
              f"{' / '.join(f'{s:,.0f}' for s in f['served_per_owner'])} | "
              f"{f['max_over_mean']:.3f} [{f['max_over_mean_worst']:.3f}] | "
              f"{f['unique_global']:,.0f} / {f['stepped_sharded']:,.0f} |")
    print(f"\n{time.perf_counter() - started:.0f} s in all", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                      "runs": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in results.items()},
                                      "dedup_balance": {f"{k[0]}/{k[1]}": v for k, v in facts.items()}}, indent=1))


if __name__ == "__main__":
    main()
