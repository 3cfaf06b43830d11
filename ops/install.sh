#!/usr/bin/env bash
# Create or refresh the project's virtualenv. The venv lives outside the work tree, keyed by
# the dependency lists of pyproject.toml (so CI and later sessions reuse it); .venv links to it. memstream
# itself is installed editable, re-pointed at this checkout on every run (cheap).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
# keyed by what decides the venv's contents: the dependency lists and the Python version
key=$("$python" - <<'PY'
import hashlib, json, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
spec = [project["dependencies"], project.get("optional-dependencies", {}), sys.version_info[:2]]
print(hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16])
PY
)
cache=${MEMSTREAM_CACHE:-$HOME/.cache/memstream}
venv="$cache/venv-$key"
if [ ! -f "$venv/.complete" ]; then
    echo "install: building $venv (first run: downloads torch and friends, several minutes)" >&2
    rm -rf "$venv"
    mkdir -p "$cache"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip "setuptools>=68" wheel
    "$venv/bin/pip" install -q -e ".[test,bench]"
    touch "$venv/.complete"
fi
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
ln -sfn "$venv" .venv
echo "install: .venv -> $venv" >&2
