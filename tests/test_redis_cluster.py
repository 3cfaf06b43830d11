"""A local Redis Cluster (`memstream stack up --redis-cluster 3`, ops/stack/services.py) and what the store
does on one today: it refuses it with a clear error, where it ran on the first shard and failed
(MOVED) or read another shard's tenants as empty. The engine's behaviour a cluster store rests
on is pinned here too: with no coordinator in the query engine shipped here, an index is a key
on one shard and sees that shard's records only, so each shard needs an index of its own (named
with a hash tag the shard owns) and a tenant's searches go to its slot's shard — also after the
slot moves (docs/operations.md, "Redis Cluster")."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest
import redis
from redis.cluster import RedisCluster
from redis.commands.search.query import Query
from redis.crc import key_slot

from ops.stack.services import CLUSTER_SLOTS, Stack, cluster_info, free_ports, own_slots
from store.errors import redis_unavailable
from store.keys import llm_cache_key
from store.redis.topology import REFRESH_MIN_INTERVAL_S, ShardRouter, tenant_slot
from tests.conftest import MEMSTREAM, ROOT
from tests.test_cluster_store import move_slot
from workers.settings import Settings

pytestmark = pytest.mark.stack


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(MEMSTREAM + list(args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.fixture
def cluster_env(tmp_path):
    port = free_ports(6)  # three shards, then their cluster buses
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_HOME": str(tmp_path / "stack"),
        "MEMSTREAM_REDIS_PORT": str(port),
    }
    try:
        yield env
    finally:
        Stack(Settings(home=tmp_path / "stack", redis_port=port)).service_down("redis")


def _shards(env: dict) -> list[redis.Redis]:
    port = int(env["MEMSTREAM_REDIS_PORT"])
    return [redis.Redis(host="127.0.0.1", port=port + n) for n in range(3)]


def _redis_up(env: dict, *flags: str) -> subprocess.CompletedProcess:
    """`stack up`'s Redis part: the Kafka part is the three-broker tests' (tests/test_brokers.py)."""
    code = (
        "import sys, dataclasses; from ops.cli import main; import ops.stack.services as s; "
        "s.Stack._kafka_up = lambda self, progress: None; sys.exit(main(sys.argv[1:]))"
    )
    import sys

    return subprocess.run(
        [sys.executable, "-c", code, "stack", "up", *flags],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_stack_up_with_a_redis_cluster_forms_one_that_keeps_its_shape_and_keys_across_a_restart(cluster_env):
    up = _redis_up(cluster_env, "--redis-cluster", "3")
    assert up.returncode == 0, up.stderr
    shards = _shards(cluster_env)
    assert all(cluster_info(s)["cluster_state"] == "ok" for s in shards), up.stderr
    owned = [own_slots(s) for s in shards]
    assert sorted(len(o) for o in owned) == [5461, 5461, 5462]
    assert set().union(*owned) == set(range(CLUSTER_SLOTS))
    status = _run(cluster_env, "stack", "status").stdout
    assert all(f"{name}: running" in status for name in ("redis", "redis-2", "redis-3")), status

    client = RedisCluster(host="127.0.0.1", port=int(cluster_env["MEMSTREAM_REDIS_PORT"]))
    tenants = [f"t{n}" for n in range(30)]
    for tenant in tenants:
        client.set(f"ms:{{{tenant}}}:probe", tenant)
    assert all(s.dbsize() > 0 for s in shards), "30 tenants' keys did not reach every shard"
    client.close()

    assert _run(cluster_env, "stack", "down").returncode == 0
    up = _redis_up(cluster_env)  # no flag: the stack's shards are its folders, as its brokers are
    assert up.returncode == 0, up.stderr
    assert [own_slots(s) for s in _shards(cluster_env)] == owned
    client = RedisCluster(host="127.0.0.1", port=int(cluster_env["MEMSTREAM_REDIS_PORT"]))
    assert [client.get(f"ms:{{{t}}}:probe") for t in tenants] == [t.encode() for t in tenants]
    client.close()


def test_a_stack_redis_made_alone_is_not_turned_into_a_shard(cluster_env):
    assert _redis_up(cluster_env).returncode == 0
    _run(cluster_env, "stack", "down")
    up = _redis_up(cluster_env, "--redis-cluster", "3")
    assert up.returncode == 1
    assert "was made as a Redis of its own, not a cluster shard" in up.stderr, up.stderr


def test_the_store_refuses_a_cluster_node_with_what_to_do(cluster_env):
    assert _redis_up(cluster_env, "--redis-cluster", "3").returncode == 0
    env = {**cluster_env, "MEMSTREAM_REDIS_URL": f"redis://127.0.0.1:{cluster_env['MEMSTREAM_REDIS_PORT']}/0"}
    for tenant in ("a", "b", "c"):  # on any shard: the error says what is wrong, not MOVED or nothing
        export = _run(env, "export", "--tenant", tenant)
        assert export.returncode != 0, export.stdout
        assert "is a Redis Cluster node" in export.stderr and "MEMSTREAM_REDIS_URL" in export.stderr, export.stderr
        assert "Traceback" not in export.stderr, export.stderr


def test_an_index_a_shard_sees_that_shards_tenants_also_after_their_slot_moves(cluster_env):
    """The premise of a cluster store: an index per shard (its name's hash tag in the shard's slots)
    over the shared prefix finds exactly the records of the tenants whose slots the shard serves —
    and a tenant whose slot is migrated is found by the new shard's index, no longer the old's."""
    assert _redis_up(cluster_env, "--redis-cluster", "3").returncode == 0
    shards = _shards(cluster_env)
    owned = [own_slots(s) for s in shards]
    tags = [next(f"s{n}" for n in range(1000) if key_slot(f"{{s{n}}}".encode()) in slots) for slots in owned]
    for shard, tag in zip(shards, tags):
        shard.execute_command(
            "FT.CREATE",
            f"ms:index:{{{tag}}}",
            "ON",
            "HASH",
            "PREFIX",
            "1",
            "ms:pas:",
            "SCHEMA",
            "tenant",
            "TAG",
            "text",
            "TEXT",
        )
    client = RedisCluster(host="127.0.0.1", port=int(cluster_env["MEMSTREAM_REDIS_PORT"]))
    tenants = [f"t{n}" for n in range(20)]
    for tenant in tenants:
        for n in range(3):
            client.hset(f"ms:pas:{{{tenant}}}:{n}", mapping={"tenant": tenant, "text": f"lighthouse keeper {n}"})

    def found(shard: int, tenant: str) -> int:
        query = Query(f"@tenant:{{{tenant}}}").paging(0, 0)
        return shards[shard].ft(f"ms:index:{{{tags[shard]}}}").search(query).total

    def home(tenant: str) -> int:
        return next(n for n, slots in enumerate(owned) if key_slot(f"{{{tenant}}}".encode()) in slots)

    for tenant in tenants:
        assert [found(n, tenant) for n in range(3)] == [3 if n == home(tenant) else 0 for n in range(3)], tenant

    # A tenant's read script (the walk's _SEARCH_READ: its one key in the tenant's slot) may run
    # FT.SEARCH on its shard's index only when the script declares cross-slot access: the index
    # name is a key of another slot, on the same shard.
    tenant = tenants[0]
    search = "return redis.call('FT.SEARCH', ARGV[1], '@tenant:{' .. ARGV[2] .. '}', 'NOCONTENT')"
    index, shard = f"ms:index:{{{tags[home(tenant)]}}}", shards[home(tenant)]
    with pytest.raises(redis.ResponseError, match="do not hash to the same slot"):
        shard.eval("#!lua flags=no-writes\n" + search, 1, f"ms:{{{tenant}}}:route", index, tenant)
    reply = shard.eval(
        "#!lua flags=no-writes,allow-cross-slot-keys\n" + search, 1, f"ms:{{{tenant}}}:route", index, tenant
    )
    assert reply[0] == 3, reply

    moved = tenants[0]
    source = home(moved)
    target = (source + 1) % 3
    move_slot(_shards(cluster_env), key_slot(f"{{{moved}}}".encode()), target)
    assert [found(n, moved) for n in range(3)] == [3 if n == target else 0 for n in range(3)]
    client.close()


def test_the_shard_router_sends_a_tenants_commands_to_its_slots_shard_and_follows_a_reshard(cluster_env):
    """store.redis.topology.ShardRouter: each tenant's keys (one hash tag: one slot) reach the
    shard serving that slot, one command or a transaction, with no MOVED; after the slot is
    resharded, the old owner's MOVED fails one command as an outage would (redis_unavailable)
    and the next reaches the new owner, where the tenant's keys now are."""
    assert _redis_up(cluster_env, "--redis-cluster", "3").returncode == 0
    port = int(cluster_env["MEMSTREAM_REDIS_PORT"])
    asyncio.run(_route_and_reshard(cluster_env, port))


