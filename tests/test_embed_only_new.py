"""A chunk embeds only what is new: a text whose vector a record of the tenant already holds
(an entity of that name, a fact of that text, a schema) costs no model call — the held vector
is written — in the extractor's handle and in its read-ahead prefetch, whether or not the shared
embedding cache still holds the text; and the memory written is the one embedding every text
would have written, vector bytes included."""

import asyncio
import hashlib

import numpy as np

from store.in_memory import InMemoryStore
from store.keys import LAYERS
from tests.inprocess import DIMS, InProcess, ScriptedExtractor
from topics import Chunk
from topics.graph import CONSUMES
from topics.records import Triple
from workers import metrics
from workers.algorithms.normalize import canonical_fact
from workers.models.embedding import BatchingEmbedder
from workers.models.extraction import RulesExtractor

FIRST = "Ada Berg founded Ropes Works."
SECOND = "Ada Berg founded Ropes Works. Ada Berg lives in Norland."
SCRIPT = {
    FIRST: [("Ada Berg", "founded", "Ropes Works", "PERSON", "ORGANIZATION")],
    SECOND: [
        ("Ada Berg", "founded", "Ropes Works", "PERSON", "ORGANIZATION"),
        ("Ada Berg", "lives in", "Norland", "PERSON", "PLACE"),
    ],
}


def _texts(fact: tuple) -> list[str]:
    """The fact's and its schema's texts, as the extractor embeds them (its relation normalised)."""
    t = canonical_fact(Triple(*fact))
    return [f"{t.head} {t.relation} {t.tail}", f"{t.head_type} {t.relation} {t.tail_type}"]


IN_FIRST = {FIRST, "Ada Berg", "Ropes Works", *_texts(SCRIPT[FIRST][0])}
# what SECOND adds to what FIRST left in memory: its passage, one entity, one fact, one schema
NEW_IN_SECOND = {SECOND, "Norland", *_texts(SCRIPT[SECOND][1])}


def _vector(text: str) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
    vector = rng.standard_normal(DIMS).astype(np.float32)
    return vector / np.linalg.norm(vector)


class CountingDouble:
    """Test double, not a model: a pseudo-random unit vector per text (the same text, the same
    vector), keeping the texts of every call it gets. `embed` is synchronous, as a local model's
    is behind BatchingEmbedder; `aembed` for being the embedder itself."""

    dims = DIMS

    def __init__(self, name: str = "counting-double"):
        self.name = name
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.vstack([_vector(t) for t in texts]) if texts else np.zeros((0, DIMS), dtype=np.float32)

    def texts(self, calls: slice = slice(None)) -> set[str]:
        return {t for call in self.calls[calls] for t in call}


class Direct:
    """The counting double as a stage's embedder (async, no cache)."""

    def __init__(self, model: CountingDouble):
        self.model, self.dims, self.name = model, model.dims, model.name

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.model.embed(texts)


class Late:
    """The stage's embedder, given once the harness made the store its cache lives in."""

    name, dims = "counting-double", DIMS
    inner: BatchingEmbedder

    async def embed(self, texts: list[str]) -> np.ndarray:
        return await self.inner.embed(texts)


def _counter(source: str) -> float:
    return metrics.EXTRACTION_TEXTS.labels(source=source)._value.get()


def test_a_chunk_whose_entities_facts_and_schemas_are_held_embeds_only_what_is_new(redis_url):
    asyncio.run(_held_cost_no_model_call(redis_url))


async def _held_cost_no_model_call(redis_url: str | None) -> None:
    model = CountingDouble()
    ip = InProcess(redis_url, ScriptedExtractor(SCRIPT), Direct(model))
    try:
        await ip.publish("first", FIRST)
        assert model.texts() == IN_FIRST and len(NEW_IN_SECOND) == 4
        calls = len(model.calls)
        await ip.publish("second", SECOND)
        assert model.texts(slice(calls, None)) == NEW_IN_SECOND  # Ada Berg, Ropes Works, the fact, its schema: held
        assert sum(map(len, model.calls[calls:])) == len(NEW_IN_SECOND)  # each asked once
    finally:
        await ip.close()


def test_texts_held_and_embedded_are_counted():
    """memstream_extraction_texts_total{source}: what `bench index --rules` reports as saved."""
    asyncio.run(_counted())


async def _counted() -> None:
    model = CountingDouble()
    ip = InProcess(None, ScriptedExtractor(SCRIPT), Direct(model))
    try:
        await ip.publish("first", FIRST)
        held, embedded = _counter("held"), _counter("embedded")
        await ip.publish("second", SECOND)
        # SECOND's 8 texts (passage, 3 entities, 2 facts, 2 schemas): 4 held, its 4 new ones embedded
        assert (_counter("held") - held, _counter("embedded") - embedded) == (4, 4)
    finally:
        await ip.close()


