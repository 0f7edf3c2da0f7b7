"""The composability matrix as docs/parallelism.md prints it: per recipe, a grid of the nine intents (each alone on the
diagonal, every pair off it) whose cells say what ran (the parts, abbreviated) or that it was refused.

    .venv/bin/python bench/matrix_grid.py [bench/results/matrix.json]   (written by bench/composability.py)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from composability import INTENTS, held_as_planned

SHORT = {"tensor_parallel": "tp", "recompute": "rc", "ddp": "ddp", "fsdp": "fsdp", "deepspeed": "ds",
         "pipeline": "pp"}
"""How a cell names the parts: tp = tensor_parallel, rc = recompute, ds = deepspeed, pp = pipeline."""


def cell(row: dict | None) -> str:
    if row is None:  # two ZeRO stages: not a combination
        return "-"
    if row["status"] == "refused":
        return "refused"
    ok = row["worst"] <= row["tolerance"] and held_as_planned(row)
    return "+".join(SHORT[p] for p in row["parts"].split("+")) + ("" if ok else " (!)")


def grid(rows: list[dict], recipe: str) -> str:
    names = list(INTENTS)
    by = {tuple(r["combo"]): r for r in rows if r["recipe"] == recipe}
    lines = [f"| {recipe} | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for a in names:
        cells = []
        for b in names:
            key = (a,) if a == b else (a, b) if (a, b) in by else (b, a)
            cells.append(cell(by.get(key)))
        lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "results" / "matrix.json"
    result = json.loads(path.read_text())
    recipes = sorted({r["recipe"] for r in result["rows"]})
    print("\n\n".join(grid(result["rows"], r) for r in recipes))


if __name__ == "__main__":
    main()
