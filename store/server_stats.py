"""What the Redis server has spent so far, for benchmarks that measure what a client costs it
(`memstream bench wait`): CPU seconds and commands processed, from one INFO."""

from __future__ import annotations

from dataclasses import dataclass

from store.redis.connection import REDIS_CONNECT_TIMEOUT_S, REDIS_REPLY_TIMEOUT_S


@dataclass(frozen=True)
class ServerUsage:
    cpu_s: float  # used_cpu_user + used_cpu_sys: all of the server's threads
    commands: int  # total_commands_processed: before this reading's own few (connection setup, INFO)


def server_usage(url: str, reply_timeout: float = REDIS_REPLY_TIMEOUT_S) -> ServerUsage:
    """One INFO, waiting at most `reply_timeout` for its reply (a URL's own `socket_timeout`
    wins), as the store's connections do: a Redis that stopped answering held the bench without
    end."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=reply_timeout, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S)
    try:
        info = client.info("cpu", "stats")
    finally:
        client.close()
    return ServerUsage(info["used_cpu_user"] + info["used_cpu_sys"], info["total_commands_processed"])
