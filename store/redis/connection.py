"""The Redis client's connections, with commands packed by hiredis (C) where redis-py's asyncio
connection packs them in Python: reconstruct sends ~100 commands a query on a 50,000-passage
tenant (FT.SEARCH with a vector, read scripts over 60 keys), and packing them cost 15-47 us each
in Python against 5-12 us in hiredis. Arguments are what redis-py's encoder would send, byte
for byte: floats as their repr (hiredis would print them with 17 digits), bytes-likes as bytes.
A command the socket takes whole is written without the task redis-py's write timeout makes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis import exceptions
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError, ResponseError

from store.errors import RedisClusterNode

try:
    import hiredis
except ImportError:  # redis-py's own packing, as without this module
    hiredis = None  # type: ignore[assignment]


# How long a command waits for its reply, and a connection for its TCP handshake, unless the URL
# says (`?socket_timeout=`, `?socket_connect_timeout=`): a Redis that takes commands and answers
# none (SIGSTOP, packets dropped without a reset) held its callers without end — a handler, a
# query, a promotion — and a reply that does not come fails as an outage (store.errors), which the
# writers wait out and the query API answers 503. The store sends no blocking read (its change
# stream reads with XRANGE), and its longest command here — a purge's or a replay's script — takes
# well under a second, so 30 s only ends what would never end.
REDIS_REPLY_TIMEOUT_S = 30.0
REDIS_CONNECT_TIMEOUT_S = 10.0

_PLAIN = (str, bytes, int)


def _argument(value):
    """What hiredis packs as redis-py's encoder would: floats by repr, bytes-likes as bytes, and a
    bool (an int to hiredis) refused, as redis-py refuses it."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, bool):
        raise DataError("Invalid input of type: 'bool'. Convert to a bytes, string, int or float first.")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value  # hiredis refuses anything else (TypeError), as the encoder does


class _HiredisPacking:
    async def send_packed_command(self, command, check_health: bool = True) -> None:
        """redis-py's, without the task its write timeout costs (asyncio.wait_for makes one a
        command: ~30 of a command's ~130 us of client CPU) where the command goes into the
        socket's buffer whole: only a write the socket cannot take at once waits, under the
        same timeout (socket_timeout). Anything else — not connected, a health check due, a
        closing transport — takes redis-py's own path."""
        writer = getattr(self, "_writer", None)
        if (
            writer is None
            or not self.is_connected  # type: ignore[attr-defined]
            or writer.transport.is_closing()
            or (check_health and self.health_check_interval)  # type: ignore[attr-defined]
        ):
            return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if isinstance(command, str):
            command = command.encode()
        writer.writelines([command] if isinstance(command, bytes) else command)
        if writer.transport.get_write_buffer_size() == 0:
            return
        timeout = self.socket_timeout  # type: ignore[attr-defined]
        try:
            await (asyncio.wait_for(writer.drain(), timeout) if timeout else writer.drain())
        except asyncio.TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise exceptions.ConnectionError(f"Error while writing to socket: {exc}") from exc
        except asyncio.CancelledError:
            # the command may still reach the server whole: its reply must not be read as the
            # connection's next command's (redis-py's own write drops the connection too)
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise

    def pack_command(self, *args):
        if isinstance(args[0], str):  # "CONFIG GET": the words sent as separate arguments
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(tuple(map(_argument, args)))]
        except TypeError as exc:  # None, or an object redis-py's encoder refuses too
            raise DataError(str(exc)) from None


_PACKED: dict[type, type] = {}


def hiredis_packing(connection_class: type) -> type:
    """`connection_class` (TCP, Unix socket or TLS, as the URL chose) packing with hiredis; itself
    where hiredis is not installed. One class per kind."""
    if hiredis is None:
        return connection_class
    if connection_class not in _PACKED:
        name = f"HiredisPacked{connection_class.__name__}"
        _PACKED[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return _PACKED[connection_class]


class _OneServerOnly:
    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health)  # type: ignore[misc]
        await self.send_command("INFO", "cluster")  # type: ignore[attr-defined]
        try:
            info = await self.read_response()  # type: ignore[attr-defined]
        except ResponseError:  # an ACL without INFO (docker-compose's): the server cannot be asked
            return
        text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
        if "cluster_enabled:1" in text:
            host = getattr(self, "host", None) or getattr(self, "path", "")
            port = getattr(self, "port", "")
            raise RedisClusterNode(
                f"the Redis at {host}{f':{port}' if port else ''} is a Redis Cluster node (cluster_enabled:1): "
                f"name it as one — MEMSTREAM_REDIS_URL=redis+cluster://{host}{f':{port}' if port else ''}/0 — so each "
                "tenant's commands go to its slot's shard (docs/operations.md, \"Redis Cluster\")"
            )


_STORE: dict[type, type] = {}


def store_connection(connection_class: type) -> type:
    """The store's connection: `connection_class` (TCP, Unix socket or TLS, as the URL chose)
    packing with hiredis, that refuses a Redis Cluster node when it connects (one INFO a
    connection, ~0.1 ms, kept for the connection's life)."""
    if connection_class not in _STORE:
        packed = hiredis_packing(connection_class)
        _STORE[connection_class] = type(f"Store{packed.__name__}", (_OneServerOnly, packed), {})
    return _STORE[connection_class]


async def run_script(script: AsyncScript, keys: Sequence, args: Sequence):
    """EVALSHA of a registered script, on a connection of its client's pool: the command sent and
    its reply read, without the client's command path around them (its retry wrapper,
    observability hooks and reply callbacks, none of which an EVALSHA reply needs). The store's
    reads are scripts — a reconstruct query sends ~18 — and that path was ~8% of a query's client
    CPU (paired on one Redis at 50,000 passages: 0.94x the CPU and 0.98x the time, the same
    answers). Anything but a
    reply or a Redis error takes the script's own call, with the client's retries: NOSCRIPT (the
    server has not cached it: a restart, SCRIPT FLUSH) or a connection lost (closed by redis-py as
    it raised, so the pool opens another). A reply that timed out raises: the server that kept it
    REDIS_REPLY_TIMEOUT_S would keep the second call as long, doubling the wait (from a review),
    and may have run the script already."""
    client = script.registered_client
    if not isinstance(client, aioredis.Redis):  # (a cluster client routes by itself: its own call)
        return await script(keys=keys, args=args)
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        await connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return await connection.read_response()
    except (NoScriptError, exceptions.ConnectionError):
        pass
    finally:
        await pool.release(connection)
    return await script(keys=keys, args=args)