def test_held_texts_cost_no_model_call_when_the_shared_cache_has_lost_them(redis_url):
    """The workers' embedder (BatchingEmbedder over the shared cache): texts whose cached vectors
    lapsed (7 days) or were forgotten are not embedded again while the tenant holds them."""
    asyncio.run(_cache_lost(redis_url))


async def _cache_lost(redis_url: str | None) -> None:
    front = Late()
    ip = InProcess(redis_url, ScriptedExtractor(SCRIPT), front)
    model = CountingDouble(f"counting-double-{ip.tenant}")
    cache = ip.memory.embedding_cache(model.name)
    front.inner = BatchingEmbedder(model, cache=cache)
    try:
        await ip.publish("first", FIRST)
        await cache.forget_many(sorted(model.texts()))
        calls = len(model.calls)
        await ip.publish("second", SECOND)
        assert model.texts(slice(calls, None)) == NEW_IN_SECOND
    finally:
        await ip.close()


def test_the_read_ahead_embeds_only_what_the_tenant_does_not_hold(redis_url):
    """The prefetch of a chunk (workers/app.py's read-ahead) warms the embedding cache with the
    texts handle will embed: not with the texts the tenant holds already."""
    asyncio.run(_prefetch(redis_url))


async def _prefetch(redis_url: str | None) -> None:
    model = CountingDouble()
    ip = InProcess(redis_url, ScriptedExtractor(SCRIPT), Direct(model))
    try:
        await ip.publish("first", FIRST)
        calls = len(model.calls)
        chunk = Chunk(tenant=ip.tenant, chunk_id="c-second", doc_id="second", seq=0, n_chunks=1, text=SECOND)
        await ip.pipeline.prefetchers[CONSUMES["extractor"]].handle(chunk)
        assert model.texts(slice(calls, None)) == NEW_IN_SECOND
    finally:
        await ip.close()


CORPUS = [
    "Ada Lovelace was born in London. Ada Lovelace worked with Charles Babbage in London.",
    "Charles Babbage was born in London. Charles Babbage designed the Analytical Engine.",
    "The Eiffel Tower is located in Paris. Gustave Eiffel designed the Eiffel Tower in 1887.",
    "Gustave Eiffel was born in Dijon. Gustave Eiffel designed the Garabit viaduct.",
    "Ada Lovelace wrote notes on the Analytical Engine. Ada Lovelace lived in London.",
]


def test_the_memory_written_is_the_one_embedding_every_text_writes(redis_url):
    """Two tenants index the same corpus (rules extractor): one as the extractor does, one with
    nothing held (every text embedded, as before). Their exports and every record's vector
    bytes are the same."""
    asyncio.run(_same_memory(redis_url))


async def _same_memory(redis_url: str | None) -> None:
    model = CountingDouble()
    new = InProcess(redis_url, RulesExtractor(), Direct(model))
    old = InProcess(redis_url, RulesExtractor(), Direct(model))

    async def nothing_held(tenant, entities, facts, schemas):
        return {}

    old.memory.held_vectors = nothing_held  # type: ignore[method-assign]
    try:
        for ip in (new, old):
            for i, text in enumerate(CORPUS):
                await ip.publish(f"d{i}", text)
        asked = sum(map(len, model.calls[: len(CORPUS)])), sum(map(len, model.calls[len(CORPUS) :]))
        assert asked[0] < asked[1]  # something was held
        exports = [await ip.export() for ip in (new, old)]
        for export in exports:
            export.pop("tenant")
        assert _without_times(exports[0]) == _without_times(exports[1])
        assert await _vectors(new) == await _vectors(old)
    finally:
        await new.close()
        await old.close()


def _without_times(value):
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if not k.endswith("_at")}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


async def _vectors(ip: InProcess) -> dict[tuple[str, str], bytes]:
    """(layer, id) → the record's vector bytes, every record of the tenant."""
    out = {}
    for layer in LAYERS:
        for record_id in await ip.memory.scan_ids(ip.tenant, layer):
            if isinstance(ip.memory, InMemoryStore):
                vec = ip.memory._tenant(ip.tenant).records[layer][record_id].get("vec")
            else:
                vec = await ip.memory.shard(ip.tenant).hget(ip.memory.keys(ip.tenant).prefix(layer) + record_id, "vec")
            out[(layer, record_id)] = vec
    assert out and all(out.values())
    return out
