"""The code's gates, run with the suite (so in `make test-unit` and in CI): ruff's lint rules
and its formatter over every package and the tests, and mypy over the packages, configured in
pyproject.toml. A new violation fails here with the tool's own report."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["topics", "store", "workers", "ops", "tests"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CHECKED], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_finds_nothing_to_report():
    found = _ruff("check", "--no-cache", "--output-format", "concise")
    assert found.returncode == 0, found.stdout + found.stderr


def test_the_code_is_as_ruff_formats_it():
    found = _ruff("format", "--no-cache", "--check")
    assert found.returncode == 0, "run `ruff format`:\n" + found.stdout + found.stderr


def test_mypy_finds_nothing_to_report():
    """mypy over the four packages as pyproject.toml configures it (check_untyped_defs, the
    pydantic plugin). Its cache lives outside the work tree, one per checkout: mypy invalidates
    its own entries, but two checkouts sharing one (a worktree's suite beside main's) left
    entries of the other's code it took as current — 9 errors in code that had none."""
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "memstream" / "mypy" / checkout
    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert found.returncode == 0, found.stdout + found.stderr


def test_no_code_or_doc_sends_the_reader_to_an_issue_number():
    """Code and docs say what and why themselves: an issue tracker's number means nothing in a clone."""
    import re

    cite = re.compile(r"\bissues? \d+\b|\bissue #\d+", re.I)
    files = [p for d in CHECKED for p in (ROOT / d).rglob("*.py")] + [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
    ]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if cite.search(line)
    ]
    assert found == []


def test_docs_architecture_shows_the_stage_graph_it_is_generated_from():
    """docs/architecture.md's stage table is the one topics/graph.py's STAGE_GRAPH generates: a
    stage that starts producing or consuming a topic changes the doc with the graph."""
    from topics.graph import with_stage_table

    document = (ROOT / "docs" / "architecture.md").read_text()
    assert document == with_stage_table(document), (
        "docs/architecture.md's stage table is not the one topics/graph.py generates: "
        "run `memstream stage-table --write docs/architecture.md`"
    )


def test_docs_configuration_lists_every_setting_and_no_other():
    """docs/configuration.md's settings table is the one the fields of workers/settings.py
    generate (a setting without its row, or a row left from a setting gone or changed, fails
    here); the rows written by hand around it name only the variables read outside Settings,
    each of them."""
    import re
    from dataclasses import fields

    from workers.settings import TABLE_BEGIN, TABLE_END, Settings, variable, with_settings_table

    outside_settings = {"MEMSTREAM_KAFKA_HEAP"}  # ops/stack/services.py reads it when it starts Kafka
    document = (ROOT / "docs" / "configuration.md").read_text()
    assert document == with_settings_table(document), (
        "docs/configuration.md's settings table is not the one workers/settings.py generates: "
        "run `memstream settings-table --write docs/configuration.md`"
    )
    by_hand = document[: document.index(TABLE_BEGIN)] + document[document.index(TABLE_END) :]
    named = {
        name
        for line in by_hand.splitlines()
        if line.startswith("| `MEMSTREAM_")
        for name in re.findall(r"`(MEMSTREAM_[A-Z0-9_]+)`", line.split("|")[1])
    }
    assert named == outside_settings
    assert not outside_settings & {variable(f.name) for f in fields(Settings)}


MAX_MODULE_LINES = 600  # a module longer than this holds more than one thing: split it by meaning


def test_no_module_in_ops_workers_or_store_is_longer_than_600_lines():
    long = {
        str(path.relative_to(ROOT)): lines
        for folder in ("ops", "workers", "store")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
