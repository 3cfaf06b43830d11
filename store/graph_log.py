"""The graph log: a tenant's graph as Redis holds it. The indexing stages write it (through
Memory.stage_edge, stage_fact_edge, stage_fact_unlink) and the query worker's graph cache
(workers.query.graph_cache) reads it; both sides of the format are here.

- adjacency hashes (`TenantKeys.adjacency(node)`): field `{kind}|{other node}` → weight; every
  undirected edge is written on both of its ends;
- the change stream (`TenantKeys.graph_changes`): one entry per edge change, fields `v` (graph
  version), `a`, `b`, `w` (the edge's absolute weight now; 0 removes it) and `kind`; capped at
  about GRAPH_CHANGES_MAXLEN entries, the oldest trimmed first;
- the node set (`TenantKeys.graph_nodes`): every node that ever had an edge.

A reader loads the adjacency hashes, then applies the changes after the stream id it read
before the load (its cursor). Changes carry absolute weights, so one applied twice is harmless;
a change trimmed away before it was applied is not, so the reader must be told (changes_since
returns None) and load again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from store.keys import TenantKeys

GRAPH_CHANGES_MAXLEN = 200_000
NO_CHANGE = "0-0"  # the cursor of a graph loaded while the tenant had no change stream
LOAD_BATCH = 500  # adjacency hashes read per round trip
READ_BATCH = 10_000  # change-stream entries per XRANGE


@dataclass(frozen=True, slots=True)
class EdgeChange:
    """An undirected edge of one kind and its absolute weight (0: the edge is gone)."""

    a: str
    b: str
    weight: float
    kind: str  # fact | passage | type | similar

    def entry(self, version: int) -> dict:
        """The change-stream entry that records this change at graph `version`."""
        return {"v": version, "a": self.a, "b": self.b, "w": self.weight, "kind": self.kind}

    @classmethod
    def from_entry(cls, fields: dict[bytes, bytes]) -> "EdgeChange":
        return cls(fields[b"a"].decode(), fields[b"b"].decode(), float(fields[b"w"]), fields[b"kind"].decode())


def adjacency_field(kind: str, other: str) -> str:
    """The field of `other`'s edge of this kind in a node's adjacency hash."""
    return f"{kind}|{other}"


# SADD a fact to the set of facts between two entities; the edge weight is the set's size,
# written both ways, and the change is appended to the tenant's graph change stream.
LINK_FACT = """
redis.call('SADD', KEYS[1], ARGV[1])
local w = redis.call('SCARD', KEYS[1])
redis.call('HSET', KEYS[2], 'fact|' .. ARGV[3], w)
redis.call('HSET', KEYS[3], 'fact|' .. ARGV[2], w)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'v', ARGV[4], 'a', ARGV[2], 'b', ARGV[3], 'w', w, 'kind', 'fact')
redis.call('SADD', KEYS[5], ARGV[2], ARGV[3])
return w
"""

# Remove a fact from the edge between its entities (an invalidated or merged fact).
UNLINK_FACT = """
redis.call('SREM', KEYS[1], ARGV[1])
local w = redis.call('SCARD', KEYS[1])
if w == 0 then
  redis.call('HDEL', KEYS[2], 'fact|' .. ARGV[3])
  redis.call('HDEL', KEYS[3], 'fact|' .. ARGV[2])
else
  redis.call('HSET', KEYS[2], 'fact|' .. ARGV[3], w)
  redis.call('HSET', KEYS[3], 'fact|' .. ARGV[2], w)
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'v', ARGV[4], 'a', ARGV[2], 'b', ARGV[3], 'w', w, 'kind', 'fact')
return w
"""


# ---- reading -----------------------------------------------------------------------------
async def head(redis, keys: TenantKeys) -> str:
    """The id of the stream's last change (NO_CHANGE without a stream)."""
    last = await redis.xrevrange(keys.graph_changes, count=1)
    return last[0][0].decode() if last else NO_CHANGE


async def exists(redis, keys: TenantKeys) -> bool:
    return bool(await redis.exists(keys.graph_changes))


async def adjacency(redis, keys: TenantKeys, nodes: list[str]) -> AsyncIterator[list[EdgeChange]]:
    """Every edge the adjacency hashes of `nodes` hold, each once (from its smaller end), one
    list per round trip of LOAD_BATCH hashes."""
    for start in range(0, len(nodes), LOAD_BATCH):
        batch = nodes[start : start + LOAD_BATCH]
        pipe = redis.pipeline(transaction=False)
        for node in batch:
            pipe.hgetall(keys.adjacency(node))
        edges = []
        for node, row in zip(batch, await pipe.execute()):
            for field, value in row.items():
                kind, other = field.decode().split("|", 1)
                if node < other:
                    edges.append(EdgeChange(node, other, float(value), kind))
        yield edges


async def changes_since(redis, keys: TenantKeys, cursor: str, count: int) -> list[tuple[str, EdgeChange]] | None:
    """The first `count` changes after `cursor`, with their ids, in stream order (fewer: there
    are no more). The stream must still hold the cursor's own entry (trimming removes the oldest
    first, so then nothing after it is gone): None when it does not — trimmed past the cursor,
    deleted (Redis restarted empty), or begun again with other ids — and the reader loads
    again. From NO_CHANGE (loaded before the stream existed), None when the stream ever lost
    an entry. One XRANGE when nothing changed."""
    key = keys.graph_changes
    if cursor == NO_CHANGE:  # stream ids start above 0-0
        entries = await redis.xrange(key, min=cursor, count=count)
        if entries and await _trimmed(redis, key):
            return None  # entries made since the load are gone
    else:
        entries = await redis.xrange(key, min=cursor, count=count + 1)  # from the cursor, inclusive
        if not entries or entries[0][0].decode() != cursor:
            return None
        entries = entries[1:]
    return [(entry_id.decode(), EdgeChange.from_entry(fields)) for entry_id, fields in entries]


async def _trimmed(redis, key: str) -> bool:
    """Whether entries were ever removed from the stream (or it is gone). XTRIM and MAXLEN leave
    `max-deleted-entry-id` at 0-0 (only XDEL sets it: Redis 8.2, seen in
    tests/test_store_graph_log.py), so a stream that added more entries than it holds was
    trimmed too."""
    from redis.exceptions import ResponseError  # here: store.in_memory imports this module without redis

    try:
        info = await redis.xinfo_stream(key)
    except ResponseError:  # deleted since the XRANGE
        return True
    deleted = info.get("max-deleted-entry-id", b"0-0")
    deleted = deleted.decode() if isinstance(deleted, bytes) else str(deleted)
    return _stream_id(deleted) > (0, 0) or int(info.get("entries-added", info["length"])) > int(info["length"])


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
