"""What the benches that measure two checkouts side by side share (`bench tenants`, `graph`,
`scale`, `wait`, `index --rules` with `--baseline-tree DIR`): the baseline tree checked, a
script of this checkout run over the other tree's packages, and the figures compared.

Only this checkout imports it: the code a bench runs over a baseline tree (its phase functions,
run as a script with PYTHONPATH at that tree) imports nothing of ops.bench, which a tree from
before the ops/ split does not have."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from topics import BadInput


def tree_env(tree: Path) -> dict:
    """This process's environment with PYTHONPATH at `tree`: a subprocess imports that checkout's code."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tree)}


def baseline_checkout(given: str, *holding: str) -> Path:
    """A bench's --baseline-tree as a path, once it is seen to be a checkout of memstream (it
    holds a file the bench runs from it: one of `holding`, the same file in each layout of ops/
    a baseline may have); BadInput otherwise."""
    tree = Path(given).resolve()
    if not any((tree / path).is_file() for path in holding):
        raise BadInput(f"--baseline-tree {tree}: no {' or '.join(holding)} there (expected a checkout of memstream)")
    return tree


def phase_in_tree(script: Path, tree: Path, argv: list[str], what: str) -> dict:
    """`script` run over another checkout's code (the benches' baseline trees: the script is this
    checkout's, what it imports the tree's), its last stdout line read as JSON. The benches
    that measure two trees side by side share it (tenants, graph, scale)."""
    proc = subprocess.run(
        [sys.executable, str(script.resolve()), *argv],
        cwd=tree,
        env=tree_env(tree),
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratios(this: list[float], base: list[float]) -> dict[str, float]:
    """This tree's p50 over the baseline's, round by round: the median, the least and the most."""
    by_round = sorted(a / b for a, b in zip(this, base))
    return {
        "median": round(statistics.median(by_round), 3),
        "min": round(by_round[0], 3),
        "max": round(by_round[-1], 3),
    }


def percentiles(values: list[float]) -> tuple[float, float]:
    """The p50 and the p99 of `values` (the nearest rank below)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
