"""Telling a Redis that cannot be reached from everything else, for callers that must not
import the Redis client: an outage is waited out (indexing) or answered 503 (query)."""

from __future__ import annotations

from redis.exceptions import AskError, ClusterDownError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# A Redis Cluster's slot moved (MOVED), is moving (ASK, TRYAGAIN) or has no serving shard
# (CLUSTERDOWN): the store's router reads the slot map again (store.redis.topology), and a retry
# after a wait reaches the slot's owner — as after a connection lost.
_SLOT_MOVING = (AskError, TryAgainError, ClusterDownError)  # AskError covers MovedError


def redis_unavailable(exc: BaseException | None) -> BaseException | None:
    """The Redis connection or timeout error behind `exc` (redisvl wraps them), or a cluster
    slot's move, if any. A pool that stays exhausted past its timeout raises
    ConnectionError("No connection available.")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError, *_SLOT_MOVING)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class RedisClusterNode(RedisError):
    """The Redis at a one-server URL (`redis://`) is a node of a Redis Cluster: the store on a
    cluster is named `redis+cluster://` (store.redis.topology) — as one server, a tenant whose slot
    lives elsewhere would fail with MOVED, and the query engine (no coordinator) searches one
    shard only (docs/operations.md, "Redis Cluster")."""
