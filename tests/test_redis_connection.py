"""store.redis.connection: commands packed by hiredis are the bytes redis-py's own asyncio packing
sends, for every kind of argument the store passes; what redis-py refuses is refused."""

from __future__ import annotations

import asyncio

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
