"""PURE planning of op-level sharding (MindSpore's semi-auto parallel) and tensor parallel, compiled to DTensor
placements on the mesh's tp dim.

Two sources, one result (``ShardingPlan``, one ``OpShard`` per operator):

- ``parallel.sharding: {fc1: [[2, 4], [4, 1]]}``: strategies per operator in MindSpore's notation over a recipe's
  ``operators()`` chain. A matmul strategy ``[[a, b], [b, c]]`` splits x (batch, in) a × b and w (in, out) b × c; the
  batch factor ``a`` is data parallelism (dp) and ``b × c`` the tensor-parallel group (tp), so every strategy's
  factors multiply to the world size. Operators without a strategy take the layout of their input
  (``parallel.search_mode=sharding_propagation``); where layouts differ, the redistribution is inserted and named.
- ``parallel.tp=N`` alone: the recipe's ``tp_plan()`` (Megatron-style colwise / rowwise Linear layers), which the
  worker applies with torch's ``parallelize_module``.

Layouts of an activation on the tp dim: R (Replicate), S (Shard on its last dim), P (Partial sums). Only
all-reduce, all-gather and local slicing are ever planned (gloo has no reduce_scatter): a row-split matmul's partial
output is reduced to R before its bias. Shapes are per dp rank unless called global; w is written (in, out), as
MindSpore does (torch's Linear stores it transposed)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from launcher.contract import Operator
from launcher.errors import did_you_mean

SEARCH_MODES = ("sharding_propagation",)


@dataclass(frozen=True)
class OpShard:
    """One operator's strategy, shapes and inserted collectives."""

    name: str
    """Module path in the model."""
    alias: str
    """Its MindSpore-style name (matmul, relu, matmul_1), also accepted as a key of parallel.sharding."""
    kind: str
    """matmul or elementwise (parallel.sharding); colwise or rowwise (parallel.tp)."""
    style: str
    """What the worker does: row | col | replicate (a matmul), elementwise, or the tp style (= kind)."""
    strategy: list[list[int]]
    """MindSpore's notation: [[batch, in], [in, out]] for a matmul, [[batch, width]] for an elementwise op."""
    given: bool
    """The user gave it; False: propagated from its input (or the recipe's tensor-parallel plan)."""
    input_layout: str
    """The layout on tp the op computes its input in: R or S (the worker redistributes to it)."""
    global_shapes: dict[str, list[int]]
    """x, w (in, out), out: whole tensors."""
    local_shapes: dict[str, list[int]]
    """x, w (in, out), out: what one rank holds and computes on."""
    partial: bool
    """Its out is partial sums over tp before the all-reduce."""
    collectives: tuple[str, ...]
    """The redistributions inserted at this operator, in words."""


@dataclass(frozen=True)
class ShardingPlan:
    source: str
    """parallel.sharding (strategies per operator) or parallel.tp (the recipe's tensor-parallel plan)."""
    search_mode: str
    dp: int
    tp: int
    ops: tuple[OpShard, ...] = ()
    gradients: str = ""
    """How gradients are averaged over dp, in words."""


def _shape(*dims: int) -> list[int]:
    return [int(d) for d in dims if d != 0]


