"""Document progress (store.base.Progress): the document's record as the chunker writes it (its
latest version only: _RECORD_DOCUMENT), each chunk's facts detected and work outstanding
(_CHUNK_PROGRESS), and the statuses `publish --wait` polls, counted in Redis
(_DOCUMENT_STATUSES)."""

from __future__ import annotations

import json
import time

from store.records import DocumentStatus
from store.redis.base import DONE_MARK_TTL_S, RedisBase, _eval, _text

# The document record follows the latest publication, never an older version (in process:
# store/in_memory/progress.py's stage_document).
_RECORD_DOCUMENT = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'doc_hash', ARGV[1], 'version', ARGV[2], 'chunk_ids', ARGV[3], 'ts', ARGV[4], 'mark', ARGV[5], 'position', ARGV[6])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return 1
"""

# Chunk progress: a chunk is through the pipeline when every one of its facts has been
# detected and no work it spawned (conflict sets, promoted activations) is outstanding (in
# process: store/in_memory/progress.py's _progress).
# KEYS: facts-done set, outstanding-work set, chunks-done set.
# ARGV: chunk id, fact count, ttl, fact index to add ('' for none), work id to finish ('' for none)
_CHUNK_PROGRESS = """
if ARGV[4] ~= '' then redis.call('SADD', KEYS[1], ARGV[4]) end
if ARGV[5] ~= '' then redis.call('SREM', KEYS[2], ARGV[5]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) and redis.call('SCARD', KEYS[2]) == 0 then
  redis.call('SADD', KEYS[3], ARGV[1])
  return 1
end
return 0
"""

# ---- document progress, many at once (`publish --wait`) ----
# Per document of KEYS[2..], [doc_hash, version, chunks, chunks done] (false: the chunker has not
# seen it), as one JSON text: a reply of one string is parsed at C speed by json.loads, where
# redis-py's pure-Python parser took ~17 µs per document's nested reply (measured on 5,000).
# KEYS[1]: the tenant's chunks-done set.
_DOCUMENT_STATUSES = """
local out = {}
for i = 2, #KEYS do
  local doc = redis.call('HMGET', KEYS[i], 'doc_hash', 'version', 'chunk_ids')
  if doc[1] then
    local ids, done = cjson.decode(doc[3]), 0
    for first = 1, #ids, 1000 do  -- unpack's limit on arguments is ~8,000
      for _, member in ipairs(redis.call('SMISMEMBER', KEYS[1], unpack(ids, first, math.min(first + 999, #ids)))) do
        done = done + member
      end
    end
    out[i - 1] = {doc[1], tonumber(doc[2]), #ids, done}
  else
    out[i - 1] = false  -- keeps the list whole
  end
end
return cjson.encode(out)
"""
# Documents per script call: the calls of one request go in one round trip, and Redis serves
# other clients between them instead of being held by one long script (250 documents of two
# chunks each: ~1.3 ms of Redis; measured 5.2 µs per such document, 1.4 µs per unseen one).
DOCUMENT_STATUS_BATCH = 250


class ProgressOps(RedisBase):
    """store.base.Progress on Redis."""

    # ---- document progress -----------------------------------------------------------
    def stage_document(
        self,
        pipe,
        tenant: str,
        doc_id: str,
        doc_hash: str,
        version: int,
        chunk_ids: list[str],
        mark: str = "",
        position: tuple[int, int] | None = None,
    ) -> None:
        """The document's current version (`mark`: the done mark of the message that made it so;
        `position`: that message's (partition, offset) on `documents`, where known)."""
        _eval(
            pipe,
            _RECORD_DOCUMENT,
            [self.keys(tenant).document(doc_id)],
            [
                doc_hash,
                version,
                json.dumps(chunk_ids),
                time.time(),
                mark,
                "" if position is None else "%d:%d" % position,
            ],
        )

    def stage_chunk_done(self, pipe, tenant: str, chunk_id: str) -> None:
        pipe.sadd(self.keys(tenant).chunks_done, chunk_id)

    def _stage_progress(
        self, pipe, tenant: str, chunk_id: str, chunk_fact_count: int, fact_index="", work_id=""
    ) -> None:
        keys = self.keys(tenant)
        _eval(
            pipe,
            _CHUNK_PROGRESS,
            [keys.chunk_facts_done(chunk_id), keys.chunk_outstanding(chunk_id), keys.chunks_done],
            [chunk_id, chunk_fact_count, DONE_MARK_TTL_S, fact_index, work_id],
        )

    def stage_fact_done(self, pipe, tenant: str, chunk_id: str, fact_index: int, chunk_fact_count: int) -> None:
        self._stage_progress(pipe, tenant, chunk_id, chunk_fact_count, fact_index=str(fact_index))

    def stage_spawn(self, pipe, tenant: str, chunk_id: str, work_ids: list[str]) -> None:
        """Work a chunk's fact spawned downstream; the chunk is not done until it finishes.
        Stage before the fact's stage_fact_done."""
        if work_ids:
            keys = self.keys(tenant)
            pipe.sadd(keys.chunk_outstanding(chunk_id), *work_ids)
            pipe.expire(keys.chunk_outstanding(chunk_id), DONE_MARK_TTL_S)

    def stage_work_done(self, pipe, tenant: str, chunk_id: str, work_id: str, chunk_fact_count: int) -> None:
        self._stage_progress(pipe, tenant, chunk_id, chunk_fact_count, work_id=work_id)

    async def chunk_done(self, tenant: str, chunk_id: str) -> bool:
        """Whether the chunk is through the pipeline (its facts detected, its spawned work done)."""
        return bool(await self.shard(tenant).sismember(self.keys(tenant).chunks_done, chunk_id))

    async def chunks_done_count(self, tenant: str) -> int:
        return await self.shard(tenant).scard(self.keys(tenant).chunks_done)

    async def outstanding_work(self, tenant: str, chunk_id: str) -> list[str]:
        """Ids of the work a chunk's facts spawned that has not finished yet."""
        return sorted(
            _text(m) for m in await self.shard(tenant).smembers(self.keys(tenant).chunk_outstanding(chunk_id))
        )

    async def document_status(self, tenant: str, doc_id: str) -> DocumentStatus | None:
        """None if the chunker has not seen the document."""
        return (await self.document_statuses(tenant, [doc_id]))[0]

    async def document_statuses(self, tenant: str, doc_ids: list[str]) -> list[DocumentStatus | None]:
        """Each document's status (None: not seen by the chunker) in one round trip, counted in
        Redis: nothing but four values per document crosses the wire."""
        keys = self.keys(tenant)
        pipe = self.shard(tenant).pipeline(transaction=False)
        for start in range(0, len(doc_ids), DOCUMENT_STATUS_BATCH):
            batch = [keys.document(doc_id) for doc_id in doc_ids[start : start + DOCUMENT_STATUS_BATCH]]
            _eval(pipe, _DOCUMENT_STATUSES, [keys.chunks_done, *batch], [])
        statuses: list[DocumentStatus | None] = []
        for reply in await pipe.execute() if doc_ids else []:
            statuses += [DocumentStatus(*s) if s else None for s in json.loads(reply)]
        return statuses

    async def document_ids(self, tenant: str) -> list[str]:
        """Every document the chunker recorded for the tenant (deleted ones too), by a SCAN."""
        return await self._scan_suffixes(self.shard(tenant), self.keys(tenant).document(""))
