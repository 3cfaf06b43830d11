"""Fixtures: the local stack (real Kafka + Redis), worker processes on a private topic
namespace and consumer group, and the CLI as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ops.stack.processes import WorkerProcess, stop_all
from ops.stack.services import free_port

ROOT = Path(__file__).resolve().parent.parent
MEMSTREAM = [sys.executable, "-m", "ops.cli"]


def pytest_collection_modifyitems(items):
    for item in items:
        # a test over both stores (fixture redis_url) asks for the stack at run time, in its Redis case
        over_redis = getattr(getattr(item, "callspec", None), "params", {}).get("redis_url") in (
            "redis",
            "redis-cluster",
        )
        if "stack_env" in getattr(item, "fixturenames", ()) or over_redis:
            item.add_marker(pytest.mark.stack)


@pytest.fixture(params=["in-memory", "redis", "redis-cluster"])
def redis_url(request) -> str | None:
    """A test over every store: None (InMemoryStore, tests/inprocess.py's default), the stack's
    Redis URL, and a local 3-shard Redis Cluster's (the store conformance run on a cluster)."""
    if request.param == "redis-cluster":
        return request.getfixturevalue("redis_cluster_url")
    return request.getfixturevalue("stack_env")["MEMSTREAM_REDIS_URL"] if request.param == "redis" else None


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory):
    """A local 3-shard Redis Cluster for the session (`stack up --redis-cluster 3`'s Redis)."""
    from ops.stack.services import Stack, free_ports
    from workers.settings import Settings

    port = free_ports(6)  # three shards, then their cluster buses
    stack = Stack(Settings(home=tmp_path_factory.mktemp("redis-cluster"), redis_port=port, redis_shards=3))
    stack.service_up("redis", progress=lambda message: None)
    try:
        yield f"redis+cluster://127.0.0.1:{port}/0"
    finally:
        stack.service_down("redis")


@pytest.fixture(scope="session")
def stack_env():
    """Environment pointing at a running local stack; starts one if none answers (and stops
    only what it started)."""
    from ops.stack.services import Stack
    from workers.settings import Settings

    settings = Settings.from_env()
    stack = Stack(settings)
    started = not (stack.kafka.pid() or stack.redis.pid())
    stack.up(progress=lambda m: None)
    env = {
        **os.environ,
        "MEMSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "MEMSTREAM_REDIS_URL": settings.redis_url,
    }
    yield env
    if started and os.environ.get("MEMSTREAM_KEEP_STACK") != "1":
        stack.down(progress=lambda m: None)


class Cli:
    def __init__(self, env: dict):
        self.env = env

    def run(
        self, *args: str, input: str | None = None, timeout: float = 180, check: bool = True
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            MEMSTREAM + list(args), env=self.env, cwd=ROOT, input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"memstream {' '.join(args)} → {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
            )
        return proc

    def tail(self, tenant: str, idle: float = 3.0) -> list[dict]:
        out = self.run("tail", "--tenant", tenant, "--from-beginning", "--idle-timeout", str(idle)).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def query(self, text: str, tenant: str, top_k: int = 5) -> dict:
        return json.loads(self.run("query", text, "--tenant", tenant, "--top-k", str(top_k), "--json").stdout)


class Workers:
    """`memstream worker` processes sharing one namespace (topics) and app id (group)."""

    def __init__(self, base_env: dict, tmp: Path, **settings: str):
        ns = f"t{uuid.uuid4().hex[:10]}"
        self.env = {
            **base_env,
            "MEMSTREAM_TOPIC_NAMESPACE": ns,
            "MEMSTREAM_APP_ID": ns,
            "MEMSTREAM_HTTP_PORT": str(free_port()),
            "MEMSTREAM_HOME": str(tmp),
            "MEMSTREAM_PARTITIONS": "2",
            "MEMSTREAM_SESSION_TIMEOUT": "6",
            "MEMSTREAM_LOG_LEVEL": "warning",
            **{f"MEMSTREAM_{k.upper()}": str(v) for k, v in settings.items()},
        }
        self.tmp = tmp
        self.procs: list[WorkerProcess] = []
        self.cli = Cli(self.env)

    def start(self, role: str = "all", **extra_env: str) -> subprocess.Popen:
        worker = WorkerProcess.spawn(
            self.tmp / f"worker-{len(self.procs)}-{role}.log",
            {**self.env, **extra_env},
            role=role,
            cwd=ROOT,
            own_session=True,
        )
        self.procs.append(worker)
        if role in ("all", "query"):  # the roles that serve HTTP
            worker.wait_healthy(timeout_s=120)
        return worker.proc

    def logs(self) -> str:
        return "\n".join(worker.log.read_text(errors="replace") for worker in self.procs)

    def stop(self) -> None:
        stop_all(self.procs)


@contextlib.contextmanager
def running_workers(base_env: dict, tmp: Path, **settings):
    """One all-roles worker with these settings, stopped on exit: the worker a test module's
    tests share (each test on a tenant of its own)."""
    workers = Workers(base_env, tmp, **settings)
    try:
        workers.start()
        yield workers
    finally:
        workers.stop()


@pytest.fixture
def make_workers(stack_env, tmp_path):
    created: list[Workers] = []

    def make(**settings) -> Workers:
        workers = Workers(stack_env, tmp_path / f"w{len(created)}", **settings)
        workers.tmp.mkdir(parents=True)
        created.append(workers)
        return workers

    yield make
    for workers in created:
        workers.stop()


def write_docs(directory: Path, docs: dict[str, str]) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc_id, text in docs.items():
        path = directory / f"{doc_id}.txt"
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    return paths


def pytest_terminal_summary(terminalreporter):
    """The cases each fuzz target ran (tests/test_fuzz.py), when it ran: the count the issue asks for."""
    fuzz = sys.modules.get("tests.test_fuzz")
    if fuzz is not None and fuzz.CASES:
        terminalreporter.section("fuzz cases")
        for target, cases in sorted(fuzz.CASES.items()):
            terminalreporter.write_line(f"{cases:>8,}  {target}")
        terminalreporter.write_line(f"{sum(fuzz.CASES.values()):>8,}  in all")