def _fmt(shape: list[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _text(strategy: Any) -> str:
    return str(strategy).replace(" ", "")


def _strategy_problems(key: str, s: Any) -> list[str]:
    """Form only: a list of one or two lists of two positive integers."""
    ok = isinstance(s, list) and len(s) in (1, 2) and all(
        isinstance(r, list) and len(r) == 2 and all(isinstance(f, int) and not isinstance(f, bool) and f >= 1 for f in r)
        for r in s)
    if not ok:
        return [f"{key}={_text(s)} is not a strategy: give one list of factors per input, [[batch, in], [in, out]] "
                f"for a matmul or [[batch, width]] for an elementwise op, each a positive integer, e.g. {key}=[[2,4],[4,1]]."]
    return []


def _devices(s: list[list[int]]) -> int:
    """Devices a strategy spans: a × b for [[a, b]]; a × b × c for [[a, b], [b, c]] (b is one split, counted once)."""
    return s[0][0] * s[0][1] * (s[1][1] if len(s) == 2 else 1)


def sharding_degrees(sharding: dict[str, Any], world: int, world_words: str, dp: int,
                     tp: int) -> tuple[int | None, int | None, list[str]]:
    """(dp, tp) the strategies imply (their batch factor and the rest), or the problems: a product that is not the
    world size, batch factors that differ, degrees that contradict parallel.dp / parallel.tp."""
    problems: list[str] = []
    batch: dict[str, int] = {}
    for name, s in sharding.items():
        key = f"parallel.sharding.{name}"
        form = _strategy_problems(key, s)
        if form:
            problems += form
            continue
        n = _devices(s)
        if n != world:
            factors = " × ".join(str(f) for f in (s[0][0], s[0][1], *(s[1][1:] if len(s) == 2 else ())))
            a = s[0][0] if world % s[0][0] == 0 else world
            example = [[a, world // a], [world // a, 1]] if len(s) == 2 else [[a, world // a]]
            problems.append(f"{key}={_text(s)}: its factors multiply to {n} ({factors}), not the {world} devices "
                            f"(world_size: {world_words}). Make the product {world}, e.g. {key}={_text(example)}.")
            continue
        batch[name] = s[0][0]
    if problems or not batch:
        return None, None, problems
    first = next(iter(batch))
    for name, a in batch.items():
        if a != batch[first]:
            problems.append(f"parallel.sharding.{name} splits the batch {a} ways and parallel.sharding.{first} "
                            f"{batch[first]} ways: the batch factor is the data-parallel degree, one for the whole "
                            f"network. Give every strategy the same first factor, e.g. {batch[first]}.")
    if problems:
        return None, None, problems
    sdp, stp = batch[first], world // batch[first]
    if (dp != -1 and dp != sdp) or (tp != 1 and tp != stp):
        problems.append(f"parallel.sharding gives dp {sdp} × tp {stp} (parallel.sharding.{first}="
                        f"{_text(sharding[first])}), but parallel.dp={dp} and parallel.tp={tp}. Set parallel.dp={sdp} "
                        f"parallel.tp={stp}, or leave parallel.dp=-1 parallel.tp=1 to take them from the strategies.")
        return None, None, problems
    return sdp, stp, []


def _aliases(ops: list[Operator]) -> dict[str, str]:
    """MindSpore-style names -> module paths: the k-th operator of a primitive is <primitive> (k = 1) or
    <primitive>_<k-1> (matmul, matmul_1, ...)."""
    out, seen = {}, {}
    for op in ops:
        k = seen.get(op.primitive, 0)
        seen[op.primitive] = k + 1
        out[op.primitive if k == 0 else f"{op.primitive}_{k}"] = op.name
    return out


def _redistribute(have: str, want: str, what: str, shape: list[int], tp: int) -> list[str]:
    if have == want or tp == 1:
        return []
    if (have, want) == ("R", "S"):
        return [f"slice over tp ({tp} ranks, no communication): Replicate → Shard(1) of {what} {_fmt(shape)}"]
    if (have, want) == ("S", "R"):
        return [f"all-gather over tp ({tp} ranks): Shard(1) → Replicate of {what} {_fmt(shape)}"]
    raise ValueError(f"no redistribution {have} -> {want} is planned")  # P never reaches the next operator


def search_mode_problems(search_mode: str) -> list[str]:
    """parallel.search_mode is one of SEARCH_MODES (checked whether or not parallel.sharding uses it)."""
    if search_mode in SEARCH_MODES:
        return []
    return [f"parallel.search_mode={search_mode} is not supported; the one search mode is sharding_propagation "
            f"(operators without a strategy take their input's layout). Set parallel.search_mode=sharding_propagation."]


def plan_sharding(sharding: dict[str, Any], search_mode: str, ops: list[Operator] | None, recipe: str, dp: int,
                  tp: int, micro: int, has_tp_plan: bool = True) -> tuple[ShardingPlan | None, list[str]]:
    """The operators of the recipe's chain with the given strategies, the rest propagated; (plan, problems)."""
    if search_mode not in SEARCH_MODES:
        return None, search_mode_problems(search_mode)
    if not ops:
        instead = (f"Use parallel.tp=N for {recipe}'s tensor-parallel plan, or remove parallel.sharding" if has_tp_plan
                   else "Remove parallel.sharding (data parallelism, ZeRO and pipeline stages need no operator list)")
        return None, [f"parallel.sharding: recipe {recipe} does not list its operators for op-level sharding "
                      f"(quickstart does; parallel=semi_auto is its strategy). {instead}."]
    aliases = _aliases(ops)
    alias_of = {n: a for a, n in aliases.items()}
    by_name = {op.name: op for op in ops}
    given: dict[str, tuple[str, list[list[int]]]] = {}
    problems: list[str] = []
    listing = ", ".join(f"{o.name} ({a})" for a, n in aliases.items() for o in ops if o.name == n)
    for key, s in sharding.items():
        name = aliases.get(key, key)
        if name not in by_name:
            hint = did_you_mean(key, [*by_name, *aliases], "parallel.sharding.", cutoff=0.5)
            problems.append(f"parallel.sharding.{key}: recipe {recipe} has no operator {key}.{hint} Its operators: "
                            f"{listing}.")
        elif name in given:
            problems.append(f"parallel.sharding.{key} and parallel.sharding.{given[name][0]} are the same operator "
                            f"({name}). Keep one of them.")
        else:
            given[name] = (key, s)
    b_global = micro * dp
    rows: list[OpShard] = []
    layout, what = "R", "the input x"
    for i, op in enumerate(ops):
        key, s = given.get(op.name, (None, None))
        k = f"parallel.sharding.{key}"
        lead = _shape(op.tokens)
        collectives: list[str] = []
        if op.kind == "matmul":
            if s is not None and len(s) != 2:
                problems.append(f"{k}={_text(s)}: {op.name} is a matmul of x (batch, in) and w (in, out): give two "
                                f"lists, [[batch, in], [in, out]], e.g. {k}=[[{dp},{tp}],[{tp},1]].")
                continue
            if s is not None:
                (a, b), (b2, c) = s
                if b != b2:
                    problems.append(f"{k}={_text(s)}: x's width factor {b} differs from w's height factor {b2}; a "
                                    f"matmul needs them equal (each rank multiplies matching slices). Set both to {b}.")
                    continue
                if b > 1 and c > 1:
                    problems.append(f"{k}={_text(s)} splits both w's height ({b}) and width ({c}): only one may be > 1 "
                                    f"(the tp group is one mesh dim). Use {k}=[[{a},{b * c}],[{b * c},1]] or "
                                    f"{k}=[[{a},1],[1,{b * c}]].")
                    continue
                for factor, width, dim, cfg_key in ((b, op.width_in, "dim 1 of x (in)", op.keys[0]),
                                                    (c, op.width_out, "dim 1 of w (out)", op.keys[1])):
                    if width % factor:
                        problems.append(f"{k}={_text(s)}: {dim} of {op.name} is {width}, not divisible by its factor "
                                        f"{factor}. Set {cfg_key or 'that width'} to a multiple of {factor}, or give "
                                        f"a factor that divides {width}.")
                style = "row" if b > 1 else "col" if c > 1 else "replicate"
            else:
                style = "row" if layout == "S" else "replicate"
                b, c = (tp, 1) if style == "row" else (1, 1)
                s = [[dp, b], [b, c]]
            want = "S" if style == "row" else "R"
            collectives += _redistribute(layout, want, what, [micro, *lead, op.width_in], tp)
            out_local = [micro, *lead, op.width_out // c]
            if style == "row" and tp > 1:
                collectives.append(f"all-reduce over tp ({tp} ranks): Partial → Replicate of {op.name}'s output "
                                   f"{_fmt(out_local)}")
            layout = "S" if style == "col" and tp > 1 else "R"
            rows.append(OpShard(
                name=op.name, alias=alias_of[op.name], kind=op.kind, style=style, strategy=s, given=key is not None, input_layout=want,
                global_shapes={"x": [b_global, *lead, op.width_in], "w": [op.width_in, op.width_out],
                               "out": [b_global, *lead, op.width_out]},
                local_shapes={"x": [micro, *lead, op.width_in // b], "w": [op.width_in // b, op.width_out // c],
                              "out": out_local},
                partial=style == "row" and tp > 1, collectives=tuple(collectives)))
        else:  # elementwise: one input, the output keeps its layout
            if s is not None and len(s) != 1:
                problems.append(f"{k}={_text(s)}: {op.name} is elementwise on one input x (batch, width): give one "
                                f"list, [[batch, width]], e.g. {k}=[[{dp},1]].")
                continue
            if s is not None:
                b = s[0][1]
                if op.width_in % b:
                    problems.append(f"{k}={_text(s)}: dim 1 of x (width) of {op.name} is {op.width_in}, not divisible "
                                    f"by its factor {b}. Set {op.keys[0] or 'that width'} to a multiple of {b}.")
                want = "S" if b > 1 else "R"
            else:
                want = layout
                b = tp if layout == "S" else 1
                s = [[dp, b]]
            collectives += _redistribute(layout, want, what, [micro, *lead, op.width_in], tp)
            layout = want if tp > 1 else "R"
            rows.append(OpShard(
                name=op.name, alias=alias_of[op.name], kind=op.kind, style="elementwise", strategy=s, given=key is not None, input_layout=want,
                global_shapes={"x": [b_global, *lead, op.width_in]}, local_shapes={"x": [micro, *lead, op.width_in // b]},
                partial=False, collectives=tuple(collectives)))
        what = f"{op.name}'s output"
        if i == len(ops) - 1 and layout == "S":  # the loss takes whole rows
            more = _redistribute("S", "R", what, [micro, *lead, op.width_out], tp)
            rows[-1] = replace(rows[-1], collectives=(*rows[-1].collectives, *(f"{m} for the loss" for m in more)))
    if problems:
        return None, problems
    return ShardingPlan(source="parallel.sharding", search_mode=search_mode, dp=dp, tp=tp, ops=tuple(rows),
                        gradients=_gradients(dp)), []


def _gradients(dp: int) -> str:
    return f"gradients: all-reduce over dp ({dp} ranks) and divide by {dp}, every parameter" if dp > 1 else \
        "gradients: dp 1, no reduction"


def plan_tensor_parallel(ops: list[Operator] | None, recipe_problems: list[str], recipe: str, dp: int, tp: int,
                         micro: int) -> tuple[ShardingPlan | None, list[str]]:
    """parallel.tp alone: the recipe's Megatron-style plan (colwise then rowwise Linear layers)."""
    if ops is None:
        return None, [f"parallel.tp={tp}: recipe {recipe} has no tensor-parallel plan (gpt and quickstart have one). "
                      f"Set parallel.tp=1."]
    problems = list(recipe_problems)
    alias_of = {n: a for a, n in _aliases(ops).items()}
    rows = []
    for op in ops:
        split_in = op.kind == "rowwise"
        width, cfg_key = (op.width_in, op.keys[0]) if split_in else (op.width_out, op.keys[1])
        if width % tp:
            problems.append(f"parallel.tp={tp}: {op.name} splits its {'input' if split_in else 'output'} width "
                            f"{width} {tp} ways, and {tp} does not divide it. Set {cfg_key or 'that width'} to a "
                            f"multiple of {tp}, or parallel.tp to a divisor of {width}.")
            continue
        lead = _shape(op.tokens)
        b, c = (tp, 1) if split_in else (1, tp)
        out_local = [micro, *lead, op.width_out // c]
        if split_in:
            collectives = (f"all-reduce over tp ({tp} ranks): Partial → Replicate of {op.name}'s output "
                           f"{_fmt(out_local)}",)
        else:
            collectives = (f"backward, where its input needs a gradient: all-reduce over tp ({tp} ranks) of that "
                           f"gradient {_fmt([micro, *lead, op.width_in])}",)
        rows.append(OpShard(
            name=op.name, alias=alias_of[op.name], kind=op.kind, style=op.kind, strategy=[[dp, b], [b, c]], given=False,
            input_layout="S" if split_in else "R",
            global_shapes={"x": [micro * dp, *lead, op.width_in], "w": [op.width_in, op.width_out],
                           "out": [micro * dp, *lead, op.width_out]},
            local_shapes={"x": [micro, *lead, op.width_in // b], "w": [op.width_in // b, op.width_out // c],
                          "out": out_local},
            partial=split_in, collectives=collectives))
    if problems:
        return None, problems
    return ShardingPlan(source="parallel.tp", search_mode="", dp=dp, tp=tp, ops=tuple(rows),
                        gradients=_gradients(dp)), []


def strategy_words(op: OpShard) -> str:
    """The strategy cell of the plan's table: '[[2,4],[4,1]]', with 'propagated' or the tp style."""
    text = _text(op.strategy)
    if op.kind in ("colwise", "rowwise"):
        return f"{text} {op.kind}"
    return text if op.given else f"{text} propagated"


def shapes_words(shapes: dict[str, list[int]], partial: bool = False) -> str:
    return ", ".join(f"{n} {_fmt(s)}{' partial' if partial and n == 'out' else ''}" for n, s in shapes.items())


__all__ = ["OpShard", "SEARCH_MODES", "ShardingPlan", "plan_sharding", "plan_tensor_parallel", "search_mode_problems",
           "shapes_words", "sharding_degrees", "strategy_words"]
