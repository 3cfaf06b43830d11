"""`memstream bench index`: the indexing pipeline on real Kafka + Redis with the LLM extractor
and resolver against a fake OpenAI-compatible LLM of fixed latency (a benchmark double).

It reports, side by side in one run:
- throughput: chunks/s for a burst of one-chunk documents through 1 (and 2: `--extractors 1,2`)
  extractor processes — each running the extractor role alone, a further process running
  chunker, detector, resolver and the query API — against the LLM-bound limit
  (extractors × concurrency / latency), the best any pipeline calling that LLM could do, and
  the ratio of each count to the first;
- LLM calls per chunk (extraction + resolution), the LLM's average calls in flight, the cores
  each process used during the burst (/proc), and a line saying what bounds the throughput;
- with `--embedder fake` the workers embed through MEMSTREAM_EMBEDDER=openai against
  ops.fake_llm.FakeEmbeddings, so this machine's CPU is not spent on a model; with the local
  embedder, the embedding-bound limit (the same texts through the model alone);
- per-document indexing time when the memory already holds 1k / 5k / 20k passages (filled
  directly in Redis with synthetic records and random vectors, so the fill is fast), as a ratio
  to the smallest size: it must stay flat, since nothing is rebuilt per insert.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ops.bench.corpora import TOWNS, synthetic_doc
from ops.fake_llm import FakeOpenAI
from ops.publish import publish, wait_indexed
from ops.stack.kafka_admin import delete_namespace_topics, ensure_topics
from ops.stack.processes import WorkerProcess, worker_env
from ops.stack.services import Stack, free_port, stderr
from store import Memory
from store.facts import Fact
from topics import Chunk, Document
from topics.records import Triple
from workers.algorithms.chunking import chunk_id_of
from workers.algorithms.normalize import entity_id, fact_id, relation_name, schema_id
from workers.models.extraction import RulesExtractor
from workers.settings import Settings


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
        answers[text] = json.dumps(
            {
                "entities": [{"name": e.name, "type": e.type} for e in extraction.entities],
                "facts": [
                    {
                        "head": f.head,
                        "head_type": f.head_type,
                        "relation": f.relation,
                        "tail": f.tail,
                        "tail_type": f.tail_type,
                        "category": f.category,
                        "valid_from": None,
                        "valid_to": None,
                    }
                    for f in extraction.facts
                ],
            }
        )
        facts.update(fact_id(entity_id(f.head), relation_name(f.relation), entity_id(f.tail)) for f in extraction.facts)
        passages[chunk_id_of(text)] = text  # each benchmark document is one chunk

    def keep_all(body: dict) -> str:
        mentioned = "\n".join(m["content"] for m in body["messages"])
        passage = min(p for p in passages if p in mentioned)
        return json.dumps(
            {
                "decisions": [
                    {
                        "fact_id": f,
                        "action": "keep",
                        "evidence": passages[passage],
                        "evidence_passage_id": passage,
                        "valid_from": None,
                        "valid_to": None,
                        "scope": None,
                    }
                    for f in sorted(facts)
                    if f in mentioned
                ]
            }
        )

    return FakeOpenAI(answers=answers, schema_answers={"resolution": keep_all}, latency_s=latency_s)


async def fill_memory(
    settings: Settings, tenant: str, passages: int, offset: int, dims: int = 384, batch: int = 100
) -> None:
    """Synthetic memory: passages with 3 entities and 3 active facts each, random vectors."""
    memory = Memory.from_url(settings.redis_url, vector_index=settings.vector_index)
    rng = np.random.default_rng(offset)
    try:
        await memory.ensure_indexes(tenant)
        for start in range(offset, offset + passages, batch):
            pipe = memory.pipeline(tenant)
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
                for (h, r, t), vec in zip(
                    ((0, "founded", 1), (1, "sells goods in", 2), (0, "visited", 2)), vectors[4:]
                ):
                    fid = fact_id(ids[h], r, ids[t])
                    triple = Triple(names[h], r, names[t], "ENTITY", "ENTITY")
                    memory.stage_new_fact(
                        pipe, tenant, Fact.extracted(fid, triple, ids[h], ids[t], schema_id("ENTITY", r, "ENTITY")), vec
                    )
                    memory.stage_fact_update(pipe, tenant, fid, {"status": "active"})
                    memory.stage_fact_passage(pipe, tenant, fid, chunk.chunk_id)
            await pipe.execute()
    finally:
        await memory.close()


def _docs(tenant: str, start: int, count: int) -> list[Document]:
    return [Document(tenant=tenant, doc_id=f"bench-{i}", text=synthetic_doc(i)) for i in range(start, start + count)]


@dataclass
class Phase:
    """One throughput measurement: a burst through `extractors` extractor processes."""

    extractors: int
    chunks: int
    seconds: float
    llm_calls: int
    llm_busy_s: float  # request-seconds the fake LLM spent answering during the burst
    cpu: dict[str, float]  # process name → cores used on average during the burst
    machine_busy: float  # share of the machine's CPU time busy during the burst, every process counted (others' too)

    def row(self, latency_ms: int, concurrency: int) -> dict:
        limit = self.extractors * concurrency / (latency_ms / 1000)  # LLM-bound: every slot of every extractor busy
        rate = self.chunks / self.seconds
        return {
            "extractors": self.extractors,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 2),
            "chunks_per_s": round(rate, 2),
            "llm_bound_chunks_per_s": round(limit, 2),
            "fraction_of_limit": round(rate / limit, 3),
            "llm_calls_per_chunk": round(self.llm_calls / self.chunks, 3),
            "llm_in_flight_avg": round(self.llm_busy_s / self.seconds, 2),
            "llm_slots": self.extractors * concurrency,
            "cpu_cores": {name: round(c, 2) for name, c in self.cpu.items()},
            "machine_busy": round(self.machine_busy, 3),
        }


def run_index_bench(
    settings: Settings,
    sizes: list[int],
    probe: int,
    burst: int,
    latency_ms: int,
    concurrency: int,
    as_json: bool,
    extractors: Sequence[int] = (1,),
    partitions: int = 4,
    embedder: str = "local",
) -> int:
    """Throughput of a burst for each count of extractor processes in `extractors` (side by
    side, in this run), then per-document time as memory grows (`sizes`; none: skipped).

    With several counts the roles are split: one process runs the extractor role alone per
    extractor, one more runs chunker, detector, resolver and the query API. `embedder`
    "fake": MEMSTREAM_EMBEDDER=openai against ops.fake_llm.FakeEmbeddings (no model on this
    CPU), so the LLM is the only bound meant to remain."""
    Stack(settings).up(stderr)
    run_id = uuid.uuid4().hex[:8]
    home = Path(tempfile.mkdtemp(prefix="memstream-bench-"))
    bursts = {n: _docs(f"bench{run_id}-x{n}", 20_000_000 + 1_000_000 * n, burst) for n in extractors}
    warms = {n: _docs(f"bench{run_id}-warm{n}", 10_000_000 + 10_000 * n, 12) for n in extractors}
    tenant = f"bench{run_id}-grow"
    probes = {size: [_docs(tenant, 30_000_000 + size + i, 1) for i in range(probe)] for size in sizes}
    corpus = [d for docs in (*bursts.values(), *warms.values()) for d in docs] + [
        doc for docs in probes.values() for batch in docs for doc in batch
    ]
    with contextlib.ExitStack() as stack:
        llm = stack.enter_context(rules_llm((doc.text for doc in corpus), latency_ms / 1000))
        embedder_env = {}
        if embedder == "fake":
            from ops.fake_llm import FakeEmbeddings  # the fake embeddings endpoint (a benchmark double)

            fake = stack.enter_context(FakeEmbeddings(dims=384))
            embedder_env = {
                "MEMSTREAM_EMBEDDER": "openai",
                "MEMSTREAM_EMBEDDER_BASE_URL": fake.base_url,
                "MEMSTREAM_EMBEDDER_MODEL": f"fake-embed-{run_id}",
                "MEMSTREAM_EMBEDDER_DIMS": "384",
            }
        phases, rows = [], []
        stack.callback(
            lambda: delete_namespace_topics(settings, [f"bench{run_id}x{n}" for n in extractors])
        )  # the broker keeps none
        for n in extractors:
            ns = f"bench{run_id}x{n}"
            env = worker_env(
                settings,
                ns,
                home / ns,
                MEMSTREAM_EXTRACTOR="llm",
                MEMSTREAM_RESOLVER="llm",
                MEMSTREAM_LLM_BASE_URL=llm.base_url,
                MEMSTREAM_LLM_MODEL=f"fake-{ns}",
                MEMSTREAM_LLM_CONCURRENCY=str(concurrency),
                MEMSTREAM_HTTP_PORT=str(free_port()),
                MEMSTREAM_PARTITIONS=str(partitions),
                **embedder_env,
            )
            (home / ns).mkdir(parents=True)
            bench = Settings.from_env(env)
            ensure_topics(bench)
            stderr(
                f"bench: {n} extractor process(es), {partitions} partitions, {concurrency} LLM calls in flight each, {latency_ms} ms per call"
            )
            with contextlib.ExitStack() as procs:
                rest = procs.enter_context(
                    WorkerProcess.spawn(home / ns / "others.log", env, role="chunker,detector,resolver,query")
                )
                workers = {"others": rest}
                for i in range(n):
                    workers[f"extractor{i + 1}"] = procs.enter_context(
                        WorkerProcess.spawn(home / ns / f"extractor{i + 1}.log", env, role="extractor")
                    )
                rest.wait_healthy()
                _index(bench, warms[n][:4], workers.values())  # model load, first index creation, the group joined
                time.sleep(bench.session_timeout)  # the extractors' group settled
                _index(bench, warms[n][4:], workers.values())
                for name, worker in workers.items():
                    if not worker.running():
                        raise RuntimeError(f"bench: {name} exited; see {worker.log}")
                phases.append(_burst(bench, bursts[n], n, llm, workers))
                if n == extractors[0] and sizes:
                    rows = _growth(bench, tenant, sizes, probes)
    throughput = [phase.row(latency_ms, concurrency) for phase in phases]
    for row in throughput[1:]:
        row["ratio_to_first"] = round(row["chunks_per_s"] / throughput[0]["chunks_per_s"], 3)
    result = {
        "latency_ms": latency_ms,
        "concurrency": concurrency,
        "partitions": partitions,
        "embedder": embedder,
        "throughput": throughput,
        "bound": _bound(throughput[-1]),
        "per_document": rows,
    }
    if embedder == "local":
        stderr("bench: embedding-bound limit (the same texts through the local embedder alone)")
        embed_bound = _embedding_bound(bursts[extractors[0]])
        result["embedding_bound_chunks_per_s"] = round(embed_bound, 2)
    if as_json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"LLM latency {latency_ms} ms, {concurrency} calls in flight per extractor, {partitions} partitions, {embedder} embedder, {burst} one-chunk documents"
    )
    for t in throughput:
        ratio = f", {t['ratio_to_first']}x the first" if "ratio_to_first" in t else ""
        print(
            f"{t['extractors']} extractor(s): {t['chunks_per_s']} chunks/s vs LLM-bound limit {t['llm_bound_chunks_per_s']} "
            f"({100 * t['fraction_of_limit']:.0f}%){ratio}; {t['llm_calls_per_chunk']} LLM calls per chunk; "
            f"LLM in flight {t['llm_in_flight_avg']} of {t['llm_slots']} on average; {t['seconds']} s"
        )
        print("    cores used: " + ", ".join(f"{name} {cores}" for name, cores in t["cpu_cores"].items()))
    if "embedding_bound_chunks_per_s" in result:
        print(f"embedding-bound limit (local embedder alone): {result['embedding_bound_chunks_per_s']} chunks/s")
    print(f"bound: {result['bound']}")
    if rows:
        print(f"vector index: {bench.vector_index}")
        print(f"{'passages in memory':>20} {'doc p50 ms':>11} {'doc mean ms':>12} {'ratio':>7}")
        for row in rows:
            print(
                f"{row['passages']:>20} {row['doc_ms_p50']:>11} {row['doc_ms_mean']:>12} {row['ratio_to_smallest']:>7}"
            )
    return 0


def _burst(
    settings: Settings, documents: list[Document], extractors: int, llm: FakeOpenAI, workers: dict[str, WorkerProcess]
) -> Phase:
    stderr(f"bench: burst of {len(documents)} documents")
    pids = {name: worker.pid for name, worker in workers.items()}
    calls, busy = llm.calls, llm.busy_s
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    own_before, machine_before = sum(os.times()[:2]), _machine_busy()
    seconds = _index(settings, documents, workers.values())
    cpu = {name: (_cpu_seconds(pid) - cpu_before[name]) / seconds for name, pid in pids.items()}
    cpu["bench (publisher, fakes)"] = (sum(os.times()[:2]) - own_before) / seconds
    machine_busy, machine_total = (after - before for after, before in zip(_machine_busy(), machine_before))
    return Phase(
        extractors,
        len(documents),
        seconds,
        llm.calls - calls,
        llm.busy_s - busy,
        cpu,
        machine_busy / machine_total if machine_total else 0.0,
    )


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, every process included (/proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return float(sum(ticks) - idle), float(sum(ticks))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat, Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bound(row: dict) -> str:
    """What bounds the burst's throughput: the LLM when its slots stay full, else the busiest
    process's CPU (one core is all a worker's event loop can use) or the machine's cores."""
    llm_share = row["llm_in_flight_avg"] / row["llm_slots"]
    name, cores = max(row["cpu_cores"].items(), key=lambda item: item[1])
    total, machine = sum(row["cpu_cores"].values()), os.cpu_count() or 1
    facts = (
        f"LLM slots {100 * llm_share:.0f}% busy ({row['llm_in_flight_avg']} of {row['llm_slots']}); busiest process {name} at "
        f"{cores} cores; the benchmark's processes {total:.2f} of {machine} cores; the machine {100 * row['machine_busy']:.0f}% busy"
    )
    if llm_share >= 0.8:
        return f"the LLM ({100 * row['fraction_of_limit']:.0f}% of its limit): {facts}"
    if row["machine_busy"] >= 0.8 and total < 0.8 * machine:
        return (
            f"the machine's CPU, taken mostly by processes outside the benchmark: {facts}; "
            f"the LLM would allow {1 / max(row['fraction_of_limit'], 1e-9):.1f}x this throughput"
        )
    if total >= 0.8 * machine:
        return f"the machine's CPU: {facts}; the LLM would allow {1 / max(row['fraction_of_limit'], 1e-9):.1f}x this throughput"
    if cores >= 0.8:
        return f"the CPU of {name} (one event loop): {facts}; the LLM would allow {1 / max(row['fraction_of_limit'], 1e-9):.1f}x this throughput"
    return f"neither the LLM nor a CPU alone (waits: Kafka, Redis round trips): {facts}"


