"""Where the store's keys live: on one Redis server (OneServer), or on the shards of a Redis
Cluster (ShardRouter). The store sends each command to the client its key's slot names: a
tenant's keys share the hash tag `{tenant}` (store.keys), so a tenant is one slot on one shard,
and so are its transactions and read scripts.

Why not redis-py's RedisCluster: the query engine shipped here has no cluster coordinator, so
an index is a key on one shard that sees that shard's records only (tests/test_redis_cluster.py
pins it). A tenant's searches must go to the shard holding its slot, and its writes must stay
one MULTI on one connection there — plain clients, one per shard, do both; RedisCluster's
pipelines are not transactions and its FT.* commands go to a random node."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

log = logging.getLogger(__name__)

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
# A slot owner read again at most this often on MOVED replies (a reshard sends many at once).
REFRESH_MIN_INTERVAL_S = 0.2
BOOTSTRAP_TIMEOUT_S = 5.0

Node = tuple[str, int]  # a shard primary's (host, port)
PoolFactory = Callable[[str], aioredis.ConnectionPool]


def default_pool(url: str) -> aioredis.ConnectionPool:
    return aioredis.ConnectionPool.from_url(url, decode_responses=False)


class Topology(Protocol):
    """The clients of the Redis servers the store's keys live on."""

    def for_tenant(self, tenant: str) -> aioredis.Redis:
        """The client of the server holding the tenant's keys and indexes."""

    def for_key(self, key: str | bytes) -> aioredis.Redis:
        """The client of the server holding `key` (a key of memstream's own namespaces)."""

    def servers(self) -> list[aioredis.Redis]:
        """One client per server: what a read across every tenant asks each of."""

    def shard_tag(self, client: aioredis.Redis) -> str | None:
        """A hash tag of a slot the server of `client` serves, for the names of its shared
        indexes (an index name is a key to a cluster); None on one server (names untagged)."""

    def serves(self, client: aioredis.Redis, key: str | bytes) -> bool:
        """Whether the server of `client` serves the slot of `key` (a name it can reach: a
        cluster answers MOVED for any other, an index's name included)."""

    async def close(self) -> None: ...


class OneServer:
    """Every key and index on one Redis server: the store as it has always run."""

    def __init__(self, client: aioredis.Redis):
        self.client = client

    def for_tenant(self, tenant: str) -> aioredis.Redis:
        return self.client

    def for_key(self, key: str | bytes) -> aioredis.Redis:
        return self.client

    def servers(self) -> list[aioredis.Redis]:
        return [self.client]

    def shard_tag(self, client: aioredis.Redis) -> str | None:
        return None

    def serves(self, client: aioredis.Redis, key: str | bytes) -> bool:
        return True

    async def close(self) -> None:
        await self.client.aclose()


