"""store.redis.connection: commands packed by hiredis are the bytes redis-py's own asyncio packing
sends, for every kind of argument the store passes; what redis-py refuses is refused."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError

from store.redis.connection import hiredis, hiredis_packing

pytestmark = pytest.mark.skipif(hiredis is None, reason="hiredis not installed")

COMMANDS = [
    ("GET", "k"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETINFO", b"lib-name", "x"),
    ("HSET", "ms:{t}:pas:p1", "text", "naïve café ☕", "score", 0.1, "n", 3, "big", 2**70, "neg", -1.5e-300),
    ("HSET", "k", "f", float("inf"), "g", np.float64(0.25)),
    ("FT.SEARCH", "idx", "*=>[KNN 5 @vec $v]", "PARAMS", 2, "v", np.arange(384, dtype=np.float16).tobytes()),
    ("SET", "k", bytearray(b"\x00\xff"), "GET"),
    ("SET", "k", memoryview(b"abc" * 40_000)),
    ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "HMGET", "text", "vec"),
]


def _plain(*args) -> bytes:
    return b"".join(bytes(chunk) for chunk in aioredis.Connection().pack_command(*args))


def _packed(*args) -> bytes:
    return b"".join(hiredis_packing(aioredis.Connection)().pack_command(*args))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_hiredis_packing_sends_what_redis_py_sends(command):
    assert _packed(*command) == _plain(*command)


@pytest.mark.parametrize("bad", [None, True, np.float32(0.5), np.int64(7), object()])
def test_what_redis_py_refuses_is_refused(bad):
    with pytest.raises(DataError):
        _plain("SET", "k", bad)
    with pytest.raises(DataError):
        _packed("SET", "k", bad)


def test_every_url_kind_keeps_its_connection_class():
    for url, kind in (
        ("redis://h:1/0", aioredis.Connection),
        ("unix:///tmp/r.sock", aioredis.UnixDomainSocketConnection),
        ("rediss://h:1/0", aioredis.SSLConnection),
    ):
        pool = aioredis.BlockingConnectionPool.from_url(url)
        packed = hiredis_packing(pool.connection_class)
        assert issubclass(packed, kind) and packed is not kind
        asyncio.run(pool.disconnect())


def test_a_command_the_socket_takes_whole_is_sent_without_a_task(stack_env):
    """redis-py's write timeout (asyncio.wait_for) made a task for every command sent; the
    store's connection writes a command the socket takes whole at once, and the reply is the same."""
    from store.memory import Memory

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        client = memory.redis
        try:
            await client.set("memstream-test:send", "v")
            loop = asyncio.get_running_loop()
            made, create_task = [], loop.create_task

            def counted(coro, **kwargs):
                made.append(getattr(coro, "__qualname__", repr(coro)))
                return create_task(coro, **kwargs)

            loop.create_task = counted  # type: ignore[method-assign]
            try:
                replies = [await client.get("memstream-test:send") for _ in range(20)]
            finally:
                loop.create_task = create_task  # type: ignore[method-assign]
            return replies, made
        finally:
            await client.delete("memstream-test:send")
            await memory.close()

    replies, made = asyncio.run(main())
    assert replies == [b"v"] * 20
    assert made == []


def test_a_write_larger_than_the_sockets_buffer_still_arrives(stack_env):
    """A command the socket cannot take at once waits for it to drain (redis-py's path)."""
    from store.memory import Memory

    value = np.random.default_rng(7).bytes(24 * 1024 * 1024)

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        try:
            await memory.redis.set("memstream-test:big", value)
            return await memory.redis.get("memstream-test:big")
        finally:
            await memory.redis.delete("memstream-test:big")
            await memory.close()

    assert asyncio.run(main()) == value