async def _route_and_reshard(env: dict, port: int) -> None:
    router = ShardRouter.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        tenants = [f"t{n}" for n in range(30)]
        assert len({router.node_of(t) for t in tenants}) == 3  # thirty tenants land on every shard
        for tenant in tenants:
            pipe = router.for_tenant(tenant).pipeline(transaction=True)
            pipe.hset(f"ms:{{{tenant}}}:doc:a", "v", tenant).sadd(f"ms:{{{tenant}}}:docs", "a")
            await pipe.execute()
        assert await router.for_key(llm_cache_key("m", "0" * 64)).set(llm_cache_key("m", "0" * 64), b"x")
        for tenant in tenants:
            client = router.for_tenant(tenant)
            assert await client.hget(f"ms:{{{tenant}}}:doc:a", "v") == tenant.encode()
            assert client is router.for_key(f"ms:pas:{{{tenant}}}:p1")
        assert len(router.servers()) == 3

        tenant = tenants[0]
        before = router.node_of(tenant)
        source = [("127.0.0.1", port + n) for n in range(3)].index(before)
        target = (source + 1) % 3
        move_slot(_shards(env), tenant_slot(tenant), target)
        with pytest.raises(redis.ResponseError) as moved:
            await router.for_tenant(tenant).hget(f"ms:{{{tenant}}}:doc:a", "v")
        assert redis_unavailable(moved.value) is moved.value  # the envelope waits it out and retries
        assert router.node_of(tenant) == ("127.0.0.1", port + target)
        assert await router.for_tenant(tenant).hget(f"ms:{{{tenant}}}:doc:a", "v") == tenant.encode()
        pipe = router.for_tenant(tenant).pipeline(transaction=True)
        await pipe.hset(f"ms:{{{tenant}}}:doc:b", "v", "after").smembers(f"ms:{{{tenant}}}:docs").execute()

        # a transaction sent to the old owner (a map not refreshed yet) fails whole, and reroutes
        move_slot(_shards(env), tenant_slot(tenant), source)
        pipe = router.for_tenant(tenant).pipeline(transaction=True)
        pipe.hset(f"ms:{{{tenant}}}:doc:c", "v", "lost?").sadd(f"ms:{{{tenant}}}:docs", "c")
        with pytest.raises(redis.RedisError) as aborted:
            await pipe.execute()
        assert redis_unavailable(aborted.value) is not None, repr(aborted.value)
        await asyncio.sleep(REFRESH_MIN_INTERVAL_S)
        await router.refresh()
        assert router.node_of(tenant) == before
        client = router.for_tenant(tenant)
        assert await client.hget(f"ms:{{{tenant}}}:doc:c", "v") is None  # nothing of it was written
        assert await client.smembers(f"ms:{{{tenant}}}:docs") == {b"a"}
        assert await client.hget(f"ms:{{{tenant}}}:doc:b", "v") == b"after"
    finally:
        await router.close()


def test_a_cluster_does_not_grow_under_its_shards(cluster_env):
    """More shards on a formed cluster would move every shard's bus port (port + shards): refused."""
    assert _redis_up(cluster_env, "--redis-cluster", "2").returncode == 0
    _run(cluster_env, "stack", "down")
    up = _redis_up(cluster_env, "--redis-cluster", "3")
    assert up.returncode == 1
    assert "has 2 shards, not 3" in up.stderr, up.stderr


def test_stack_help_says_the_store_runs_on_a_cluster(capsys):
    """Before: `memstream stack --help` said of --redis-cluster "the store does not run on a
    cluster yet", while README and docs/operations.md (and this file's tests) say it does."""
    from ops.cli import main

    with pytest.raises(SystemExit):
        main(["stack", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "does not run on a cluster" not in shown
    assert "the store runs on it, each tenant on its slot's shard" in shown
