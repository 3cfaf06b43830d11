"""The memory in Redis: M_pas, M_ont, M_fac, entities, graph adjacency, vector search, document
progress and the effectively-once machinery (done marks + outbox).

Writes are staged on a MULTI pipeline by the worker that decides them and executed together
with the message's outbox, so a crash leaves either all of a message's effects or none.
Every write is idempotent: ids are content hashes and counts are set sizes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import redis.asyncio as aioredis
from redisvl.index import AsyncSearchIndex
from redisvl.query import VectorQuery
from redisvl.query.filter import FilterExpression

from store.indexes import layer_schema
from store.keys import LAYERS, TenantKeys

DONE_MARK_TTL_S = 8 * 24 * 3600  # longer than Kafka's default 7-day retention
GRAPH_CHANGES_MAXLEN = 200_000

# SADD a fact to the set of facts between two entities; the edge weight is the set's size,
# written both ways, and the change is appended to the tenant's graph change stream.
_LINK_FACT = """
redis.call('SADD', KEYS[1], ARGV[1])
local w = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[3], w)
redis.call('HSET', KEYS[3], ARGV[2], w)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'v', ARGV[4], 'a', ARGV[2], 'b', ARGV[3], 'w', w, 'kind', 'fact')
return w
"""

# Count a schema's distinct supporting passages and promote it at tau.
_SUPPORT_SCHEMA = """
redis.call('SADD', KEYS[1], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], 'frequency', n)
if n >= tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], 'status', 'stable') end
return n
"""

# The document record follows the latest publication, never an older version.
_RECORD_DOCUMENT = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'doc_hash', ARGV[1], 'version', ARGV[2], 'chunk_ids', ARGV[3], 'ts', ARGV[4])
return 1
"""

# Mark one fact of a chunk as through the pipeline; the chunk is done when all are.
_FACT_DONE = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  redis.call('SADD', KEYS[2], ARGV[4])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class Outgoing:
    """A message a stage will publish once its Redis effects are committed."""

    topic: str  # topic suffix, e.g. "indexed-facts"
    key: str
    value: bytes

    def to_json(self) -> list:
        return [self.topic, self.key, self.value.decode("utf-8")]

    @classmethod
    def from_json(cls, item: list) -> "Outgoing":
        return cls(item[0], item[1], item[2].encode("utf-8"))


@dataclass(frozen=True)
class Hit:
    id: str  # id within its layer (key without prefix)
    score: float  # cosine similarity
    fields: dict[str, Any]


