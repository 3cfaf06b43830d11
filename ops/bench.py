"""`memstream bench index`: the indexing pipeline on real Kafka + Redis with the LLM extractor
and resolver against a fake OpenAI-compatible LLM of fixed latency (a benchmark double).

It reports, side by side in one run:
- throughput: chunks/s for a burst of documents against the LLM-bound limit
  (concurrency / latency) — the best any pipeline calling that LLM could do;
- LLM calls per chunk (extraction + resolution);
- per-document indexing time when the memory already holds 1k / 5k / 20k passages (filled
  directly in Redis with synthetic records and random vectors, so the fill is fast), as a ratio
  to the smallest size: it must stay flat, since nothing is rebuilt per insert.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterable

import numpy as np

from ops.fake_llm import FakeOpenAI
from ops.kafka_admin import ensure_topics
from ops.publish import publish, wait_indexed
from ops.processes import WorkerProcess, worker_env
from ops.stack import Stack, free_port, stderr
from store import Memory
from store.facts import Fact
from topics import Chunk, Document
from topics.records import Triple
from workers.models.extraction import RulesExtractor
from workers.algorithms.chunking import chunk_id_of
from workers.algorithms.normalize import entity_id, fact_id, relation_name, schema_id
from workers.settings import Settings

FIRST = ["Ada", "Bram", "Cora", "Dag", "Eira", "Finn", "Gro", "Hal", "Ines", "Jon", "Kari", "Lars", "Mina", "Nils", "Olga", "Per"]
LAST = ["Aune", "Berg", "Dahl", "Eide", "Foss", "Haug", "Lund", "Moe", "Nes", "Rud", "Sand", "Vik"]
THINGS = ["Ropes", "Sails", "Clocks", "Maps", "Bells", "Looms", "Kites", "Oars", "Nets", "Glass", "Salt", "Cider"]
TOWNS = ["Brightwater", "Port Selka", "Kestrel Point", "Norland", "Calder", "Ostra", "Merrow", "Halden"]


def synthetic_doc(i: int) -> str:
    person = f"{FIRST[i % 16]} {LAST[(i // 16) % 12]}{i}"
    company = f"{THINGS[i % 12]} Works{i}"
    return (f"{person} founded {company} in {1900 + i % 100}. {company} sells goods in {TOWNS[i % 8]}. "
            f"{person} lives in {TOWNS[(i + 3) % 8]}.")


def rules_llm(texts: Iterable[str], latency_s: float) -> FakeOpenAI:
    """The fake LLM of fixed latency for a known corpus, answering by input: each text's
    extraction is the rules extractor's, in the LLM schema, precomputed and matched by the text;
    a resolution keeps every fact of the corpus the request names, quoting the first named
    passage of the corpus as evidence (a quote the resolver finds in it)."""
    answers: dict[str, str] = {}
    facts: set[str] = set()
    passages: dict[str, str] = {}  # id → text
    for text in texts:
        extraction = RulesExtractor().extract_sync(text)
        answers[text] = json.dumps({
            "entities": [{"name": e.name, "type": e.type} for e in extraction.entities],
            "facts": [{"head": f.head, "head_type": f.head_type, "relation": f.relation, "tail": f.tail, "tail_type": f.tail_type,
                       "category": f.category, "valid_from": None, "valid_to": None} for f in extraction.facts],
        })
        facts.update(fact_id(entity_id(f.head), relation_name(f.relation), entity_id(f.tail)) for f in extraction.facts)
        passages[chunk_id_of(text)] = text  # each benchmark document is one chunk

    def keep_all(body: dict) -> str:
        mentioned = "\n".join(m["content"] for m in body["messages"])
        passage = min(p for p in passages if p in mentioned)
        return json.dumps({"decisions": [{"fact_id": f, "action": "keep", "evidence": passages[passage], "evidence_passage_id": passage,
                                          "valid_from": None, "valid_to": None, "scope": None} for f in sorted(facts) if f in mentioned]})

    return FakeOpenAI(answers=answers, schema_answers={"resolution": keep_all}, latency_s=latency_s)


async def fill_memory(settings: Settings, tenant: str, passages: int, offset: int, dims: int = 384, batch: int = 100) -> None:
    """Synthetic memory: passages with 3 entities and 3 active facts each, random vectors."""
    memory = Memory.from_url(settings.redis_url, vector_index=settings.vector_index)
    rng = np.random.default_rng(offset)
    try:
        await memory.ensure_indexes(tenant)
        for start in range(offset, offset + passages, batch):
            pipe = memory.pipeline()
            for i in range(start, min(start + batch, offset + passages)):
                text = f"filler passage {i}: " + synthetic_doc(i)
                chunk = Chunk(tenant, f"fill{i:08d}", f"fill-{i}", 0, 1, text)
                vectors = rng.standard_normal((7, dims)).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                names = [f"Filler Person {i}", f"Filler Company {i}", TOWNS[i % 8]]
                ids = [entity_id(n) for n in names]
                memory.stage_passage(pipe, tenant, chunk, ids, vectors[0])
                for name, eid, vec in zip(names, ids, vectors[1:4]):
                    memory.stage_entity(pipe, tenant, eid, name, "ENTITY", vec, chunk.chunk_id)
                for (h, r, t), vec in zip(((0, "founded", 1), (1, "sells goods in", 2), (0, "visited", 2)), vectors[4:]):
                    fid = fact_id(ids[h], r, ids[t])
                    triple = Triple(names[h], r, names[t], "ENTITY", "ENTITY")
                    memory.stage_new_fact(pipe, tenant, Fact.extracted(fid, triple, ids[h], ids[t], schema_id("ENTITY", r, "ENTITY")), vec)
                    memory.stage_fact_update(pipe, tenant, fid, {"status": "active"})
                    memory.stage_fact_passage(pipe, tenant, fid, chunk.chunk_id)
            await pipe.execute()
    finally:
        await memory.close()


def _docs(tenant: str, start: int, count: int) -> list[Document]:
    return [Document(tenant=tenant, doc_id=f"bench-{i}", text=synthetic_doc(i)) for i in range(start, start + count)]


def run_index_bench(settings: Settings, sizes: list[int], probe: int, burst: int, latency_ms: int, concurrency: int, as_json: bool) -> int:
    Stack(settings).up(stderr)
    ns = f"bench{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="memstream-bench-"))
    tenant = f"{ns}-grow"
    warm, burst_docs = _docs(f"{ns}-warm", 10_000_000, 4), _docs(f"{ns}-burst", 20_000_000, burst)
    probes = {size: [_docs(tenant, 30_000_000 + size + i, 1) for i in range(probe)] for size in sizes}
    corpus = warm + burst_docs + [doc for docs in probes.values() for batch in docs for doc in batch]
    with rules_llm((doc.text for doc in corpus), latency_ms / 1000) as llm:
        env = worker_env(settings, ns, home, MEMSTREAM_EXTRACTOR="llm", MEMSTREAM_RESOLVER="llm", MEMSTREAM_LLM_BASE_URL=llm.base_url,
                         MEMSTREAM_LLM_MODEL=f"fake-{ns}", MEMSTREAM_LLM_CONCURRENCY=str(concurrency), MEMSTREAM_HTTP_PORT=str(free_port()))
        bench = Settings.from_env(env)
        ensure_topics(bench)
        with WorkerProcess.spawn(home / "worker.log", env) as worker:
            worker.wait_healthy()
            # warm up: model load, first index creation
            _index(bench, warm)

            stderr("bench: embedding-bound limit (the same texts through the local embedder alone)")
            embed_bound = _embedding_bound(burst_docs)
            stderr(f"bench: burst of {burst} documents")
            calls_before = llm.calls
            seconds = _index(bench, burst_docs)
            throughput = {"chunks": burst, "seconds": round(seconds, 2), "chunks_per_s": round(burst / seconds, 2),
                          "llm_bound_chunks_per_s": round(concurrency / (latency_ms / 1000), 2),
                          "llm_calls_per_chunk": round((llm.calls - calls_before) / burst, 3)}
            throughput["fraction_of_limit"] = round(throughput["chunks_per_s"] / throughput["llm_bound_chunks_per_s"], 3)
            throughput["embedding_bound_chunks_per_s"] = round(embed_bound, 2)
            throughput["fraction_of_embedding_bound"] = round(throughput["chunks_per_s"] / embed_bound, 3)

            rows, filled = [], 0
            for size in sizes:
                stderr(f"bench: filling memory to {size} passages")
                asyncio.run(fill_memory(bench, tenant, size - filled, filled))
                filled = size
                latencies = [_index(bench, docs) for docs in probes[size]]
                rows.append({"passages": size, "probe_docs": probe, "doc_ms_p50": round(1000 * statistics.median(latencies), 1),
                             "doc_ms_mean": round(1000 * statistics.fmean(latencies), 1)})
            for row in rows:
                row["ratio_to_smallest"] = round(row["doc_ms_p50"] / rows[0]["doc_ms_p50"], 3)
    result = {"latency_ms": latency_ms, "concurrency": concurrency, "vector_index": bench.vector_index, "throughput": throughput, "per_document": rows}
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        t = throughput
        print(f"throughput: {t['chunks_per_s']} chunks/s vs LLM-bound limit {t['llm_bound_chunks_per_s']} "
              f"({100 * t['fraction_of_limit']:.0f}%) and embedding-bound limit {t['embedding_bound_chunks_per_s']} "
              f"({100 * t['fraction_of_embedding_bound']:.0f}%); {t['llm_calls_per_chunk']} LLM calls per chunk ({burst} documents, {t['seconds']} s)")
        print(f"vector index: {bench.vector_index}")
        print(f"{'passages in memory':>20} {'doc p50 ms':>11} {'doc mean ms':>12} {'ratio':>7}")
        for row in rows:
            print(f"{row['passages']:>20} {row['doc_ms_p50']:>11} {row['doc_ms_mean']:>12} {row['ratio_to_smallest']:>7}")
    return 0


def _embedding_bound(documents: list[Document]) -> float:
    """Chunks/s of the local embedder alone on the texts the extractor embeds for these
    documents (passage, entity names, facts, schemas) — the other ceiling on this machine."""
    from workers.models.embedding import LocalEmbedder

    embedder = LocalEmbedder()
    embedder.embed(["warm up"])
    started = time.perf_counter()
    for doc in documents:
        ex = RulesExtractor().extract_sync(doc.text)
        embedder.embed([doc.text] + [e.name for e in ex.entities] + [f"{f.head} {f.relation} {f.tail}" for f in ex.facts]
                       + [f"{f.head_type} {f.relation} {f.tail_type}" for f in ex.facts])
    return len(documents) / (time.perf_counter() - started)


def _index(settings: Settings, documents: list[Document]) -> float:
    started = time.perf_counter()
    publish(settings, documents, quiet=True)
    pending = wait_indexed(settings, documents, timeout_s=900, quiet=True)
    if pending:
        raise RuntimeError(f"benchmark documents not indexed in time: {pending[:5]}")
    return time.perf_counter() - started
