"""Document versions (store.base.Versions): the documents that hold a passage, a passage's state
(retired, incarnation, revision) and the fences on it, a passage out of memory and back
(_RETIRE_PASSAGE, _RESTORE_PASSAGE), and its support out of every count (_RECOUNT_SCHEMA: a
schema's frequency after passages left its support set)."""

from __future__ import annotations

import asyncio
import json

from store.records import RETIRED_FIELDS, DocumentRecord, PassageState
from store.redis.base import RedisBase, _eval, _expected, _text
from store.redis.lexical_index import stage_lexical_mirror

# A passage out of memory: its vector and terms moved aside (out of the KNN and full-text
# indexes), kept for audit (in process: store/in_memory/versions.py, the same names).
# KEYS[1]: the passage hash; ARGV: stored name, name while retired, ...
_RETIRE_PASSAGE = """
if redis.call('HGET', KEYS[1], 'retired') == '1' then return 0 end
for i = 1, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[i])
  if value then redis.call('HSET', KEYS[1], ARGV[i + 1], value); redis.call('HDEL', KEYS[1], ARGV[i]) end
end
redis.call('HSET', KEYS[1], 'retired', '1')
return 1
"""

# And back. ARGV[1]: its incarnation; then stored name, name while retired, ...
_RESTORE_PASSAGE = """
for i = 2, #ARGV, 2 do
  local value = redis.call('HGET', KEYS[1], ARGV[i + 1])
  if value then redis.call('HSET', KEYS[1], ARGV[i], value); redis.call('HDEL', KEYS[1], ARGV[i + 1]) end
end
redis.call('HSET', KEYS[1], 'retired', '', 'incarnation', ARGV[1])
redis.call('HDEL', KEYS[1], 'purged')  -- erased meanwhile: its extraction writes it again
return 1
"""

# A schema's frequency after passages left its support set. KEYS: schema_passages, schema hash.
_RECOUNT_SCHEMA = """
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'frequency', redis.call('SCARD', KEYS[1])) end
return 1
"""


