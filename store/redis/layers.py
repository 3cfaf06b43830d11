"""The memory layers' records (store.base.Layers; its searches are store.redis.search's):
passages, entities, schemas (their support counted and promoted at τ: _SUPPORT_SCHEMA) and
facts (the smallest description seen: _SET_IF_SMALLER; their lapse: store.redis.expiry's
_RECORD_LAPSE), staged, and read in one round trip."""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np

from store.facts import Fact, stored_fields
from store.records import (
    ENTITIES_FIELD,
    ENTITY_MENTIONS,
    FACT_EXTRACTIONS,
    OWN_VECTOR_FIELD,
    PASSAGE_EXTRAS,
    TENANT_FIELD,
    VECTOR_ITEM_BYTES,
    HeldVector,
    PassagesRead,
    TurnEmbedding,
    entity_list,
    passage_extras,
    passage_json,
    turn_embedding_fields,
    vector_bytes,
    vector_from_bytes,
)
from store.redis.base import RedisBase, _eval, _text
from store.redis.expiry import _RECORD_LAPSE
from store.redis.lexical_index import stage_lexical_mirror

# Each fact's hash and its evidence set (KEYS: a fact's hash, its passages set, the next fact's
# ...): one command where HGETALL and SMEMBERS over the same facts were two — a detector, resolver
# or chunker reads facts ~5 times a chunk, reconstruct once a step. The hash's fields but those
# named in ARGV (FACT_FIELDS_UNREAD): its vector and rank were ~900 of a fact's ~1,050 bytes
# sent, parsed and dropped. Read-only.
_FACTS = """#!lua flags=no-writes
local unread = {}
for _, name in ipairs(ARGV) do unread[name] = true end
local out = {}
for i = 1, #KEYS, 2 do
  local flat, kept = redis.call('HGETALL', KEYS[i]), {}
  for j = 1, #flat, 2 do
    if not unread[flat[j]] then
      kept[#kept + 1] = flat[j]
      kept[#kept + 1] = flat[j + 1]
    end
  end
  out[#out + 1] = kept
  out[#out + 1] = redis.call('SMEMBERS', KEYS[i + 1])
end
return out
"""
FACT_FIELDS_UNREAD = ("vec", "_rank")  # a fact's vector (fact_vectors) and description rank (stage_new_fact)
PASSAGE_ROW_FIELDS = ("text", "doc_id", "seq", "doc_version", *PASSAGE_EXTRAS)  # a passage's row (passage_row)


def fact_of(fact_id: str, flat: list[bytes], passages: list[bytes]) -> Fact | None:
    """A fact from its hash (_FACTS' flat reply, without FACT_FIELDS_UNREAD) and its passages
    set; None for a missing fact."""
    if not flat:
        return None
    fields = {k.decode(): v.decode() for k, v in zip(flat[0::2], flat[1::2])}
    return Fact.from_hash(fact_id, fields, [p.decode() for p in passages])


def fact_of_values(fact_id: str, values: list[bytes | None], passages: list[bytes]) -> tuple[Fact, dict] | None:
    """A fact from an HMGET of facts.stored_fields() and its passages set, beside its stored
    fields decoded; None for a missing fact."""
    stored = {name: v.decode() for name, v in zip(stored_fields(), values) if v is not None}
    if not stored:
        return None
    return Fact.from_hash(fact_id, stored, [p.decode() for p in passages]), stored


def passage_row(passage_id: str, values: list[bytes | None]) -> dict | None:
    """A passage's row (passage_json) from HMGET of PASSAGE_ROW_FIELDS; None for a missing one."""
    text, doc_id, seq, version, *extras = values
    if text is None or doc_id is None:
        return None
    return passage_json(
        passage_id, text.decode(), doc_id.decode(), seq, version, *(None if e is None else e.decode() for e in extras)
    )


# A reconstruct step's reads (LayersOps.read_passages). KEYS: the passages', then the records'
# whose vector is read; ARGV: the passage count, the entities' key prefix, the passage's
# entities field, the passage row's fields. Each passage's entities field and row; the name and
# type of each entity they name (once); the vectors. Read-only.
_READ_PASSAGES = """#!lua flags=no-writes
local n, prefix = tonumber(ARGV[1]), ARGV[2]
local rows, names, seen, vectors = {}, {}, {}, {}
for i = 1, n do
  local row = redis.call('HMGET', KEYS[i], unpack(ARGV, 3))
  rows[i] = row
  local raw = row[1]
  if raw then
    local ids = {}
    if string.sub(raw, 1, 1) == '[' then ids = cjson.decode(raw) else
      for id in string.gmatch(raw, '[^,]+') do ids[#ids + 1] = id end
    end
    for _, id in ipairs(ids) do
      if not seen[id] then
        seen[id] = true
        names[#names + 1] = id
        names[#names + 1] = redis.call('HMGET', prefix .. id, 'name', 'type')
      end
    end
  end
end
for i = n + 1, #KEYS do vectors[#vectors + 1] = redis.call('HGET', KEYS[i], 'vec') end
return {rows, names, vectors}
"""

