"""`memstream bench index --rules`: the rules pipeline against the embedding-bound limit.

The real workers (one `memstream worker` process, every role) on the local stack, with the
`rules` extractor and the local embedder, index the first N documents of the shared
HotpotQA-100 corpus. Printed side by side, all measured in this one run:

- the pipeline's chunks/s (publish to every chunk through the resolver);
- the embedding-bound limit: the texts the extractor embeds for those chunks (passage, entity
  names, facts, schemas), one embed call per chunk as the extractor makes it, by LocalEmbedder
  alone in this process — no Kafka, no Redis; and the passages alone. Measured just before
  each tree's run, so that run and its limit see the same load on a shared machine;
- Redis round trips per chunk, counted in process (ops.testing.LocalIndexer over Redis with a
  counting client) on the first few documents;
- the texts the worker's model embedded (its shared-cache misses, read from its /metrics over the
  corpus) against the texts the chunks need vectors of: the share of model calls saved (by the
  shared cache, by the tenant's records: `memstream_extraction_texts_total{source="held"}`,
  where the tree counts it), and the least the model can embed, each distinct text once.

`--baseline-tree DIR` runs the same worker and count from another checkout (e.g. a worktree of
an older commit), so before and after print side by side. Each worker starts with the corpus's
vectors gone from the shared embedding cache, so neither run inherits the other's embeddings.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from ops.bench.datasets import load_dataset
from ops.publish import publish, wait_indexed
from ops.stack.kafka_admin import delete_namespace_topics, ensure_topics
from ops.stack.processes import WorkerProcess, worker_env
from ops.stack.services import Stack, free_port, stderr
from store import Memory
from topics import Document
from workers.algorithms.normalize import canonical_fact, entity_id
from workers.derived import embedded_texts as extractor_texts
from workers.models.extraction import RulesExtractor, drop_unnamed
from workers.settings import Settings
from workers.stages.chunker import pieces_of

DEFAULT_DOCS = 100  # HotpotQA-100 passages → 100 chunks; about 2 minutes per tree on an idle 2-core machine
COUNTED_DOCS = 20  # documents whose Redis round trips are counted in process

# Run in the tree under test (its own code, cwd first on sys.path): the pipeline in process
# over Redis, every command and pipeline sent counted as one round trip. Prints one JSON line.
COUNT_ROUND_TRIPS = r"""
import asyncio, collections, json, sys, uuid
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline as RedisPipeline
try:  # ops.testing since the ops/ split; a baseline tree from before it has ops.local_run
    from ops.testing import LocalIndexer
except ImportError:
    from ops.local_run import LocalIndexer
from store import Memory
from topics import Document
from workers.models.embedding import BatchingEmbedder, LocalEmbedder
from workers.algorithms.normalize import entity_id, relation_name
from workers.models.extraction import RulesExtractor, drop_unnamed
from workers.settings import Settings

counts = collections.Counter()
send_command, send_pipeline = aioredis.Redis.execute_command, RedisPipeline.execute

async def counted_command(self, *args, **options):
    if not isinstance(self, RedisPipeline) or self.watching:  # a queued pipeline command is sent with execute
        counts[str(args[0]).upper()] += 1
    return await send_command(self, *args, **options)

async def counted_pipeline(self, *args, **options):
    counts["MULTI/pipeline"] += 1
    return await send_pipeline(self, *args, **options)

aioredis.Redis.execute_command, RedisPipeline.execute = counted_command, counted_pipeline

async def main(redis_url, texts):
    settings = Settings.from_env({"MEMSTREAM_REDIS_URL": redis_url})
    memory = Memory.from_url(redis_url)
    tenant = "rt" + uuid.uuid4().hex[:10]
    indexer = LocalIndexer(settings, memory, BatchingEmbedder(LocalEmbedder()), RulesExtractor())
    counts.clear()
    await indexer.index([Document(tenant=tenant, doc_id=f"d{i}", text=t) for i, t in enumerate(texts)])
    await memory.close()
    print(json.dumps(dict(counts)))

asyncio.run(main(sys.argv[1], json.loads(sys.stdin.read())))
"""


@dataclass
class TreeRun:
    """One checkout's pipeline on the corpus."""

    tree: str
    seconds: float
    chunks_per_s: float
    round_trips_per_chunk: float
    commands: dict  # command → count over the counted documents
    texts: dict  # over the corpus, from the worker's /metrics: "model" (cache misses), "held", "embedded" (-1: not counted)


def chunk_texts(settings: Settings, documents: list[Document]) -> list[str]:
    """What the extractor reads, chunk by chunk (the chunker's own windows)."""
    return [p.text for doc in documents for p in pieces_of(doc, "", settings.chunk_tokens, settings.chunk_overlap)]


