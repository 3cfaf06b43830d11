#!/usr/bin/env bash
# Create or refresh the project's virtualenv.
# The dependencies live in a venv outside the work tree, keyed by pyproject.toml's dependency
# lists and the Python version, so CI and later sessions reuse it. `.venv` is this checkout's
# own small venv that sees those packages through a .pth file and has memstream installed
# editable from this checkout, so two checkouts never point each other's code.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
key=$("$python" - <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
spec = [project["dependencies"], project.get("optional-dependencies", {}), sys.version_info[:2]]
print(hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16])
PY
)
cache=${MEMSTREAM_CACHE:-$HOME/.cache/memstream}
deps="$cache/deps-$key"
if [ ! -f "$deps/.complete" ]; then
    echo "install: building $deps (first run: downloads torch and friends, several minutes)" >&2
    rm -rf "$deps"
    mkdir -p "$cache"
    "$python" -m venv "$deps"
    "$deps/bin/pip" install -q --upgrade pip "setuptools>=68" wheel
    # the dependencies only: memstream itself is installed into .venv below
    "$deps/bin/python" - <<'PY' > "$deps/requirements.txt"
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + [r for extra in project.get("optional-dependencies", {}).values() for r in extra]))
PY
    "$deps/bin/pip" install -q -r "$deps/requirements.txt"
    touch "$deps/.complete"
fi
site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -L .venv ] || [ ! -f .venv/.deps ] || [ "$(cat .venv/.deps)" != "$deps" ]; then
    rm -rf .venv
    "$python" -m venv .venv
    echo "$deps" > .venv/.deps
fi
own_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$own_site/memstream-deps.pth"
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
    || .venv/bin/python -m pip install -q --no-deps -e .
echo "install: .venv ready (dependencies from $deps)" >&2
