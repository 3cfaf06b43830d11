"""The shared datasets the tests read by path (../shared/data beside the checkout; never copied
into the repo), and the one way a test needing them is skipped where they are not: a checkout
elsewhere (a worktree in /tmp, a fork's CI) skips with the path it looked for, where a test
that read them anyway failed with FileNotFoundError."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def needs_shared(*parts: str) -> pytest.MarkDecorator:
    """Skip unless SHARED_DATA/<parts…> exists (a file or a folder)."""
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"the shared data is not here: {path}")
