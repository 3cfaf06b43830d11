"""Every role's /metrics, scraped over HTTP while a corpus is indexed (chunker, extractor with
an LLM, detector, resolver, query: one process each, MEMSTREAM_METRICS_PORT each): the names
the dashboard and `memstream status` rely on are served by the role that does the work, and
move — messages and handling time per stage, consumer lag per partition (0 once indexed), LLM
calls, tokens and latency, the embedding cache, events, promotions, conflict decisions, query
time, and the per-tenant census."""

from __future__ import annotations

import subprocess
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ops.fake_llm import FakeOpenAI
from ops.stack.services import free_port
from tests.chaos_corpus import corpus, extraction
from tests.conftest import MEMSTREAM, ROOT, write_docs

pytestmark = pytest.mark.stack

ROLES = ("chunker", "extractor", "detector", "resolver", "query")
# role → the sums that must grow between the scrape before publishing and the one after
MOVES = {
    "chunker": ["memstream_messages_total", "memstream_stage_seconds_count"],
    "extractor": [
        "memstream_messages_total",
        "memstream_stage_seconds_count",
        "memstream_llm_calls_total",
        "memstream_llm_tokens_total",
        "memstream_llm_seconds_count",
        "memstream_embedding_cache_total",
        "memstream_extraction_texts_total",
    ],
    "detector": [
        "memstream_messages_total",
        "memstream_stage_seconds_count",
        "memstream_fact_events_total",
        "memstream_facts_promoted_total",
        "memstream_schemas_promoted_total",
    ],
    "resolver": ["memstream_messages_total", "memstream_stage_seconds_count", "memstream_conflict_decisions_total"],
    "query": [
        "memstream_query_seconds_count",
        "memstream_tenants",
        "memstream_records",
        "memstream_facts",
        "memstream_tenant_records",
        "memstream_tenant_facts",
    ],
}


def scrape(port: int) -> dict[str, float]:
    """Sample name → the sum of its values over every label set."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def lag_rows(port: int) -> list[float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "memstream_consumer_lag"
    ]


def wait_scrapable(port: int, proc, deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited with {proc.returncode}"
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"no /metrics on {port}")


@pytest.mark.timeout(600)
def test_every_roles_metrics_move_while_a_corpus_is_indexed(make_workers, tmp_path):
    docs = corpus(20)
    with FakeOpenAI(answers={d.text: extraction(d) for d in docs}, latency_s=0.05) as llm:
        workers = make_workers(
            extractor="llm",
            llm_base_url=llm.base_url,
            # a model of its own: an LLM cache entry of an earlier run on the same Redis (a kept
            # stack, a second run) answers every prompt, and no token or request time moves
            llm_model=f"scrape-fake-{uuid.uuid4().hex[:8]}",
            resolver="rules",
            tau=2,
            stall_seconds=4,
            metrics_census_seconds=1,
            metrics_top_tenants=3,
        )
        ports = {role: free_port() for role in ROLES}
        procs = {role: workers.start(role, MEMSTREAM_METRICS_PORT=str(ports[role])) for role in ROLES}
        for role in ROLES:
            wait_scrapable(ports[role], procs[role])
        before = {role: scrape(ports[role]) for role in ROLES}
        tenant = f"scrape-{uuid.uuid4().hex[:8]}"
        files = write_docs(tmp_path / "docs", {d.doc_id: d.text for d in docs})
        publish = subprocess.Popen(
            [*MEMSTREAM, "publish", *files, "--tenant", tenant, "--wait", "--timeout", "300"],
            env=workers.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        most_lag = 0.0
        while publish.poll() is None:  # during the ingestion: the chunker's and extractor's lag as they see it
            most_lag = max([most_lag, *lag_rows(ports["chunker"]), *lag_rows(ports["extractor"])])
            time.sleep(0.3)
        out, err = publish.communicate()
        assert publish.returncode == 0, err[-2000:]
        workers.cli.run("query", "Who was born in which city?", "--tenant", tenant)
        time.sleep(6)  # a census (every second) and a lag reading (every stall_seconds / 4) after the last message
        after = {role: scrape(ports[role]) for role in ROLES}
    standing = {
        role: [name for name in names if not after[role].get(name, 0.0) > before[role].get(name, 0.0)]
        for role, names in MOVES.items()
    }
    assert standing == {role: [] for role in ROLES}, standing
    for role in ("chunker", "extractor", "detector", "resolver"):
        lags = lag_rows(ports[role]) if procs[role].poll() is None else []
        assert lags and max(lags) == 0, (role, lags)  # every partition it holds, caught up
    print(f"most consumer lag seen during the ingestion: {most_lag:g}")
