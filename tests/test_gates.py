"""The code's gates, run with the suite (so in `make test-unit` and in CI): ruff's lint rules
and its formatter, configured in pyproject.toml, over every package and the tests. A new
violation fails here with ruff's own report."""

from __future__ import annotations

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