def _growth(settings: Settings, tenant: str, sizes: list[int], probes: dict) -> list[dict]:
    rows, filled = [], 0
    for size in sizes:
        stderr(f"bench: filling memory to {size} passages")
        asyncio.run(fill_memory(settings, tenant, size - filled, filled))
        filled = size
        latencies = [_index(settings, docs) for docs in probes[size]]
        rows.append(
            {
                "passages": size,
                "probe_docs": len(latencies),
                "doc_ms_p50": round(1000 * statistics.median(latencies), 1),
                "doc_ms_mean": round(1000 * statistics.fmean(latencies), 1),
            }
        )
    for row in rows:
        row["ratio_to_smallest"] = round(row["doc_ms_p50"] / rows[0]["doc_ms_p50"], 3)
    return rows


def _embedding_bound(documents: list[Document]) -> float:
    """Chunks/s of the local embedder alone on the texts the extractor embeds for these
    documents (passage, entity names, facts, schemas) — the other ceiling on this machine."""
    from workers.models.embedding import LocalEmbedder

    embedder = LocalEmbedder()
    embedder.embed(["warm up"])
    started = time.perf_counter()
    for doc in documents:
        ex = RulesExtractor().extract_sync(doc.text)
        embedder.embed(
            [doc.text]
            + [e.name for e in ex.entities]
            + [f"{f.head} {f.relation} {f.tail}" for f in ex.facts]
            + [f"{f.head_type} {f.relation} {f.tail_type}" for f in ex.facts]
        )
    return len(documents) / (time.perf_counter() - started)


def _index(settings: Settings, documents: list[Document], workers: Iterable[WorkerProcess] = ()) -> float:
    started = time.perf_counter()
    publish(settings, documents, quiet=True)
    pending = wait_indexed(settings, documents, timeout_s=900, quiet=True, workers=list(workers))
    if pending:
        raise RuntimeError(f"benchmark documents not indexed in time: {pending[:5]}")
    return time.perf_counter() - started