@pytest.mark.parametrize("ended_by", ["timeout", "cancel"])
def test_a_write_the_server_never_reads_times_out_and_drops_the_connection(ended_by):
    """A server that stops reading: the write waits socket_timeout, then fails as redis-py's does
    (TimeoutError) and the connection is dropped (a later command connects again). A write
    cancelled while it waits (its caller's timeout, a stop) drops it too: the command may still
    reach the server whole, and its reply would be read by the connection's next command."""
    from redis.exceptions import TimeoutError as RedisTimeout

    async def main():
        stalled: list[asyncio.StreamWriter] = []
        stop_reading = asyncio.Event()

        async def answer_then_stall(reader, writer):  # +OK to what the client says as it connects
            stalled.append(writer)
            while not stop_reading.is_set():
                try:
                    said = await asyncio.wait_for(reader.read(65536), 0.05)
                except asyncio.TimeoutError:
                    continue
                if not said:
                    return
                writer.write(b"+OK\r\n" * said.count(b"\r\n*") + (b"+OK\r\n" if said.startswith(b"*") else b""))
            writer.transport.pause_reading()

        server = await asyncio.start_server(answer_then_stall, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        timeout = 0.5 if ended_by == "timeout" else 30.0
        connection = hiredis_packing(aioredis.Connection)(
            host="127.0.0.1", port=port, socket_timeout=timeout, protocol=2
        )
        try:
            await connection.connect()
            stop_reading.set()
            await asyncio.sleep(0.2)
            send = asyncio.ensure_future(connection.send_command("SET", "k", b"x" * (64 * 1024 * 1024)))
            if ended_by == "cancel":
                await asyncio.sleep(0.3)
                send.cancel()
            with pytest.raises(RedisTimeout if ended_by == "timeout" else asyncio.CancelledError):
                await send
            return connection.is_connected
        finally:
            await connection.disconnect()
            for writer in stalled:
                writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) is False


_ECHO = "if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end return {KEYS[1], ARGV[1], #ARGV}"


def test_a_script_is_run_on_a_pooled_connection_without_the_clients_command_path(stack_env):
    """run_script sends EVALSHA and reads its reply on a connection of the pool (the store's
    reads are scripts: the client's command path around each was ~8% of a reconstruct query's
    CPU); the reply is the one the script's own call gives."""
    from store.memory import Memory
    from store.redis.connection import run_script

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        client = memory.redis
        script = client.register_script(_ECHO)
        try:
            expected = await script(keys=["k"], args=["a", 2, 0.5])  # (loads it: EVAL on NOSCRIPT)
            through, execute = [], client.execute_command

            async def spied(*args, **kwargs):
                through.append(args[0])
                return await execute(*args, **kwargs)

            client.execute_command = spied  # type: ignore[method-assign]
            got = [await run_script(script, ["k"], ["a", 2, 0.5]) for _ in range(5)]
            return expected, got, through
        finally:
            await memory.close()

    expected, got, through = asyncio.run(main())
    assert expected == [b"k", b"a", 3]
    assert got == [expected] * 5
    assert through == []


def test_a_script_the_server_lost_or_a_connection_cut_takes_the_clients_path(stack_env):
    """NOSCRIPT (a restart, SCRIPT FLUSH), a connection killed under the pool: the script's own
    call answers (it loads the script; the client opens a connection and retries). A script's
    error is raised as the client raises it, and the connection serves the next call."""
    from redis.exceptions import ResponseError

    from store.memory import Memory
    from store.redis.connection import run_script

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], max_connections=1)  # the one connection
        client = memory.redis
        other = aioredis.Redis.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        # a script this server never saw (as after a restart): NOSCRIPT; not SCRIPT FLUSH, which
        # would take every other client's scripts away too
        script = client.register_script(f"-- {uuid.uuid4().hex}\n{_ECHO}")
        try:
            assert await client.script_exists(script.sha) == [False]
            after_flush = await run_script(script, ["k"], ["x"])
            assert await client.script_exists(script.sha) == [True]
            assert await other.client_kill_filter(_id=await client.client_id()) == 1
            after_kill = await run_script(script, ["k"], ["y"])
            with pytest.raises(ResponseError, match="asked to fail"):
                await run_script(script, ["k"], ["fail"])
            after_error = await run_script(script, ["k"], ["z"])
            return after_flush, after_kill, after_error
        finally:
            await other.aclose()
            await memory.close()

    assert asyncio.run(main()) == ([b"k", b"x", 1], [b"k", b"y", 1], [b"k", b"z", 1])