def embedded_texts(text: str) -> list[str]:
    """The texts the extractor embeds for one chunk of the rules extractor (entities merged by
    id, relations normalised, self-loops dropped as ExtractorStage.handle does on a tenant
    without aliases; tests/test_round_trips.py checks the two agree)."""
    extraction = drop_unnamed(RulesExtractor().extract_sync(text), "bench")
    names = {entity_id(e.name): e.name for e in extraction.entities}
    facts = []
    for triple in extraction.facts:
        triple = canonical_fact(triple)
        head_id, tail_id = entity_id(triple.head), entity_id(triple.tail)
        if head_id != tail_id:
            facts.append(triple)
            names.setdefault(head_id, triple.head)
            names.setdefault(tail_id, triple.tail)
    return extractor_texts(text, list(names.values()), facts)


# Run in the tree under test, so each tree's bound is that of its own LocalEmbedder (how it
# batches is part of what changed): the texts of each chunk on stdin, one JSON line out.
EMBEDDING_BOUND = r"""
import json, sys, time
from workers.models.embedding import LocalEmbedder
per_chunk = json.load(sys.stdin)
result = {}
for name, calls in (("passages_only", [texts[:1] for texts in per_chunk]), ("all_texts", per_chunk)):
    embedder = LocalEmbedder()  # a fresh cache: nothing embedded before counts
    embedder.embed(["warm up"])
    started = time.perf_counter()
    for texts in calls:
        embedder.embed(texts)
    result[name + "_chunks_per_s"] = round(len(per_chunk) / (time.perf_counter() - started), 2)
print(json.dumps(result))
"""


def embedding_bound(chunks: list[str], tree: Path) -> dict:
    """Chunks/s of `tree`'s LocalEmbedder alone: every text the pipeline embeds (one call per
    chunk, its in-process cache shared across chunks as in a worker), and the passages alone."""
    per_chunk = [embedded_texts(text) for text in chunks]  # the passage first
    out = subprocess.run(
        [sys.executable, "-c", EMBEDDING_BOUND],
        input=json.dumps(per_chunk),
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"embedding bound in {tree} failed:\n{out.stderr[-3000:]}")
    return {
        "texts_per_chunk": round(sum(map(len, per_chunk)) / len(chunks), 1),
        **json.loads(out.stdout.strip().splitlines()[-1]),
    }


async def forget_cached_vectors(settings: Settings, texts: list[str]) -> None:
    memory = Memory.from_url(settings.redis_url)
    try:
        from workers.models.embedding import LocalEmbedder, embedder_id

        # under the cache name of this tree's workers and of older ones (the bare name, before
        # the cache was keyed by name and dims), so a --baseline-tree of either kind starts cold
        for name in {embedder_id(LocalEmbedder).cache_name, LocalEmbedder.name}:
            await memory.embedding_cache(name).forget_many(texts)
    finally:
        await memory.close()


def count_round_trips(settings: Settings, tree: Path, texts: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", COUNT_ROUND_TRIPS, settings.redis_url],
        input=json.dumps(texts),
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"round-trip count in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_tree(
    settings: Settings,
    tree: Path,
    documents: list[Document],
    chunks: int,
    all_texts: list[str],
    counted: list[Document],
) -> TreeRun:
    """The workers of `tree` on the corpus: a worker process of every role with its own topics
    and tenant, warmed up on one document of another tenant, then timed over the corpus."""
    ns = f"rb{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="memstream-rules-bench-"))
    env = worker_env(
        settings,
        ns,
        home,
        MEMSTREAM_EXTRACTOR="rules",
        MEMSTREAM_RESOLVER="rules",
        MEMSTREAM_EMBEDDER="local",
        MEMSTREAM_HTTP_PORT=str(free_port()),
        MEMSTREAM_METRICS_PORT=str(free_port()),
    )
    bench = Settings.from_env(env)
    ensure_topics(bench)
    corpus = [Document(tenant=f"{ns}-corpus", doc_id=d.doc_id, text=d.text) for d in documents]
    asyncio.run(forget_cached_vectors(settings, all_texts))
    try:
        stderr(f"bench: {tree}: worker")
        with WorkerProcess.spawn(home / "worker.log", env, cwd=tree) as worker:
            worker.wait_healthy()
            warm = [
                Document(
                    tenant=f"{ns}-warm",
                    doc_id="warm",
                    text="Ada Berg founded Ropes Works in 1901. Ropes Works sells goods in Norland.",
                )
            ]
            publish(bench, warm, quiet=True)
            if wait_indexed(bench, warm, timeout_s=600, quiet=True, workers=[worker]):
                raise RuntimeError(f"warm-up document not indexed; see {home / 'worker.log'}")
            before = text_counts(bench)
            started = time.perf_counter()
            publish(bench, corpus, quiet=True)
            pending = wait_indexed(bench, corpus, timeout_s=3600, quiet=True, workers=[worker])
            seconds = time.perf_counter() - started
            after = text_counts(bench)
            if pending:
                raise RuntimeError(f"{len(pending)} documents not indexed in time; see {home / 'worker.log'}")
    finally:
        delete_namespace_topics(settings, [ns])  # the broker keeps none of the benchmark's topics
    stderr(f"bench: {tree}: counting round trips on {len(counted)} documents in process")
    commands = count_round_trips(settings, tree, [d.text for d in counted])
    counted_chunks = len(chunk_texts(settings, counted))
    return TreeRun(
        str(tree),
        round(seconds, 1),
        round(chunks / seconds, 2),
        round(sum(commands.values()) / counted_chunks, 1),
        dict(sorted(commands.items(), key=lambda kv: -kv[1])),
        {k: after[k] - before[k] if after[k] >= 0 else -1 for k in after},
    )