class VersionsOps(RedisBase):
    """store.base.Versions on Redis."""

    # ---- document versions: what a new version retires, and what a revert brings back -------
    async def document_record(self, tenant: str, doc_id: str) -> DocumentRecord | None:
        """The document's current version as the chunker recorded it (None: never seen)."""
        doc_hash, version, chunk_ids, mark, seq, position = await self.shard(tenant).hmget(
            self.keys(tenant).document(doc_id), ["doc_hash", "version", "chunk_ids", "mark", "seq", "position"]
        )
        if version is None:
            return None
        partition, _, offset = _text(position or b"").partition(":")
        return DocumentRecord(
            _text(doc_hash or b""),
            int(version),
            tuple(json.loads(chunk_ids or b"[]")),
            _text(mark or b""),
            int(seq or 0),
            (int(partition), int(offset)) if offset else None,
        )

    def expect_document(self, pipe, tenant: str, doc_id: str, record: DocumentRecord | None) -> None:
        """The decision read the document's record so: its commit fails (StaleDecision) if
        another version was recorded meanwhile."""
        key = self.keys(tenant).document(doc_id)
        expected = _expected(pipe)
        expected.setdefault((key, "version"), None if record is None else str(record.version))
        expected.setdefault((key, "doc_hash"), None if record is None else record.doc_hash or None)

    def stage_passage_documents(self, pipe, tenant: str, passage_id: str, joined: list[str], left: list[str]) -> None:
        """Documents whose current version now holds the passage (`joined`) or no longer does (`left`)."""
        keys = self.keys(tenant)
        key = keys.passage_documents(passage_id)
        if joined:
            pipe.sadd(key, *joined)
        for doc_id in joined + left:  # (left too: a passage recorded before documents kept their passages)
            pipe.sadd(keys.document_passages(doc_id), passage_id)
        if left:
            pipe.srem(key, *left)
        pipe.hincrby(keys.passage_revision(passage_id), "n", 1)

    async def passage_documents(self, tenant: str, passage_ids: list[str]) -> list[set[str]]:
        keys = self.keys(tenant)
        return await self._set_members(tenant, [keys.passage_documents(pid) for pid in passage_ids])

    async def passage_states(self, tenant: str, passage_ids: list[str]) -> list[PassageState]:
        """Each passage's state (a passage never written: in memory, incarnation 0)."""
        keys = self.keys(tenant)
        pipe = self.shard(tenant).pipeline(transaction=False)
        for pid in passage_ids:
            pipe.hmget(keys.passage(pid), ["retired", "incarnation"])
            pipe.hget(keys.passage_revision(pid), "n")
        replies = await pipe.execute() if passage_ids else []
        return [
            PassageState(retired == b"1", int(incarnation or 0), int(revision or 0))
            for (retired, incarnation), revision in zip(replies[0::2], replies[1::2])
        ]

    def expect_passage(self, pipe, tenant: str, passage_id: str, state: PassageState, counts: bool = False) -> None:
        """The decision read the passage in this state: its commit fails if a version retired
        or restored it meanwhile — and with `counts`, if its counting sets changed
        (PassageState.revision: support or documents arrived after the read)."""
        keys = self.keys(tenant)
        key = keys.passage(passage_id)
        expected = _expected(pipe)
        expected.setdefault((key, "retired"), "1" if state.retired else None)
        expected.setdefault((key, "incarnation"), str(state.incarnation) if state.incarnation else None)
        if counts:  # the chunker: not the detectors, which would fail each other's commits on every fact
            expected.setdefault(
                (keys.passage_revision(passage_id), "n"), str(state.revision) if state.revision else None
            )

    def stage_retire_passage(self, pipe, tenant: str, passage_id: str) -> None:
        _eval(
            pipe,
            _RETIRE_PASSAGE,
            [self.keys(tenant).passage(passage_id)],
            [x for pair in RETIRED_FIELDS.items() for x in pair],
        )
        stage_lexical_mirror(pipe, self.keys(tenant), passage_id)

    def stage_restore_passage(self, pipe, tenant: str, passage_id: str, incarnation: int) -> None:
        _eval(
            pipe,
            _RESTORE_PASSAGE,
            [self.keys(tenant).passage(passage_id)],
            [incarnation, *(x for pair in RETIRED_FIELDS.items() for x in pair)],
        )
        stage_lexical_mirror(pipe, self.keys(tenant), passage_id)

    async def passage_support(self, tenant: str, passage_id: str) -> tuple[list[str], list[str]]:
        """(fact ids, schema ids) whose support counts the passage."""
        keys = self.keys(tenant)
        facts, schemas = await asyncio.gather(
            self.shard(tenant).smembers(keys.passage_facts(passage_id)),
            self.shard(tenant).smembers(keys.passage_schemas(passage_id)),
        )
        return sorted(_text(m) for m in facts), sorted(_text(m) for m in schemas)

    def stage_drop_support(
        self, pipe, tenant: str, passage_id: str, fact_ids: list[str], schema_ids: list[str], entity_ids: list[str]
    ) -> None:
        """The passage leaves every count it was in: its facts' support, its schemas'
        frequency, its entities' passages, and its chunk progress (extracted again on return)."""
        keys = self.keys(tenant)
        for fid in fact_ids:
            pipe.srem(keys.fact_passages(fid), passage_id)
        for sid in schema_ids:
            pipe.srem(keys.schema_passages(sid), passage_id)
            _eval(pipe, _RECOUNT_SCHEMA, [keys.schema_passages(sid), keys.schema(sid)], [])
        for eid in entity_ids:
            pipe.srem(keys.entity_passages(eid), passage_id)
        pipe.delete(
            keys.passage_facts(passage_id),
            keys.passage_schemas(passage_id),
            keys.chunk_facts_done(passage_id),
            keys.chunk_outstanding(passage_id),
        )
        pipe.srem(keys.chunks_done, passage_id)
