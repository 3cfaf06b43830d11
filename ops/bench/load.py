"""`memstream bench load`: N concurrent clients POST /v1/query to one query worker for S seconds,
at each client level: requests, throughput, p50/p99 latency of the answered ones, errors (any
non-2xx but 503, and transport failures), 503s (load shed, counted apart) and the worker's RSS.

Every query text is distinct — the dataset's questions, then numbered variants — so no answer
comes from the worker's answer cache or the embedding cache; cache hits would show in their own
column. A client told 503 waits the Retry-After it was given, as a well-behaved client does.

The worker is a `memstream worker --role query` process started here on the local stack, or
the one at --url. Without --tenant, the first --passages passages of the dataset are indexed
first (rules extractor) into a fresh tenant."""

from __future__ import annotations

import asyncio
import itertools
import json
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ops.bench.corpora import index_corpus
from ops.bench.datasets import Dataset, load_dataset
from ops.stack.processes import WorkerProcess, worker_env
from ops.stack.services import Stack, free_port, stderr
from topics import BadInput
from workers.settings import Settings

REQUEST_TIMEOUT_S = 120


@dataclass
class Level:
    clients: int
    seconds: float  # wall time from the first request to the last answer
    requests: int
    ok: int
    throughput: float  # answered requests per second
    p50_ms: float | None
    p99_ms: float | None
    errors: int  # non-2xx other than 503, and transport failures
    shed: int  # 503s
    cache_hits: int  # answers served from the worker's answer cache
    rss_mb: float | None  # the worker's resident memory after the level
    peak_rss_mb: float | None
    error_samples: list[str]


def query_texts(dataset: Dataset, run: str) -> Iterator[str]:
    """Distinct texts without end: each question, then each again with a variant number."""
    questions = [q.text for q in dataset.questions]
    yield from questions
    for n in itertools.count(1):
        for text in questions:
            yield f"{text} (variant {run}-{n})"


async def run_level(url: str, tenant: str, clients: int, seconds: float, texts: Iterator[str]) -> Level:
    import aiohttp

    latencies: list[float] = []
    outcomes: Counter = Counter()
    samples: list[str] = []
    cache_hits = 0
    deadline = time.monotonic() + seconds

    async def client(session) -> None:
        nonlocal cache_hits
        while time.monotonic() < deadline:
            body = {"query": next(texts), "tenant": tenant, "top_k": 5}
            started = time.perf_counter()
            retry_after = 0.0
            try:
                async with session.post(url, json=body) as response:
                    payload = await response.read()
                    status = response.status
                    retry_after = float(response.headers.get("Retry-After", 1))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                status, payload = type(exc).__name__, str(exc).encode()
            if status == 200:
                latencies.append((time.perf_counter() - started) * 1000)
                cache_hits += json.loads(payload)["timings_ms"].get("cached", 0)
                outcomes["ok"] += 1
            elif status == 503:
                outcomes["shed"] += 1
                await asyncio.sleep(retry_after)
            else:
                outcomes["errors"] += 1
                if len(samples) < 3:
                    samples.append(f"{status}: {payload[:200].decode(errors='replace')}")

    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    ok = outcomes["ok"]
    return Level(
        clients,
        round(elapsed, 1),
        sum(outcomes.values()),
        ok,
        round(ok / elapsed, 1),
        round(float(np.percentile(latencies, 50)), 1) if latencies else None,
        round(float(np.percentile(latencies, 99)), 1) if latencies else None,
        outcomes["errors"],
        outcomes["shed"],
        cache_hits,
        None,
        None,
        samples,
    )


def warm_up(endpoint: str, tenant: str) -> None:
    """One query first: the worker loads the tenant's graph and index handles on its first."""
    body = json.dumps({"query": "warm-up", "tenant": tenant}).encode()
    request = urllib.request.Request(endpoint, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(
            f"the query worker at {endpoint} answered {exc.code}: {exc.read()[:300].decode(errors='replace')}"
        ) from None
    except urllib.error.URLError as exc:
        raise RuntimeError(f"cannot reach the query worker at {endpoint}: {exc.reason}") from None


def memory_mb(pid: int | None) -> tuple[float | None, float | None]:
    """(resident, peak resident) MiB of a local process, from /proc."""
    if pid is None:
        return None, None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

    def mib(key: str) -> float | None:
        return round(int(fields[key].split()[0]) / 1024, 1) if key in fields else None

    return mib("VmRSS"), mib("VmHWM")


def run_load_bench(
    settings: Settings,
    clients: list[int],
    seconds: float,
    tenant: str | None,
    url: str | None,
    dataset_name: str,
    data_dir: Path,
    passages: int,
    as_json: bool,
) -> int:
    if not clients or min(clients) < 1 or not seconds > 0:
        raise BadInput("--clients must list positive numbers and --seconds be positive")
    dataset = load_dataset(dataset_name, data_dir)
    if url is None:
        Stack(settings).up(stderr)
    if tenant is None:
        tenant = f"load-{dataset_name}-{uuid.uuid4().hex[:6]}"
        sample = Dataset(dataset.name, dataset.passages[:passages], [], None)
        stderr(
            f"load: indexing {len(sample.passages)} {dataset_name} passages as tenant {tenant} (rules extractor; pass --tenant to reuse one)"
        )
        index_corpus(settings, sample, tenant, "rules")
    texts = query_texts(dataset, uuid.uuid4().hex[:6])
    worker: WorkerProcess | None = None
    if url is None:
        home = Path(tempfile.mkdtemp(prefix="memstream-loadbench-"))
        port = free_port()
        worker = WorkerProcess.spawn(
            home / "query-worker.log",
            worker_env(settings, f"loadbench{port}", home, MEMSTREAM_HTTP_PORT=str(port)),
            role="query",
        )
        url = f"http://127.0.0.1:{port}"
        stderr(f"load: query worker pid {worker.pid} on {url} (log {worker.log})")
    endpoint = url.rstrip("/") + "/v1/query"
    rows = []
    try:
        if worker is not None:
            worker.wait_healthy()
        warm_up(endpoint, tenant)
        for n in clients:
            stderr(f"load: {n} client(s) for {seconds:g} s")
            level = asyncio.run(run_level(endpoint, tenant, n, seconds, texts))
            level.rss_mb, level.peak_rss_mb = memory_mb(worker.pid if worker else None)
            rows.append(level)
    finally:
        if worker is not None:
            worker.stop()
    if as_json:
        print(json.dumps({"tenant": tenant, "url": url, "levels": [asdict(r) for r in rows]}, indent=1))
        return 0
    print(f"POST /v1/query, tenant {tenant}, distinct queries, {seconds:g} s per level")
    print(
        f"{'clients':>7} {'requests':>9} {'ok/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} {'503s':>6} {'cached':>7} {'RSS MiB':>8} {'peak MiB':>9}"
    )
    for r in rows:
        print(
            f"{r.clients:>7} {r.requests:>9} {r.throughput:>7} {_cell(r.p50_ms):>8} {_cell(r.p99_ms):>8} {r.errors:>7} {r.shed:>6} "
            f"{r.cache_hits:>7} {_cell(r.rss_mb):>8} {_cell(r.peak_rss_mb):>9}"
        )
        for error in r.error_samples:
            print(f"        error: {error}")
    return 0


def _cell(value) -> str:
    return "-" if value is None else str(value)