def test_a_redis_that_stops_answering_fails_a_store_call_as_an_outage_within_the_reply_timeout(tmp_path):
    """A Redis that takes commands and answers none (stopped: SIGSTOP here; or behind a network that
    drops packets without a reset): a store call waited for its reply without end — a worker's
    handler, a query, a promotion stuck with it, never retried. The store's connections now wait
    REDIS_REPLY_TIMEOUT_S for a reply by default (a URL's own socket_timeout wins), then fail as
    a Redis outage does (store.errors.redis_unavailable: the writers wait it out, the query API
    answers 503), and the connection is dropped: once Redis answers again, so does the store."""
    import os
    import signal

    from ops.stack.services import Stack, free_ports
    from store.errors import redis_unavailable
    from store.memory import REDIS_REPLY_TIMEOUT_S, Memory
    from store.records import EmbedderId
    from workers.settings import Settings

    port = free_ports(1)
    stack = Stack(Settings(home=tmp_path, redis_port=port))
    stack.service_up("redis", progress=lambda message: None)
    pid = stack.redis.pid()
    assert pid is not None
    url = f"redis://127.0.0.1:{port}/0"

    async def main():
        memory = Memory.from_url(url, reply_timeout=0.5)
        try:
            await memory.claim_embedder("t", EmbedderId("e", 8), create=True)
            await memory.passages("t", ["p1"])  # (a read script: its connection stays in the pool)
            os.kill(pid, signal.SIGSTOP)
            try:
                # the connection it took, made before the stop, sends the script; its reply timed
                # out: raised, not sent again on another connection, which waited as long again
                # (the script's own call after a timeout, from a review)
                pool, taken = memory.redis.connection_pool, []
                get_connection = pool.get_connection
                pool.get_connection = lambda *a, **k: taken.append(1) or get_connection(*a, **k)  # type: ignore[method-assign]
                started = asyncio.get_running_loop().time()
                with pytest.raises(Exception) as raised:
                    await asyncio.wait_for(memory.passages("t", ["p1"]), 10)
                assert redis_unavailable(raised.value) is not None, repr(raised.value)
                assert len(taken) == 1
                # a plain command on a connection made now: its setup's replies time out alike
                with pytest.raises(Exception) as raised:
                    await asyncio.wait_for(memory.recorded_embedder("t"), 10)
                assert redis_unavailable(raised.value) is not None, repr(raised.value)
                assert asyncio.get_running_loop().time() - started < 4
            finally:
                os.kill(pid, signal.SIGCONT)
            assert (await memory.recorded_embedder("t")).dims == 8
        finally:
            await memory.close()

    try:
        asyncio.run(main())
    finally:
        stack.service_down("redis")
    assert Memory.from_url(url).redis.connection_pool.connection_kwargs["socket_timeout"] == REDIS_REPLY_TIMEOUT_S
    assert Memory.from_url(url).redis.connection_pool.connection_kwargs["socket_connect_timeout"] == 10
    given = Memory.from_url(url + "?socket_timeout=2&socket_connect_timeout=3").redis.connection_pool.connection_kwargs
    assert (given["socket_timeout"], given["socket_connect_timeout"]) == (2, 3)


def test_the_benchs_server_reading_ends_when_redis_answers_nothing():
    """`bench wait` reads the server's CPU and command counts with one INFO (store.server_stats);
    its client had no reply timeout, so a Redis that took the command and answered nothing held
    the bench without end. It now waits as the store's connections do, then raises."""
    import socket
    import threading

    import redis

    from store.server_stats import server_usage

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    taken: list[socket.socket] = []

    def accept_and_stay_silent():
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        taken.append(connection)
        connection.recv(65536)  # the command arrives; no reply is ever sent

    threading.Thread(target=accept_and_stay_silent, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            server_usage(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", reply_timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        listener.close()
        for connection in taken:
            connection.close()
