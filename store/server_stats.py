"""What the Redis server has spent so far, for benchmarks that measure what a client costs it
(`memstream bench wait`): CPU seconds and commands processed, from one INFO."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerUsage:
    cpu_s: float  # used_cpu_user + used_cpu_sys: all of the server's threads
    commands: int  # total_commands_processed: before this reading's own few (connection setup, INFO)


def server_usage(url: str) -> ServerUsage:
    import redis

    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu", "stats")
    finally:
        client.close()
    return ServerUsage(info["used_cpu_user"] + info["used_cpu_sys"], info["total_commands_processed"])