def cluster_seed(url: str) -> str | None:
    """The seed node's plain URL of a cluster URL (`redis+cluster://host:port/0`, or
    `rediss+cluster://` with TLS), None for any other URL."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES.get(parts.scheme)
    return None if scheme is None else urlunsplit(parts._replace(scheme=scheme))


def tenant_slot(tenant: str) -> int:
    """The hash slot of every key of the tenant (they all carry the tag `{tenant}`)."""
    return key_slot(f"{{{tenant}}}".encode())


@functools.lru_cache(maxsize=64)
def slot_tag(slot: int) -> str:
    """The first of "s0", "s1", … whose hash slot is `slot` (~16,000 tried, ~30 ms, once a slot)."""
    n = 0
    while key_slot(f"s{n}".encode()) != slot:
        n += 1
    return f"s{n}"


def parse_cluster_slots(reply: Iterable) -> list[tuple[int, int, Node]]:
    """(first slot, last slot, primary) of each range of a CLUSTER SLOTS reply."""
    ranges = []
    for first, last, primary, *_replicas in reply:
        host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
        ranges.append((int(first), int(last), (host, int(primary[1]))))
    return ranges


class ShardRouter:
    """The primaries of a Redis Cluster, one plain client each, and which serves each slot.

    The slot map is read from CLUSTER SLOTS when the router is made and again in the background
    whenever a shard answers MOVED (a slot moved), ASK or TRYAGAIN (moving): the command that got
    it fails as a Redis outage would (store.errors.redis_unavailable), and its retry reaches the
    slot's new owner. A MOVED reply names the new owner, which is taken at once."""

    def __init__(self, seed_url: str, ranges: list[tuple[int, int, Node]], pool: PoolFactory = default_pool):
        self._seed = urlsplit(seed_url)
        self._pool = pool
        self._clients: dict[Node, aioredis.Redis] = {}
        self._owner: list[Node] = [("", 0)] * REDIS_CLUSTER_HASH_SLOTS
        self._refreshing: asyncio.Task | None = None
        self._refreshed_at = 0.0
        self._first_slot: dict[Node, int] = {}  # each primary's first slot (its shard tag's)
        self._apply(ranges)

    @classmethod
    def from_url(cls, url: str, pool: PoolFactory = default_pool) -> ShardRouter:
        """A router over the cluster a node at `url` (a plain redis:// URL) belongs to; its slot
        map read now, with a blocking call (a process reads it once as it starts). `pool` makes
        each shard's connection pool from its URL."""
        with redis.Redis.from_url(url, socket_timeout=BOOTSTRAP_TIMEOUT_S) as seed:
            reply = seed.execute_command("CLUSTER", "SLOTS")
        return cls(url, parse_cluster_slots(reply), pool)

    # ---- routing ---------------------------------------------------------------------------
    def for_slot(self, slot: int) -> aioredis.Redis:
        return self._client(self._owner[slot])

    def for_tenant(self, tenant: str) -> aioredis.Redis:
        return self.for_slot(tenant_slot(tenant))

    def for_key(self, key: str | bytes) -> aioredis.Redis:
        return self.for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def servers(self) -> list[aioredis.Redis]:
        return [self._client(node) for node in sorted(set(self._owner))]

    def shard_tag(self, client: aioredis.Redis) -> str | None:
        """The tag of the first slot the server of `client` serves (slot_tag): the name of
        what a shard makes first; what it has made keeps its name while the shard serves it
        (serves), though its first slot changes with every reshard."""
        return slot_tag(self._first_slot[cast(_ShardClient, client).memstream_node])

    def serves(self, client: aioredis.Redis, key: str | bytes) -> bool:
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        return self._owner[slot] == cast(_ShardClient, client).memstream_node

    def node_of(self, tenant: str) -> Node:
        """The (host, port) of the primary serving the tenant's slot, as this router knows it."""
        return self._owner[tenant_slot(tenant)]

    async def close(self) -> None:
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        await asyncio.gather(*(client.aclose() for client in self._clients.values()), return_exceptions=True)
        self._clients.clear()

    # ---- the slot map ----------------------------------------------------------------------
    async def refresh(self) -> None:
        """Read the slot map again (from any primary that answers)."""
        error: Exception | None = None
        for client in self.servers():
            try:
                reply = await client.execute_command("CLUSTER", "SLOTS")
            except Exception as exc:  # that shard is down: ask another
                error = exc
                continue
            self._apply(parse_cluster_slots(reply))
            self._refreshed_at = asyncio.get_running_loop().time()
            return
        if error is not None:
            raise error

    def rerouted(self, exc: Exception) -> None:
        """A shard answered MOVED, ASK or TRYAGAIN: take a MOVED reply's new owner now, and read
        the whole map again in the background (at most every REFRESH_MIN_INTERVAL_S)."""
        if isinstance(exc, MovedError) and exc.host:
            self._owner[exc.slot_id] = (str(exc.host), int(exc.port))
            self._derive_first_slots()
        loop = asyncio.get_running_loop()
        if self._refreshing is not None and not self._refreshing.done():
            return
        if loop.time() - self._refreshed_at < REFRESH_MIN_INTERVAL_S:
            return
        self._refreshing = loop.create_task(self._refresh_logged())

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception:  # the next MOVED tries again
            log.warning("reading the Redis Cluster's slot map failed", exc_info=True)

    def _apply(self, ranges: list[tuple[int, int, Node]]) -> None:
        for first, last, node in ranges:
            self._owner[first : last + 1] = [node] * (last - first + 1)
        self._derive_first_slots()

    def _derive_first_slots(self) -> None:
        """Each primary's first slot, once per change of the map (shard_tag is asked for every
        message's applied offsets: a scan of the 16,384 owners each time)."""
        first: dict[Node, int] = {}
        for slot, node in enumerate(self._owner):
            first.setdefault(node, slot)
        self._first_slot = first

    def _client(self, node: Node) -> aioredis.Redis:
        client = self._clients.get(node)
        if client is None:
            if not node[0]:
                raise ClusterDownError("a hash slot no shard of the Redis Cluster serves")
            url = urlunsplit(self._seed._replace(netloc=_netloc(self._seed, node)))
            shard = cast(_ShardClient, _ShardClient.from_pool(self._pool(url)))
            shard.memstream_router = self
            shard.memstream_node = node
            self._clients[node] = client = shard
        return client


def _netloc(seed, node: Node) -> str:
    """The seed URL's credentials at another node's address."""
    credentials = seed.netloc.rpartition("@")[0]
    return f"{credentials + '@' if credentials else ''}{node[0]}:{node[1]}"


_REROUTED = (AskError, TryAgainError, ClusterDownError)  # AskError covers MovedError


class _TellsRouter:
    """A client's replies parsed, and its router told when one says a slot moved (also a reply
    inside a pipeline or transaction)."""

    memstream_router: ShardRouter

    async def parse_response(self, connection, command_name, **options):
        try:
            return await super().parse_response(connection, command_name, **options)  # type: ignore[misc]
        except _REROUTED as exc:
            self.memstream_router.rerouted(exc)
            raise


class _ShardPipeline(_TellsRouter, Pipeline):  # type: ignore[misc]  # redis-py's own mixins disagree
    pass


class _ShardClient(_TellsRouter, aioredis.Redis):  # type: ignore[misc]  # redis-py's own mixins disagree
    """A shard's client: its pipelines tell the router too."""

    memstream_node: Node  # the primary it talks to

    def pipeline(self, transaction: bool = True, shard_hint=None) -> Pipeline:
        pipe = _ShardPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.memstream_router = self.memstream_router
        return pipe