def vector_bytes(vector: Iterable[float]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def _eval(pipe, script: str, keys: list, args: list) -> None:
    # EVAL (not EVALSHA) inside MULTI: a missing script cache cannot fail the transaction
    pipe.eval(script, len(keys), *keys, *args)


class Memory:
    def __init__(self, client: aioredis.Redis, dims: int = 384, tau: int = 2):
        self.redis = client
        self.dims = dims
        self.tau = tau
        self._indexes: dict[tuple[str, str], AsyncSearchIndex] = {}

    @classmethod
    def from_url(cls, url: str, **kwargs) -> "Memory":
        return cls(aioredis.from_url(url, decode_responses=False), **kwargs)

    async def close(self) -> None:
        await self.redis.aclose()

    @staticmethod
    def keys(tenant: str) -> TenantKeys:
        return TenantKeys(tenant)

    # ---- vector indexes -------------------------------------------------------------
    async def index(self, tenant: str, layer: str, create: bool = True) -> AsyncSearchIndex | None:
        """The tenant's index of a layer; created on first write. Readers pass create=False so
        that queries for unknown tenants create nothing."""
        found = self._indexes.get((tenant, layer))
        if found is None:
            found = AsyncSearchIndex(layer_schema(self.keys(tenant), layer, self.dims), redis_client=self.redis)
            if not await found.exists():
                if not create:
                    return None
                try:
                    await found.create(overwrite=False)
                except Exception as exc:  # another worker created it first
                    if "already exists" not in str(exc).lower():
                        raise
            self._indexes[(tenant, layer)] = found
        return found

    async def ensure_indexes(self, tenant: str) -> None:
        for layer in LAYERS:
            await self.index(tenant, layer)

    async def knn(
        self,
        tenant: str,
        layer: str,
        vector: np.ndarray,
        k: int,
        return_fields: list[str],
        filter_expression: FilterExpression | None = None,
    ) -> list[Hit]:
        index = await self.index(tenant, layer, create=False)
        if index is None:
            return []
        query = VectorQuery(
            vector=vector_bytes(vector),
            vector_field_name="vec",
            return_fields=return_fields,
            filter_expression=filter_expression,
            num_results=k,
        )
        prefix = self.keys(tenant).prefix(layer)
        hits = []
        for row in await index.query(query):
            fields = {f: row.get(f) for f in return_fields}
            hits.append(Hit(row["id"].removeprefix(prefix), 1.0 - float(row["vector_distance"]), fields))
        return hits

    # ---- effectively once: done marks and outbox ---------------------------------------
    async def pending_outbox(self, tenant: str, mark: str) -> list[Outgoing] | None:
        """None: the message was never committed. A list: its committed, maybe unsent output.
        Raises AlreadyDone when the message was fully processed before."""
        keys = self.keys(tenant)
        done, outbox = await self.redis.mget(keys.done_mark(mark), keys.outbox(mark))
        if done is not None:
            raise AlreadyDone(mark)
        if outbox is None:
            return None
        return [Outgoing.from_json(item) for item in json.loads(outbox)]

    def pipeline(self):
        return self.redis.pipeline(transaction=True)

    def stage_outbox(self, pipe, tenant: str, mark: str, outbox: list[Outgoing]) -> None:
        pipe.set(self.keys(tenant).outbox(mark), json.dumps([o.to_json() for o in outbox]), ex=DONE_MARK_TTL_S)

    async def finish(self, tenant: str, mark: str) -> None:
        keys = self.keys(tenant)
        pipe = self.pipeline()
        pipe.set(keys.done_mark(mark), b"1", ex=DONE_MARK_TTL_S)
        pipe.delete(keys.outbox(mark))
        await pipe.execute()

    # ---- document progress -----------------------------------------------------------
    def stage_document(self, pipe, tenant: str, doc_id: str, doc_hash: str, version: int, chunk_ids: list[str]) -> None:
        _eval(pipe, _RECORD_DOCUMENT, [self.keys(tenant).document(doc_id)], [doc_hash, version, json.dumps(chunk_ids), time.time()])

    def stage_chunk_done(self, pipe, tenant: str, chunk_id: str) -> None:
        pipe.sadd(self.keys(tenant).chunks_done, chunk_id)

    async def chunk_done(self, tenant: str, chunk_id: str) -> bool:
        return bool(await self.redis.sismember(self.keys(tenant).chunks_done, chunk_id))

    def stage_fact_done(self, pipe, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int) -> None:
        keys = self.keys(tenant)
        _eval(pipe, _FACT_DONE, [keys.chunk_facts_done(chunk_id), keys.chunks_done], [fact_index, chunk_fact_count, DONE_MARK_TTL_S, chunk_id])

    async def document_status(self, tenant: str, doc_id: str) -> dict | None:
        """{'doc_hash', 'version', 'chunks', 'chunks_done'} or None if the chunker has not seen it."""
        keys = self.keys(tenant)
        doc = await self.redis.hgetall(keys.document(doc_id))
        if not doc:
            return None
        chunk_ids = json.loads(doc[b"chunk_ids"])
        done = await self.redis.smismember(keys.chunks_done, chunk_ids) if chunk_ids else []
        return {
            "doc_hash": doc[b"doc_hash"].decode(),
            "version": int(doc[b"version"]),
            "chunks": len(chunk_ids),
            "chunks_done": sum(1 for d in done if d),
        }

    # ---- memory layers -------------------------------------------------------------------
    def stage_passage(self, pipe, tenant: str, chunk, entity_ids: list[str], vector) -> None:
        pipe.hset(
            self.keys(tenant).passage(chunk.chunk_id),
            mapping={
                "text": chunk.text,
                "doc_id": chunk.doc_id,
                "seq": chunk.seq,
                "doc_version": chunk.doc_version,
                "entities": json.dumps(entity_ids),
                "vec": vector_bytes(vector),
            },
        )

    def stage_entity(self, pipe, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str) -> None:
        keys = self.keys(tenant)
        # HSETNX keeps the first-seen surface form and type stable under replays and reorderings
        entity_key = keys.entity(entity_id)
        pipe.hsetnx(entity_key, "name", name)
        pipe.hsetnx(entity_key, "type", type_)
        pipe.hsetnx(entity_key, "vec", vector_bytes(vector))
        pipe.sadd(keys.entity_passages(entity_id), passage_id)

    def stage_schema(self, pipe, tenant: str, schema_id: str, head_type: str, relation: str, tail_type: str, vector, passage_id: str) -> None:
        keys = self.keys(tenant)
        schema_key = keys.schema(schema_id)
        pipe.hsetnx(schema_key, "head_type", head_type)
        pipe.hsetnx(schema_key, "relation", relation)
        pipe.hsetnx(schema_key, "tail_type", tail_type)
        pipe.hsetnx(schema_key, "status", "candidate")
        pipe.hsetnx(schema_key, "vec", vector_bytes(vector))
        _eval(pipe, _SUPPORT_SCHEMA, [keys.schema_passages(schema_id), schema_key], [passage_id, self.tau])

    def stage_new_fact(self, pipe, tenant: str, fact_id: str, fields: dict[str, Any], vector) -> None:
        """An extracted fact, status 'new' until the detector decides. HSETNX: a fact extracted
        again from another passage keeps its record and status."""
        key = self.keys(tenant).fact(fact_id)
        for name, value in {**fields, "status": "new", "created_at": time.time()}.items():
            pipe.hsetnx(key, name, "" if value is None else value)
        pipe.hsetnx(key, "vec", vector_bytes(vector))

    def stage_fact_status(self, pipe, tenant: str, fact_id: str, status: str) -> None:
        pipe.hset(self.keys(tenant).fact(fact_id), "status", status)

    def stage_fact_passage(self, pipe, tenant: str, fact_id: str, passage_id: str) -> None:
        pipe.sadd(self.keys(tenant).fact_passages(fact_id), passage_id)

    async def fact(self, tenant: str, fact_id: str) -> dict | None:
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.fact(fact_id))
        pipe.smembers(keys.fact_passages(fact_id))
        row, passages = await pipe.execute()
        if not row:
            return None
        fact = {k.decode(): v.decode() for k, v in row.items() if k != b"vec"}
        fact["passage_ids"] = sorted(p.decode() for p in passages)
        return fact

    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]:
        keys = self.keys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        for pid in passage_ids:
            pipe.hmget(keys.passage(pid), ["text", "doc_id", "seq"])
        out = []
        for pid, (text, doc_id, seq) in zip(passage_ids, await pipe.execute()):
            out.append(None if text is None else {"id": pid, "text": text.decode(), "doc_id": doc_id.decode(), "seq": int(seq)})
        return out

    # ---- graph -------------------------------------------------------------------------
    async def bump_graph_version(self, tenant: str) -> int:
        # A replayed message may bump it again: versions may skip, never go back.
        return int(await self.redis.incr(self.keys(tenant).graph_version))

    async def graph_version(self, tenant: str) -> int:
        return int(await self.redis.get(self.keys(tenant).graph_version) or 0)

    def stage_fact_edge(self, pipe, tenant: str, version: int, head_node: str, tail_node: str, fact_id: str) -> None:
        keys = self.keys(tenant)
        _eval(pipe, _LINK_FACT, [keys.edge_facts(head_node, tail_node), keys.adjacency(head_node), keys.adjacency(tail_node), keys.graph_changes], [fact_id, head_node, tail_node, version, GRAPH_CHANGES_MAXLEN])

    def stage_edge(self, pipe, tenant: str, version: int, a: str, b: str, weight: float, kind: str) -> None:
        """An undirected edge of fixed weight (entity–passage: 1)."""
        keys = self.keys(tenant)
        pipe.hset(keys.adjacency(a), b, weight)
        pipe.hset(keys.adjacency(b), a, weight)
        pipe.xadd(keys.graph_changes, {"v": version, "a": a, "b": b, "w": weight, "kind": kind}, maxlen=GRAPH_CHANGES_MAXLEN, approximate=True)

    async def neighbours(self, tenant: str, node: str) -> dict[str, float]:
        row = await self.redis.hgetall(self.keys(tenant).adjacency(node))
        return {k.decode(): float(v) for k, v in row.items()}


class AlreadyDone(Exception):
    """The message behind this mark was fully processed before (a redelivery)."""
