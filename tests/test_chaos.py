"""Chaos: the indexing pipeline on its own Kafka + Redis, one process per role (two extractors,
LLM extraction against a fake LLM with latency), indexes a corpus with every conflict kind while
workers are SIGKILLed and SIGTERMed, an extractor joins, Redis is down for 20 s, every broker
restarts and — on three brokers — the one leading most partitions is SIGKILLed; then documents change (edits, a revert, deletions: wave 3, `changes`) while one more
action lands. Then every document must be in memory as its current version, the tenant's export
must equal an undisturbed run's of the same corpus and changes, no event id may stand for two contents, and the DLQ must be empty.

Environment (for quick local runs): MEMSTREAM_CHAOS_DOCS (default 200), MEMSTREAM_CHAOS_LATENCY
(the fake LLM's seconds per call, default 0.5), MEMSTREAM_CHAOS_SEED (replays a run's schedule;
default random, printed), MEMSTREAM_CHAOS_REDIS_OUTAGE (default 20 s), MEMSTREAM_CHAOS_WAIT
(seconds to wait for a wave to be indexed, default 150), MEMSTREAM_CHAOS_SLOW_CALL (the LLM
latency while an extractor is signalled, default 8 s), MEMSTREAM_CHAOS_BROKERS (default 3;
1: no broker SIGKILL). The action log lies in the test's
tmp_path (chaos.log), with one log per worker process."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from ops.fake_llm import FakeOpenAI
from ops.publish import delete, publish
from ops.stack.kafka_admin import ensure_topics
from ops.stack.services import Stack, free_port
from store.keys import LLM_CACHE_PATTERN
from tests.chaos import (
    ActionLog,
    Chaos,
    Fleet,
    audit_events,
    comparable_export,
    export_differences,
    free_kafka_port,
    plan,
    read_topic,
    unindexed,
    wait_indexed,
)
from tests.chaos_corpus import corpus, extraction
from topics import Document
from workers.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = int(os.environ.get("MEMSTREAM_CHAOS_DOCS") or 200)
LATENCY_S = float(os.environ.get("MEMSTREAM_CHAOS_LATENCY") or 0.5)
SEED = int(os.environ.get("MEMSTREAM_CHAOS_SEED") or random.SystemRandom().randrange(1_000_000))
REDIS_OUTAGE_S = float(os.environ.get("MEMSTREAM_CHAOS_REDIS_OUTAGE") or 20)
# per wave: far above the ~45 s a disrupted wave takes here, far below the 5.6 minutes a consumer
# that fetched nothing once waited (workers.liveness: MEMSTREAM_STALL_SECONDS=30 below)
WAIT_S = float(os.environ.get("MEMSTREAM_CHAOS_WAIT") or 150)
# three: the topics replicated three times, min.insync.replicas 2, and a wave that SIGKILLs the
# broker leading most partitions mid-ingestion (tests/chaos.py: Chaos.run "broker")
BROKERS = int(os.environ.get("MEMSTREAM_CHAOS_BROKERS") or 3)
SLOW_CALL_S = float(os.environ.get("MEMSTREAM_CHAOS_SLOW_CALL") or 8)
ROLES = ("chunker", "extractor", "extractor", "detector", "resolver", "query")


@pytest.fixture
def private_stack(tmp_path, monkeypatch):
    """Kafka (BROKERS brokers) and Redis of this test alone: it stops and restarts them."""
    if BROKERS > 1:  # three JVMs beside the workers on two cores
        monkeypatch.setenv("MEMSTREAM_KAFKA_HEAP", "-Xmx384m")
    stack = Stack(
        Settings(
            home=tmp_path / "stack",
            kafka_port=free_kafka_port(BROKERS),
            kafka_brokers=BROKERS,
            redis_port=free_port(),
        )
    )
    try:
        stack.up(progress=lambda m: None)
        yield stack
    finally:
        stack.down(progress=lambda m: None)


def worker_env(settings: Settings, llm_url: str, home: Path) -> dict:
    namespace = f"chaos{uuid.uuid4().hex[:8]}"
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")
    }  # the outer stack's settings stay out
    return {
        **inherited,
        "MEMSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "MEMSTREAM_REDIS_URL": settings.redis_url,
        "MEMSTREAM_TOPIC_NAMESPACE": namespace,
        "MEMSTREAM_APP_ID": namespace,
        "MEMSTREAM_HOME": str(home),
        "MEMSTREAM_HTTP_PORT": str(free_port()),
        "MEMSTREAM_PARTITIONS": "4",
        "MEMSTREAM_SESSION_TIMEOUT": "6",
        "MEMSTREAM_LOG_LEVEL": "info",
        "MEMSTREAM_EXTRACTOR": "llm",
        "MEMSTREAM_LLM_BASE_URL": llm_url,
        "MEMSTREAM_LLM_MODEL": "chaos-fake",
        "MEMSTREAM_TAU": "2",
        "MEMSTREAM_RESOLVER": "rules",
        "MEMSTREAM_STALL_SECONDS": "30",  # above the 20 s Redis outage, which holds every handler
    }


def documents(tenant: str, docs) -> list[Document]:
    return [Document(tenant=tenant, doc_id=d.doc_id, text=d.text) for d in docs]


def changes(docs) -> tuple[list[tuple[str, str, int]], list[str]]:
    """Wave 3, once wave 2 is indexed: documents change. In every third block the old letter
    becomes the parish records' text (its passage retires, its claim is retracted, the records'
    passage gains a second document), and the second term of office is edited to another text
    and reverted (retired, then restored and extracted again); the lone painting and the second
    book are deleted (the 'write' schema falls below τ: the first book's fact is parked again).
    Every text is one the fake LLM knows. Returns ((doc id, text, version) in order, deleted ids)."""
    text = {d.doc_id: d.text for d in docs}
    edits = []
    for b in sorted({d.doc_id[1:3] for d in docs if d.doc_id.startswith("b")})[::3]:
        edits += [
            (f"b{b}-letter", text[f"b{b}-records"], 2),
            (f"b{b}-later", text[f"b{b}-region"], 2),
            (f"b{b}-later", text[f"b{b}-later"], 3),
        ]
    return edits, ["lone-paint", "book-2"]


def apply_changes(settings: Settings, tenant: str, docs, fleet: Fleet, say) -> list[str]:
    """Publish wave 3 for `tenant`, wait until memory holds it; the documents still pending."""
    edits, deleted = changes(docs)
    publish(
        settings,
        [Document(tenant=tenant, doc_id=doc_id, text=text, version=version) for doc_id, text, version in edits],
        quiet=True,
    )
    delete(settings, tenant, deleted, quiet=True)
    say(f"published wave 3: {len(edits)} versions, {len(deleted)} deletions")
    final = {doc_id: text for doc_id, text, _ in edits}
    return wait_indexed(
        settings, [Document(tenant=tenant, doc_id=d, text=t) for d, t in final.items()], fleet, WAIT_S, deleted
    )


def export(env: dict, tenant: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "ops.cli", "export", "--tenant", tenant],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"memstream export --tenant {tenant} → {out.returncode}: {out.stderr[-2000:]}"
    return json.loads(out.stdout)


@pytest.mark.stack
@pytest.mark.timeout(1800)  # a broken pipeline waits out two wave timeouts before it reports
def test_chaos_loses_nothing_and_changes_nothing(private_stack, tmp_path, capsys):
    started = time.monotonic()
    rng = random.Random(SEED)
    docs = corpus(DOCS)
    waves = {w: [d for d in docs if d.wave == w] for w in (1, 2)}
    answers = {d.text: extraction(d) for d in docs}
    unknown: list[str] = []
    say = ActionLog(tmp_path / "chaos.log")
    say(
        f"seed {SEED}, {len(docs)} documents ({len(waves[1])} + {len(waves[2])}), LLM latency {LATENCY_S:g}s, logs in {tmp_path}"
    )
    failures: list[str] = []
    phases: dict[str, float] = {}

    def outside_the_corpus(body: dict) -> str:
        unknown.append(body["messages"][-1]["content"][-80:])
        return '{"entities": [], "facts": []}'

    (tmp_path / "logs").mkdir()
    with FakeOpenAI(answers=answers, default=outside_the_corpus) as llm:
        env = worker_env(private_stack.settings, llm.base_url, tmp_path / "workers")
        settings = Settings.from_env(env)
        ensure_topics(settings)
        fleet = Fleet(env, tmp_path / "logs", ROOT, say)
        undisturbed, disrupted = f"undisturbed-{uuid.uuid4().hex[:6]}", f"chaos-{uuid.uuid4().hex[:6]}"
        try:
            for role in ROLES:
                fleet.start(role)
            say(f"workers: {', '.join(w.name for w in fleet.workers)}")

            # the reference: the same corpus, same waves, nothing disturbed, no LLM latency
            mark = time.monotonic()
            for wave in (1, 2):
                publish(settings, documents(undisturbed, waves[wave]), quiet=True)
                pending = wait_indexed(settings, documents(undisturbed, waves[wave]), fleet, WAIT_S)
                say(f"undisturbed run: wave {wave} indexed ({len(pending)} pending)")
                if pending:
                    failures.append(
                        f"undisturbed run, wave {wave}: {len(pending)} documents not indexed after {WAIT_S:g}s: {pending[:10]}"
                    )
            pending = apply_changes(settings, undisturbed, docs, fleet, say)
            if pending:
                failures.append(
                    f"undisturbed run, wave 3: {len(pending)} documents not changed after {WAIT_S:g}s: {pending[:10]}"
                )
            phases["undisturbed run"] = time.monotonic() - mark

            # the disrupted run calls the LLM again (a cache hit would end every call at once)
            client = redis.Redis.from_url(settings.redis_url)
            cached = list(client.scan_iter(match=LLM_CACHE_PATTERN, count=1000))
            if cached:
                client.delete(*cached)
            client.close()
            llm.latency_s, calls_before = LATENCY_S, llm.calls

            mark = time.monotonic()
            chaos = Chaos(fleet, private_stack, rng, say, REDIS_OUTAGE_S, llm, SLOW_CALL_S)
            actions = plan(rng, brokers=BROKERS)
            say("plan: " + ", ".join(f"{a.kind} {a.role}".strip() for a in actions))
            split = round(
                (len(actions) - 1) * len(waves[1]) / len(docs)
            )  # actions shared by the waves as their documents are
            for wave, wave_actions in ((1, actions[:split]), (2, actions[split:-1])):
                wave_docs = documents(disrupted, waves[wave])
                published: list[Document] = []
                # one batch before each action, so every action lands while work is in flight
                batches = (
                    [wave_docs[i :: len(wave_actions)] for i in range(len(wave_actions))]
                    if wave_actions
                    else [wave_docs]
                )
                for i, batch in enumerate(batches):
                    publish(settings, batch, quiet=True)
                    published += batch
                    say(f"published {len(batch)} documents of wave {wave}")
                    if i < len(wave_actions):
                        time.sleep(rng.uniform(1.0, 3.0))
                        fleet.supervise()
                        say(
                            f"{len(unindexed(settings, published))} of {len(published)} published documents not yet indexed, {llm.in_flight} LLM calls in flight"
                        )
                        chaos.run(wave_actions[i])
                pending = wait_indexed(settings, wave_docs, fleet, WAIT_S)
                say(f"disrupted run: wave {wave} indexed ({len(pending)} pending)")
                if pending:
                    failures.append(
                        f"disrupted run, wave {wave}: {len(pending)} documents not indexed after {WAIT_S:g}s: {pending[:10]}"
                    )
            # wave 3, documents change, with the last action landing while the changes are in flight
            edits, deleted = changes(docs)
            publish(
                settings,
                [Document(tenant=disrupted, doc_id=d, text=t, version=v) for d, t, v in edits[: len(edits) // 2]],
                quiet=True,
            )
            time.sleep(rng.uniform(0.5, 1.5))
            chaos.run(actions[-1])
            publish(
                settings,
                [Document(tenant=disrupted, doc_id=d, text=t, version=v) for d, t, v in edits[len(edits) // 2 :]],
                quiet=True,
            )
            delete(settings, disrupted, deleted, quiet=True)
            final = {d: t for d, t, _ in edits}
            pending = wait_indexed(
                settings,
                [Document(tenant=disrupted, doc_id=d, text=t) for d, t in final.items()],
                fleet,
                WAIT_S,
                deleted,
            )
            say(f"disrupted run: wave 3 (changes) in memory ({len(pending)} pending)")
            if pending:
                failures.append(
                    f"disrupted run, wave 3: {len(pending)} documents not changed after {WAIT_S:g}s: {pending[:10]}"
                )
            phases["disrupted run"] = time.monotonic() - mark
            calls = llm.answered_by[calls_before:]  # the chunk text each call was answered for
        finally:
            fleet.stop_all()

    # ---- audits ----------------------------------------------------------------------------
    mark = time.monotonic()
    expected, actual = comparable_export(export(env, undisturbed)), comparable_export(export(env, disrupted))
    differences = export_differences(expected, actual)
    if differences:
        failures.append(
            "export differs from the undisturbed run's (undisturbed → disrupted):\n" + "\n".join(differences)
        )

    values = [r.value for r in read_topic(settings.kafka_bootstrap, settings.topics.indexed_facts)]
    audits = audit_events(values)
    for tenant in (undisturbed, disrupted):
        problems = audits[tenant].problems if tenant in audits else [f"no events at all for tenant {tenant}"]
        if problems:
            failures.append(
                f"events of {tenant}: {len(problems)} event ids published with different content:\n  "
                + "\n  ".join(problems[:12])
            )
    ids_per_tenant = {
        t: {json.loads(v)["event_id"] for v in values if json.loads(v)["tenant"] == t} for t in (undisturbed, disrupted)
    }

    letters = [json.loads(r.value) for r in read_topic(settings.kafka_bootstrap, settings.topics.dlq)]
    if letters:
        failures.append(
            f"DLQ holds {len(letters)} letters:\n  "
            + "\n  ".join(f"[{x.get('tenant')}] {x.get('topic')}: {str(x.get('error'))[:200]}" for x in letters[:12])
        )
    if unknown:
        failures.append(
            f"the fake LLM was asked about {len(unknown)} texts outside the corpus (a harness bug): {unknown[:3]}"
        )
    if not calls:
        failures.append(
            "the disrupted run never called the LLM: its answers came from a cache the harness failed to clear"
        )
    phases["audits"] = time.monotonic() - mark

    audit = audits.get(disrupted)
    summary = {
        "seed": SEED,
        "documents": len(docs),
        "llm latency s": LATENCY_S,
        "SIGKILLs": chaos.counts["kill"],
        "SIGTERMs": chaos.counts["term"],
        "restarts": chaos.counts["restarts"],
        "crash restarts": fleet.crashes,
        "extractors joined": chaos.counts["joins"],
        "redis outages": chaos.counts["redis_outages"],
        "kafka restarts": chaos.counts["kafka_restarts"],
        "brokers / leaders SIGKILLed": f"{BROKERS} / {chaos.counts['broker_kills']}",
        "events (disrupted run)": audit.events if audit else 0,
        "redeliveries seen (same id, same bytes)": audit.redeliveries if audit else 0,
        "event ids decided twice / conflicting": f"{len(audit.decided_twice)} / {len(audit.conflicting)}"
        if audit
        else "-",
        "event ids shared by the two tenants": len(ids_per_tenant[undisturbed] & ids_per_tenant[disrupted]),
        "LLM calls (disrupted run) / distinct chunks": f"{len(calls)} / {len(set(calls))} ({len(calls) - len(set(calls))} extractions redone)",
        "dead letters": len(letters),
        "export differences": len(differences),
        **{f"{phase} s": round(seconds, 1) for phase, seconds in phases.items()},
        "elapsed s": round(time.monotonic() - started, 1),
    }
    report = "chaos summary:\n" + "\n".join(f"  {k}: {v}" for k, v in summary.items())
    say(report)
    with capsys.disabled():
        print("\n" + report + f"\n  action log: {say.path}")
    assert chaos.counts["kill"] >= 3 and chaos.counts["term"] >= 3 and chaos.counts["joins"] == 1
    assert chaos.counts["broker_kills"] == (BROKERS > 1)
    assert not failures, f"seed {SEED}; action log {say.path}\n" + "\n".join(failures) + "\n" + report