# what the worker's /metrics says of its texts: cache misses (what its model embedded) and, where
# the tree counts them, the texts its extractor took from the tenant's records or asked to embed
TEXT_COUNTERS = {
    "model": 'memstream_embedding_cache_total{result="miss"}',
    "held": 'memstream_extraction_texts_total{source="held"}',
    "embedded": 'memstream_extraction_texts_total{source="embedded"}',
}


def text_counts(settings: Settings) -> dict[str, int]:
    """The worker's text counters now (-1: a counter its tree does not have)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{settings.metrics_port}/metrics", timeout=10) as response:
        page = response.read().decode()
    out = {}
    for name, sample in TEXT_COUNTERS.items():
        found = re.search(rf"^{re.escape(sample)} (\S+)$", page, re.M)
        out[name] = int(float(found.group(1))) if found else -1
    return out


def run_rules_bench(settings: Settings, data: Path, docs: int, baseline_tree: Path | None, as_json: bool) -> int:
    Stack(settings).up(stderr)
    passages = load_dataset("hotpotqa", data).passages[:docs]
    documents = [Document(tenant="corpus", doc_id=f"hotpotqa-{i}", text=text) for i, text in enumerate(passages)]
    chunks = chunk_texts(settings, documents)
    all_texts = sorted({t for text in chunks for t in embedded_texts(text)})
    counted = documents[:COUNTED_DOCS]
    here = Path.cwd()
    runs = []
    for tree in ([baseline_tree] if baseline_tree else []) + [here]:
        # the limit measured next to each run, so both see the same load on a shared machine
        stderr(f"bench: embedding-bound limit for {tree} (the same texts through its LocalEmbedder alone)")
        bound = embedding_bound(chunks, tree.resolve())
        run = run_tree(settings, tree.resolve(), documents, len(chunks), all_texts, counted)
        runs.append(
            {
                **run.__dict__,
                "embedding_bound": bound,
                "fraction_of_embedding_bound": round(run.chunks_per_s / bound["all_texts_chunks_per_s"], 3),
            }
        )
    needed = sum(len(embedded_texts(text)) for text in chunks)  # what the chunks need vectors of
    for row in runs:
        texts = row["texts"]
        row["model_calls_saved"] = round(1 - texts["model"] / needed, 3) if texts["model"] >= 0 else None
        row["held_share"] = round(texts["held"] / needed, 3) if texts["held"] >= 0 else None
    result = {
        "dataset": "hotpotqa",
        "documents": len(documents),
        "chunks": len(chunks),
        "texts_per_chunk": runs[0]["embedding_bound"]["texts_per_chunk"],
        "distinct_texts_per_chunk": round(len(all_texts) / len(chunks), 1),  # the least a model can embed
        "runs": runs,
    }
    if as_json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"rules pipeline, HotpotQA-100: {len(documents)} documents, {len(chunks)} chunks, {result['texts_per_chunk']} texts embedded per chunk"
    )
    print(
        "embedding-bound limit: every text the pipeline embeds, by the tree's own LocalEmbedder alone, measured just before its run"
    )
    print(
        f"{'tree':<32} {'seconds':>8} {'chunks/s':>9} {'bound':>7} {'of bound':>9} {'passages alone':>15} {'round trips/chunk':>18}"
    )
    for row in runs:
        bound = row["embedding_bound"]
        print(
            f"{row['tree'][-32:]:<32} {row['seconds']:>8} {row['chunks_per_s']:>9} {bound['all_texts_chunks_per_s']:>7} "
            f"{100 * row['fraction_of_embedding_bound']:>8.0f}% {bound['passages_only_chunks_per_s']:>15} {row['round_trips_per_chunk']:>18}"
        )
    print(
        f"texts: {result['texts_per_chunk']} needed per chunk, {result['distinct_texts_per_chunk']} of them distinct in the "
        f"corpus (the least a model can embed: saved at most {100 * (1 - len(all_texts) / needed):.0f}%)"
    )
    print(f"{'tree':<32} {'to the model/chunk':>19} {'model calls saved':>18} {'held by the tenant':>19}")
    for row in runs:
        texts, saved, held = row["texts"], row["model_calls_saved"], row["held_share"]
        print(
            f"{row['tree'][-32:]:<32} {texts['model'] / len(chunks) if texts['model'] >= 0 else float('nan'):>19.1f} "
            f"{'-' if saved is None else f'{100 * saved:.1f}%':>18} {'not counted' if held is None else f'{100 * held:.1f}%':>19}"
        )
    for row in runs:
        print(f"{row['tree'][-40:]}: commands over {len(counted)} documents: {row['commands']}")
    return 0
