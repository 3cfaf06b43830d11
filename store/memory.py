"""The memory in Redis: M_pas, M_ont, M_fac, entities, graph adjacency, vector search, document
progress and the effectively-once machinery (done marks + outbox).

Writes are staged on a MULTI pipeline by the worker that decides them and executed together
with the message's outbox, so a crash leaves either all of a message's effects or none.
Every write is idempotent: ids are content hashes and counts are set sizes.

`Memory` is one mixin per role of store.base over what they share, each module beside the Lua
scripts its methods run (store/redis/):
- store.redis.base.RedisBase: the client and its lifetime (Lifetime), the keys, the shared vector
  indexes and the tenant's embedder record (Layers' ensure_indexes, recorded_embedder,
  claim_embedder), the staging and fencing helpers of every role (_eval, _expected).
- store.redis.outbox.OutboxOps: Outbox (done marks, outboxes, commit_once).
- store.redis.progress.ProgressOps: Progress.
- store.redis.versions.VersionsOps: Versions.
- store.redis.erasing.ErasingOps: Erasing.
- store.redis.layers.LayersOps: Layers' records (staged writes and reads).
- store.redis.lexical_index.LexicalIndexOps: Layers' ensure_indexes (the shared indexes, and a
  large tenant's own lexical index: promote_lexical).
- store.redis.vector_index.VectorIndexOps: a large tenant's own vector indexes (promote_vectors).
- store.redis.search.SearchOps: Layers' searches (knn, knn_many, lexical).
- store.redis.episodes.EpisodesOps: Episodes.
- store.redis.aliases.AliasesOps: Aliases.
- store.redis.gate.GateOps: Gate.
- store.redis.groups.GroupsOps: ConflictGroups.
- store.redis.graph.GraphOps: GraphWrites and GraphReads.
- store.redis.standing.StandingOps: StandingFacts.
- store.redis.expiry.ExpiryOps: Expiry (and the lapse scripts stage_new_fact runs).
- store.redis.tenants.TenantsOps: Tenants (with `memstream migrate`).
- store.redis.export.ExportOps: Export.
GraphOps and StandingOps derive from LayersOps, TenantsOps from ExportOps and SearchOps and
TenantsOps from LexicalIndexOps, the role each reads through; every other mixin from RedisBase alone.
The names other modules import from here are re-exported below; a constant is read where it is
defined, so a test patches it there (e.g. store.redis.search.LEXICAL_CANDIDATES)."""

from __future__ import annotations

import redis.asyncio as aioredis

from store.records import Hit
from store.redis.aliases import AliasesOps
from store.redis.base import DONE_MARK_TTL_S, INITIAL_SCAN_WAIT_S, TENANT_DIMS_RECHECK_S, RedisBase
from store.redis.connection import REDIS_CONNECT_TIMEOUT_S, REDIS_REPLY_TIMEOUT_S, hiredis_packing, store_connection
from store.redis.episodes import EpisodesOps
from store.redis.erasing import ErasingOps
from store.redis.expiry import ExpiryOps
from store.redis.export import ExportOps
from store.redis.gate import GateOps
from store.redis.graph import GraphOps
from store.redis.groups import GroupsOps
from store.redis.layers import LayersOps
from store.redis.outbox import SWEEP_REGISTRATION_S, OutboxOps
from store.redis.progress import DOCUMENT_STATUS_BATCH, ProgressOps
from store.redis.search import LEXICAL_CANDIDATES, LEXICAL_MAX_READ, LEXICAL_READ_ALL, SearchOps
from store.redis.standing import StandingOps
from store.redis.tenants import CENSUS_MAX_GROUPS, TenantsOps
from store.redis.topology import ShardRouter, cluster_seed
from store.redis.versions import VersionsOps

__all__ = [
    "CENSUS_MAX_GROUPS",
    "DOCUMENT_STATUS_BATCH",
    "DONE_MARK_TTL_S",
    "INITIAL_SCAN_WAIT_S",
    "LEXICAL_CANDIDATES",
    "LEXICAL_MAX_READ",
    "LEXICAL_READ_ALL",
    "REDIS_CONNECT_TIMEOUT_S",
    "REDIS_REPLY_TIMEOUT_S",
    "SWEEP_REGISTRATION_S",
    "TENANT_DIMS_RECHECK_S",
    "Hit",
    "Memory",
]


class Memory(
    OutboxOps,
    ProgressOps,
    VersionsOps,
    ErasingOps,
    StandingOps,
    GraphOps,
    LayersOps,
    SearchOps,
    EpisodesOps,
    AliasesOps,
    GateOps,
    GroupsOps,
    ExpiryOps,
    TenantsOps,
    ExportOps,
    RedisBase,
):
    """Every role of store.base.MemoryStore on Redis: the mixins above, each method defined in one
    of them only (tests/test_store_interface.py checks it), composed over RedisBase."""

    @classmethod
    def from_url(
        cls,
        url: str,
        max_connections: int = 64,
        pool_timeout: float = 20.0,
        reply_timeout: float | None = REDIS_REPLY_TIMEOUT_S,
        **kwargs,
    ) -> "Memory":
        """A client whose pool holds at most `max_connections`; a command finding them all busy
        waits up to `pool_timeout` seconds for one (then redis ConnectionError) instead of
        failing at once with "Too many connections" as redis-py's default pool does, and up to
        `reply_timeout` for its reply (then redis TimeoutError; the URL's `socket_timeout` wins;
        None: without end). A `redis+cluster://` (or `rediss+cluster://`) URL names any node of a
        Redis Cluster: a client and pool like that per primary (store.redis.topology.ShardRouter)."""

        def pool(node_url: str, one_server: bool) -> aioredis.ConnectionPool:
            made = aioredis.BlockingConnectionPool.from_url(
                node_url,
                max_connections=max_connections,
                timeout=pool_timeout,
                decode_responses=False,
                socket_timeout=reply_timeout,
                socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            )
            made.connection_class = (store_connection if one_server else hiredis_packing)(made.connection_class)
            return made

        seed = cluster_seed(url)
        if seed is not None:
            return cls(ShardRouter.from_url(seed, lambda node_url: pool(node_url, False)), **kwargs)
        return cls(aioredis.Redis.from_pool(pool(url, True)), **kwargs)