# Count a schema's distinct supporting passages and promote it at tau (in process:
# store/in_memory/layers.py's stage_schema).
_SUPPORT_SCHEMA = """
redis.call('SADD', KEYS[1], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], 'frequency', n)
if n >= tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], 'status', 'stable') end
return n
"""

# Keep the smallest of competing descriptions of one record (surface forms and types seen in
# different passages), so the record does not depend on the order passages arrive in (in
# process: store/in_memory/layers.py's _set_if_smaller).
# KEYS[1]: hash. ARGV: rank, then field/value pairs.
_SET_IF_SMALLER = """
local current = redis.call('HGET', KEYS[1], '_rank')
if current and current <= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], '_rank', ARGV[1], unpack(ARGV, 2))
return 1
"""


class LayersOps(RedisBase):
    """store.base.Layers on Redis: the records (ensure_indexes and the embedder record are
    RedisBase's, the searches SearchOps')."""

    # ---- memory layers -------------------------------------------------------------------
    def stage_passage(
        self,
        pipe,
        tenant: str,
        chunk,
        entity_ids: list[str],
        vector,
        turn: TurnEmbedding | None = None,
        own_vector=None,
        preceding_text: str | None = None,
    ) -> None:
        """The passage's hash, one HSET (its indexes index it once), with what a turn's vector was
        embedded with (`turn`) and, embedded after the turn before it, its own text's vector (its
        lexical terms followed by those of that turn's text, `preceding_text`)."""
        pipe.hset(
            self.keys(tenant).passage(chunk.chunk_id),
            mapping={
                TENANT_FIELD: tenant,
                "text": chunk.text,
                "doc_id": chunk.doc_id,
                "seq": chunk.seq,
                "doc_version": chunk.doc_version,
                ENTITIES_FIELD: ",".join(entity_ids),
                "vec": vector_bytes(vector),
                **passage_extras(chunk, preceding_text),
                **(turn_embedding_fields(turn) if turn is not None else {}),
                **({OWN_VECTOR_FIELD: vector_bytes(own_vector)} if own_vector is not None else {}),
            },
        )
        stage_lexical_mirror(pipe, self.keys(tenant), chunk.chunk_id)
        # the passage's counted sets change with it (its entities' passage edges, its schemas'
        # support): its revision moves, so a retirement or an erasure that read the passage
        # before this commit decides again (their fence); without it a version replayed beside
        # its extraction retired the passage and left its edges (tests/test_extraction_race.py)
        pipe.hincrby(self.keys(tenant).passage_revision(chunk.chunk_id), "n", 1)

    def stage_entity(self, pipe, tenant: str, entity_id: str, name: str, type_: str, vector, passage_id: str) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            _SET_IF_SMALLER,
            [keys.entity(entity_id)],
            [f"{name}\x1f{type_}", TENANT_FIELD, tenant, "name", name, "type", type_, "vec", vector_bytes(vector)],
        )
        pipe.sadd(keys.entity_passages(entity_id), passage_id)
        pipe.hincrby(keys.entity(entity_id), ENTITY_MENTIONS, 1)

    def stage_schema(
        self, pipe, tenant: str, schema_id: str, head_type: str, relation: str, tail_type: str, vector, passage_id: str
    ) -> None:
        keys = self.keys(tenant)
        schema_key = keys.schema(schema_id)
        pipe.hsetnx(schema_key, TENANT_FIELD, tenant)
        pipe.hsetnx(schema_key, "head_type", head_type)
        pipe.hsetnx(schema_key, "relation", relation)
        pipe.hsetnx(schema_key, "tail_type", tail_type)
        pipe.hsetnx(schema_key, "status", "candidate")
        pipe.hsetnx(schema_key, "vec", vector_bytes(vector))
        _eval(pipe, _SUPPORT_SCHEMA, [keys.schema_passages(schema_id), schema_key], [passage_id, self.tau])
        pipe.sadd(keys.passage_schemas(passage_id), schema_id)

    def stage_new_fact(
        self, pipe, tenant: str, fact: Fact, vector, lapses_at: float | None = None, passage_id: str = ""
    ) -> None:
        """An extracted fact, status 'new' until the detector decides. Status and first-seen
        time are set once; the description is the one of the smallest Fact.description_rank
        seen: the most specific category, then the smallest (order-independent). The passage's
        support lapses at `lapses_at` (None: never): the fact's `expires_at` and its place in the
        expiry index follow (_RECORD_LAPSE)."""
        keys = self.keys(tenant)
        key = keys.fact(fact.id)
        _eval(pipe, _RECORD_LAPSE, [key, keys.expiry], [fact.id, "" if lapses_at is None else repr(float(lapses_at))])
        pairs = [x for kv in fact.description().items() for x in kv]
        _eval(
            pipe,
            _SET_IF_SMALLER,
            [key],
            [fact.description_rank(), TENANT_FIELD, tenant, *pairs, "vec", vector_bytes(vector)],
        )
        pipe.hsetnx(key, "status", "new")
        pipe.hsetnx(key, "created_at", time.time())
        if passage_id:  # its source, for an erasure
            pipe.sadd(keys.fact_sources(fact.id), passage_id)
            pipe.sadd(keys.passage_extracted(passage_id), fact.id)
            pipe.hincrby(key, FACT_EXTRACTIONS, 1)

    def stage_fact_passage(self, pipe, tenant: str, fact_id: str, passage_id: str) -> None:
        keys = self.keys(tenant)
        pipe.sadd(keys.fact_passages(fact_id), passage_id)
        pipe.sadd(keys.passage_facts(passage_id), fact_id)
        pipe.hincrby(keys.passage_revision(passage_id), "n", 1)

    async def fact(self, tenant: str, fact_id: str) -> Fact | None:
        return (await self.facts(tenant, [fact_id]))[0]

    async def facts(self, tenant: str, fact_ids: list[str]) -> list[Fact | None]:
        """The facts (with their passage ids) in one command (_FACTS); None for a missing id."""
        if not fact_ids:
            return []
        keys = self.keys(tenant)
        replies = await self._run_script(
            tenant,
            _FACTS,
            [k for fid in fact_ids for k in (keys.fact(fid), keys.fact_passages(fid))],
            FACT_FIELDS_UNREAD,
        )
        return [fact_of(fid, flat, passages) for fid, flat, passages in zip(fact_ids, replies[0::2], replies[1::2])]

    async def passages(self, tenant: str, passage_ids: list[str]) -> list[dict | None]:
        keys = self.keys(tenant)
        replies = await self._read_each(
            tenant, [keys.passage(pid) for pid in passage_ids], "HMGET", *PASSAGE_ROW_FIELDS
        )
        return [passage_row(pid, values) for pid, values in zip(passage_ids, replies)]

    async def read_passages(self, tenant: str, passage_ids: list[str], vectors: list[tuple[str, str]]) -> PassagesRead:
        """A reconstruct step's reads in one command (_READ_PASSAGES): the passages' rows, the
        entities they name and those entities' names, and the vectors asked; they were three
        dependent commands a step."""
        if not passage_ids and not vectors:
            return PassagesRead([], [], {}, {})
        keys = self.keys(tenant)
        held = [keys.fact(tid) if kind == "fact" else keys.passage(tid) for kind, tid in vectors]
        rows, names, found = await self._run_script(
            tenant,
            _READ_PASSAGES,
            [*(keys.passage(pid) for pid in passage_ids), *held],
            [len(passage_ids), keys.entity(""), ENTITIES_FIELD, *PASSAGE_ROW_FIELDS],
        )
        return PassagesRead(
            [passage_row(pid, row[1:]) for pid, row in zip(passage_ids, rows)],
            [entity_list(row[0]) for row in rows],
            {
                eid.decode(): {"name": name.decode(), "type": (type_ or b"").decode()}
                for eid, (name, type_) in zip(names[0::2], names[1::2])
                if name is not None
            },
            {tag: vector_from_bytes(raw) for tag, raw in zip(vectors, found) if raw is not None},
        )

    async def entity_names(self, tenant: str, entity_ids: list[str]) -> dict[str, dict]:
        """entity id → {"name", "type"} for the ids that exist."""
        keys = self.keys(tenant)
        unique = list(dict.fromkeys(entity_ids))
        return {
            eid: {"name": name.decode(), "type": (type_ or b"").decode()}
            for eid, (name, type_) in zip(
                unique, await self._read_each(tenant, [keys.entity(e) for e in unique], "HMGET", "name", "type")
            )
            if name is not None
        }

    async def passage_entities(self, tenant: str, passage_id: str) -> list[str]:
        return entity_list(await self.shard(tenant).hget(self.keys(tenant).passage(passage_id), ENTITIES_FIELD))

    async def passage_subjects(self, tenant: str, passage_ids: list[str]) -> list[str | None]:
        """Each passage's subject, in one command (the field alone: a query's candidates are
        read for it, their rows only for those it answers with); None for a retired passage."""
        keys = self.keys(tenant)
        replies = await self._read_each(
            tenant, [keys.passage(pid) for pid in passage_ids], "HMGET", "subject", "retired"
        )
        return [None if subject is None or retired == b"1" else subject.decode() for subject, retired in replies]

    async def passages_entities(self, tenant: str, passage_ids: list[str]) -> list[list[str]]:
        """passage_entities of each passage, in one command."""
        keys = self.keys(tenant)
        replies = await self._read_each(tenant, [keys.passage(pid) for pid in passage_ids], "HGET", ENTITIES_FIELD)
        return [entity_list(raw) for raw in replies]

    async def fact_vector(self, tenant: str, fact_id: str) -> np.ndarray | None:
        return (await self.fact_vectors(tenant, [fact_id]))[0]

    async def fact_vectors(self, tenant: str, fact_ids: list[str]) -> list[np.ndarray | None]:
        """Each fact's stored vector, in one command; None for a missing id."""
        replies = await self._read_each(tenant, [self.keys(tenant).fact(fid) for fid in fact_ids], "HGET", "vec")
        return [None if raw is None else vector_from_bytes(cast(bytes, raw)) for raw in replies]  # bytes (_text)

    async def held_vectors(
        self, tenant: str, entities: dict[str, str], facts: dict[str, str], schemas: dict[str, str]
    ) -> dict[str, HeldVector]:
        """text → the vector a record of the tenant holds for that very text, in one round trip:
        an entity (id → name) whose name is it, a fact (id → text) whose text is it, a schema
        (id → "head_type relation tail_type") whose parts spell it. A record's vector is always
        its own text's (written with it), so the extractor embeds only the other texts; a
        vector of another size (a float32 tenant not migrated, another embedder) is not taken."""
        keys = self.keys(tenant)
        asked = (
            [(keys.entity(i), ["name"], text) for i, text in entities.items()]
            + [(keys.fact(i), ["text"], text) for i, text in facts.items()]
            + [(keys.schema(i), ["head_type", "relation", "tail_type"], text) for i, text in schemas.items()]
        )
        if not asked:
            return {}
        pipe = self.shard(tenant).pipeline(transaction=False)
        for key, fields, _ in asked:
            pipe.hmget(key, [*fields, "vec"])
        size, held = VECTOR_ITEM_BYTES * self.dims, {}
        for (_, _, text), (*parts, vec) in zip(asked, await pipe.execute()):
            if vec is not None and len(vec) == size and None not in parts and " ".join(map(_text, parts)) == text:
                held[text] = HeldVector(vec)
        return held

    def stage_fact_said(self, pipe, tenant: str, fact_id: str, doc_id: str, at: float) -> None:
        """When the document first said the fact: kept (HSETNX), so an edit of the document that
        says it again — a typo fixed elsewhere in it — moves nothing."""
        pipe.hsetnx(self.keys(tenant).fact_said(fact_id), doc_id, repr(float(at)))

    async def facts_said(self, tenant: str, fact_ids: list[str]) -> list[dict[str, float]]:
        """Each fact's doc id → when that document first said it (stage_fact_said), in one command."""
        keys = self.keys(tenant)
        rows = await self._read_each(tenant, [keys.fact_said(fid) for fid in fact_ids], "HGETALL")
        return [{k.decode(): float(v) for k, v in zip(row[0::2], row[1::2])} for row in rows]

    def stage_unsupport(self, pipe, tenant: str, fact_id: str, passage_ids: list[str]) -> None:
        """The fact's supporting passages set aside (a retraction on request): a passage that
        says it again, extracted later, supports it anew."""
        keys = self.keys(tenant)
        pipe.delete(keys.fact_passages(fact_id), keys.fact_set_aside(fact_id))
        if passage_ids:  # kept apart: a curator still sees where a retracted fact came from
            pipe.sadd(keys.fact_set_aside(fact_id), *passage_ids)
        for pid in passage_ids:
            pipe.srem(keys.passage_facts(pid), fact_id)

    async def set_aside_passages(self, tenant: str, fact_id: str) -> list[str]:
        """The passages the fact's last retraction set aside (stage_unsupport), sorted."""
        return sorted(_text(p) for p in await self.shard(tenant).smembers(self.keys(tenant).fact_set_aside(fact_id)))

    def stage_fact_update(self, pipe, tenant: str, fact_id: str, fields: dict[str, Any]) -> None:
        pipe.hset(self.keys(tenant).fact(fact_id), mapping={k: ("" if v is None else v) for k, v in fields.items()})
