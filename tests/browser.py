"""A real browser for the explorer's tests: Debian's chromium, driven by Playwright for Python
(Playwright's own browser download is not reachable from CI: it launches this one by path).

`chromium_path()` finds the system's chromium, or installs it once (`apt-get install -y
chromium`, as root: CI is root on Debian 12 with no browser) under a lock file, so parallel
runs install it once; a machine without it and without root skips the browser tests with what
to run."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser")
LOCK = Path(os.environ.get("MEMSTREAM_CACHE", Path.home() / ".cache" / "memstream")) / "chromium-install.lock"


def _found() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_path() -> str:
    """The system chromium's path, installed first when missing and this process is root."""
    found = _found()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium: install it (`sudo apt-get install -y chromium`) to run the browser tests")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installation at a time; the next finds it done
        found = _found()
        if found:
            return found
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
            subprocess.run(install, env=env, capture_output=True, check=True)
    found = _found()
    assert found, "apt-get installed chromium but no chromium is on PATH"
    return found
