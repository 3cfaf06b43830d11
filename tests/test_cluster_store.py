"""The store on a local 3-shard Redis Cluster (`Memory.from_url("redis+cluster://…")`, store.redis
.topology.ShardRouter): each tenant's records, transactions, scripts and indexes on the shard of
its slot, every search sent there, the fields the query engine does not return there read from
the records. What it holds and answers equals the same documents on one Redis server."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from redis.crc import key_slot

from ops.stack.services import own_slots
from tests.inprocess import InProcess
from tests.test_versions import GRETA, ILSE, ILSE_EDITED, NORA_ELSEWHERE, current_memory
from workers.models.extraction import RulesExtractor

pytestmark = pytest.mark.stack

MODES = ("dense", "lexical", "hybrid", "ppr", "reconstruct")
QUESTIONS = ("Where does Ilse Marr live?", "Who founded the Salt Cellar Bakery?", "Who works for Orsk Mills?")


def _shards(url: str) -> list[redis.Redis]:
    """A client of each shard of the session's cluster (conftest's redis_cluster_url)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return [redis.Redis(host="127.0.0.1", port=port + n) for n in range(3)]


def _tenants_on_every_shard(url: str, per_shard: int = 2) -> list[str]:
    """Tenant names whose slots are served by each of the three shards, `per_shard` each."""
    owned = [own_slots(shard) for shard in _shards(url)]
    names: list[str] = []
    for slots in owned:
        names += [t for t in (f"cl{n}" for n in range(2000)) if key_slot(f"{{{t}}}".encode()) in slots][:per_shard]
    return names


async def _build(url: str, tenant: str) -> tuple[dict, dict]:
    """A tenant's memory after an edit and a deletion, and its answers in every mode."""
    stages = InProcess(url, RulesExtractor(), tenant=tenant, tau=1)
    try:
        await stages.publish("ilse", ILSE, version=1)
        await stages.publish("greta", GRETA)
        await stages.publish("nora", NORA_ELSEWHERE)
        await stages.publish("ilse", ILSE_EDITED, version=2)
        await stages.delete("nora")
        answers = {}
        for question in QUESTIONS:
            for mode in MODES:
                found = await stages.query(question, mode=mode)
                answers[(question, mode)] = [(p["id"], round(p["score"], 4)) for p in found["passages"]]
        return await current_memory(stages), answers
    finally:
        await stages.close()


def test_a_tenant_on_a_cluster_holds_and_answers_what_it_does_on_one_server(redis_cluster_url, stack_env):
    cluster = redis_cluster_url
    tenants = _tenants_on_every_shard(cluster)

    async def main():
        for tenant in tenants:
            on_cluster = await _build(cluster, tenant)
            on_one = await _build(stack_env["MEMSTREAM_REDIS_URL"], tenant + "-one")
            assert on_cluster[0] == on_one[0], tenant
            assert on_cluster[0]["facts"], tenant  # something was held
            assert on_cluster[1] == on_one[1], tenant
            assert all(on_cluster[1][(q, "dense")] for q in QUESTIONS)

    asyncio.run(main())
    # each shard holds the records of its tenants only
    for n, shard in enumerate(_shards(cluster)):
        held = {key.decode().split("{")[1].split("}")[0] for key in shard.scan_iter(match="ms:pas:{cl*", count=1000)}
        assert held == {t for t in tenants if _shard_of(cluster, t) == n}, (n, held)


def _shard_of(url: str, tenant: str) -> int:
    slot = key_slot(f"{{{tenant}}}".encode())
    return next(n for n, shard in enumerate(_shards(url)) if slot in own_slots(shard))


def test_a_purged_tenant_leaves_nothing_on_any_shard(redis_cluster_url):
    """`delete --purge` of its document and a tenant purge on a cluster: no key of the tenant, nor
    its text, on any shard (the cache entries of its texts are on another shard's slot)."""
    cluster = redis_cluster_url
    tenant = "purged-" + _tenants_on_every_shard(cluster, 1)[2]

    async def main():
        stages = InProcess(cluster, RulesExtractor(), tenant=tenant, tau=1)
        try:
            await stages.publish("wendel", "Wendel Quast founded the Brine Vault Forge. Wendel Quast lives in Osk.")
            await stages.delete("wendel", purge=True)
            purged = await stages.memory.purge_tenant(tenant, lambda passages: [], lambda *layers: [])
            assert purged["keys"] > 0
        finally:
            await stages.close()

    asyncio.run(main())
    for shard in _shards(cluster):
        left = [k for k in shard.scan_iter(count=1000) if f"{{{tenant}}}".encode() in k or b"Brine Vault" in k]
        assert left == []
        for key in shard.scan_iter(count=1000):
            if shard.type(key) == b"hash":
                assert not any(b"Brine Vault" in (v or b"") for v in shard.hvals(key)), key
    with pytest.raises(redis.ResponseError):  # a key of the tenant on a shard that does not serve it
        _shards(cluster)[(_shard_of(cluster, tenant) + 1) % 3].get(f"ms:{{{tenant}}}:x")


def test_the_applied_offsets_are_the_least_any_shard_holds(redis_cluster_url):
    """memory = f(log) on a cluster: each shard keeps the offsets whose effects it holds (a shard
    restored from an older snapshot holds older ones), and a worker rewinds to the least of them
    (workers.recovery) — one hash on one shard proved nothing of the others."""
    from store import Memory

    group = f"g-{uuid.uuid4().hex[:6]}"

    async def main():
        memory = Memory.from_url(redis_cluster_url)
        try:
            await memory.record_applied(group, "memstream.chunks", 0, 10)
            assert await memory.applied_offsets(group, "memstream.chunks", [0, 1]) == {0: 10, 1: None}
            held = [[k for k in shard.scan_iter(match=f"ms:applied:*{group}")] for shard in _shards(redis_cluster_url)]
            assert all(len(keys) == 1 for keys in held), held  # one on each shard, in its own slots
            _shards(redis_cluster_url)[1].hset(held[1][0], "memstream.chunks:0", 7)  # that shard lost 8-10
            assert await memory.applied_offsets(group, "memstream.chunks", [0]) == {0: 7}
            _shards(redis_cluster_url)[2].delete(held[2][0])  # that shard lost everything
            assert await memory.applied_offsets(group, "memstream.chunks", [0]) == {0: None}
            await memory.record_applied(group, "memstream.chunks", 0, 11)
            assert await memory.applied_offsets(group, "memstream.chunks", [0]) == {0: 11}
        finally:
            await memory.close()

    asyncio.run(main())


def _move(url: str, slot: int, target: int) -> None:
    move_slot(_shards(url), slot, target)


def move_slot(shards: list[redis.Redis], slot: int, target: int) -> None:
    """Reshard one slot to shard `target` (of `shards`, a client each) as `redis-cli --cluster
    reshard` does: IMPORTING / MIGRATING, then MIGRATE its keys until none is left (a writer
    meanwhile adds keys the first pass did not see), then SETSLOT NODE everywhere."""
    source = next(n for n, shard in enumerate(shards) if slot in own_slots(shard))
    if source == target:
        return
    ids = [s.execute_command("CLUSTER", "MYID").decode() for s in shards]
    port = shards[target].connection_pool.connection_kwargs["port"]
    shards[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
    shards[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
    while keys := shards[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        shards[source].execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
    for shard in (shards[target], shards[source], *shards):
        shard.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])


def _reshard(url: str, tenant: str) -> None:
    """Move the tenant's slot to the next shard while writers run (_move)."""
    _move(url, key_slot(f"{{{tenant}}}".encode()), (_shard_of(url, tenant) + 1) % 3)


def test_a_tenant_resharded_while_it_is_written_loses_nothing(redis_cluster_url, stack_env):
    """A live tenant's slot moves to another shard mid-ingestion: the writes that meet MOVED or
    ASK are retried as after an outage (the router reads the slot map again), and the memory
    ends equal to the same documents on one server."""
    import threading

    tenant = f"moving-{uuid.uuid4().hex[:6]}"
    documents = {
        f"d{n}": f"Person{n} Vale lives in Town{n % 3}. Person{n} Vale works for Mill{n % 2}." for n in range(8)
    }
    moved = threading.Event()

    async def ingest(url: str, name: str, reshard: bool) -> dict:
        stages = InProcess(url, RulesExtractor(), tenant=name, tau=1)
        try:
            for n, (doc_id, text) in enumerate(documents.items()):
                await stages.publish(doc_id, text, wait=False)
                if reshard and n == 3:
                    mover = threading.Thread(target=lambda: (_reshard(url, name), moved.set()))
                    mover.start()
                await stages.drain()
            if reshard:
                await asyncio.get_running_loop().run_in_executor(None, moved.wait, 60)
                await stages.drain()
            return await current_memory(stages)
        finally:
            await stages.close()

    home = _shard_of(redis_cluster_url, tenant)
    after = asyncio.run(ingest(redis_cluster_url, tenant, True))
    assert moved.is_set() and _shard_of(redis_cluster_url, tenant) == (home + 1) % 3
    assert after == asyncio.run(ingest(stack_env["MEMSTREAM_REDIS_URL"], tenant + "-one", False))
    assert len(after["facts"]) >= 8
    left = _shards(redis_cluster_url)[home].execute_command(
        "CLUSTER", "COUNTKEYSINSLOT", key_slot(f"{{{tenant}}}".encode())
    )
    assert left == 0


def test_a_large_tenant_resharded_gets_its_own_indexes_again_on_its_new_shard(redis_cluster_url):
    """A slot's keys move with it, an index does not: a promoted tenant whose slot moved found its
    state 'ready' and no index — its searches fell back to the shared ones for good. A writer's
    check now makes them again on the new shard, and its searches answer as before the move."""
    import numpy as np

    from store import Memory
    from store.indexes import OwnVectorIndex
    from tests.test_lexical_index import _chunk

    tenant = f"big-{uuid.uuid4().hex[:6]}"

    async def main():
        memory = Memory.from_url(redis_cluster_url, dims=8)
        memory.lexical_own_index_at = memory.vector_own_index_at = 50
        try:
            await memory.ensure_indexes(tenant)
            vectors = np.random.default_rng(1).normal(size=(60, 8)).astype(np.float32)
            pipe = memory.pipeline(tenant)
            for i, vector in enumerate(vectors):
                memory.stage_passage(pipe, tenant, _chunk(tenant, i, f"harbour lantern number {i}"), [], vector)
            await pipe.execute()
            await memory._promote_if_large(tenant)
            # the check ensure_indexes started may have counted the passages and be promoting too:
            # done before the move (one the move cuts fails, and the check below would start none
            # while it runs; before that failure it waited without end, CI hung 600 s)
            await asyncio.gather(*memory._promotions.values())
            assert isinstance(await memory.vector_searchable(tenant, "passages", 8), OwnVectorIndex)
            query = vectors[7] + 0.01
            dense = [h.id for h in await memory.knn(tenant, "passages", query, 5, [])]
            lexical = [h.id for h in await memory.lexical(tenant, "lantern number 7", 5)]
            assert dense[0] == "p0007" and lexical[0] == "p0007"

            await asyncio.get_running_loop().run_in_executor(None, _reshard, redis_cluster_url, tenant)
            await memory.topology.refresh()  # type: ignore[attr-defined]  # as after its first MOVED
            memory._own_vectors_read.clear()  # as after VECTOR_STATE_RECHECK_S
            memory._own_lexical_read.clear()
            memory._lexical_size_checked.clear()  # as after LEXICAL_SIZE_RECHECK_S
            await memory.ensure_indexes(tenant)  # a writer's next chunk: the new shard's shared indexes, and
            await asyncio.gather(*memory._promotions.values())  # its check for indexes of the tenant's own
            names = {n.decode() for n in await memory.shard(tenant).execute_command("FT._LIST")}
            assert memory.keys(tenant).lexical_index_name in names
            assert memory.keys(tenant).vector_index_name("passages", 8) in names
            assert isinstance(await memory.vector_searchable(tenant, "passages", 8), OwnVectorIndex)
            assert [h.id for h in await memory.knn(tenant, "passages", query, 5, [])] == dense
            assert [h.id for h in await memory.lexical(tenant, "lantern number 7", 5)] == lexical
        finally:
            await memory.close()

    asyncio.run(main())


def test_a_vector_promotion_the_tenants_slot_moves_under_fails_and_the_next_check_promotes_there(
    redis_cluster_url,
):
    """The tenant's slot moves to another shard between an own index's FT.CREATE and the end of its
    scan: the promotion asked the tenant's server — the new shard by then, which never had the
    index — for it without end, and the writer started no other promotion of the tenant while it
    ran (CI hung 600 s). Now it fails on the shard it began on (MOVED), and the writer's next check
    makes every own index on the new shard."""
    import numpy as np

    from store import Memory
    from store.indexes import OwnVectorIndex
    from tests.test_lexical_index import _chunk

    tenant = f"cut-{uuid.uuid4().hex[:6]}"

    async def main():
        memory = Memory.from_url(redis_cluster_url, dims=8)
        memory.lexical_own_index_at = memory.vector_own_index_at = 50
        created = memory._create_index

        async def created_then_moved(index) -> None:  # once: the first index made, the slot moves
            memory._create_index = created  # type: ignore[method-assign]
            await created(index)
            await asyncio.get_running_loop().run_in_executor(None, _reshard, redis_cluster_url, tenant)
            await memory.topology.refresh()  # type: ignore[attr-defined]

        try:
            await memory.ensure_indexes(tenant)
            pipe = memory.pipeline(tenant)
            for i, vector in enumerate(np.random.default_rng(2).normal(size=(60, 8)).astype(np.float32)):
                memory.stage_passage(pipe, tenant, _chunk(tenant, i, f"harbour lantern number {i}"), [], vector)
            await pipe.execute()
            await asyncio.gather(*memory._promotions.values())  # ensure_indexes's check, if it began
            await memory.drop_own_vectors(tenant)
            home = _shard_of(redis_cluster_url, tenant)
            memory._create_index = created_then_moved  # type: ignore[method-assign]
            with pytest.raises(redis.exceptions.MovedError):
                await asyncio.wait_for(memory.promote_vectors(tenant), 60)
            assert _shard_of(redis_cluster_url, tenant) == (home + 1) % 3
            memory._own_vectors_read.clear()  # as after VECTOR_STATE_RECHECK_S
            memory._lexical_size_checked.clear()  # as after LEXICAL_SIZE_RECHECK_S
            await memory.ensure_indexes(tenant)  # a writer's next chunk, and its check
            await asyncio.wait_for(asyncio.gather(*memory._promotions.values()), 60)
            names = {n.decode() for n in await memory.shard(tenant).execute_command("FT._LIST")}
            assert memory.keys(tenant).vector_index_name("passages", 8) in names
            assert isinstance(await memory.vector_searchable(tenant, "passages", 8), OwnVectorIndex)
        finally:
            await memory.close()

    asyncio.run(main())


def test_a_shard_whose_slots_change_keeps_one_reachable_index_per_layer(redis_cluster_url):
    """An index name is a key to a cluster (a name in another shard's slot answers MOVED), and an
    index does not move with its name's slot. CI failed on it: a shard that gained a slot below
    its first one got a second passages index under a new name beside its first, both indexing
    every passage of the shard, so the census (GET /v1/overview) counted each record twice. Now
    a shard's index is the one it has whose name it can still reach; one out of its reach (its
    name's slot moved away) is skipped by every read, and another is made."""
    from store import Memory
    from tests.test_query_server import PASSAGES, stage_memory
    from workers.query import drilldown

    shards = _shards(redis_cluster_url)
    first = min(own_slots(shards[1]))
    names = iter(f"slots-{uuid.uuid4().hex[:6]}-{n}" for n in range(10_000))
    on_one = [t for t in names if key_slot(f"{{{t}}}".encode()) in own_slots(shards[1])][:3]
    owners = {slot: next(k for k, s in enumerate(shards) if slot in own_slots(s)) for slot in (first - 1, first)}
    n = len(PASSAGES)
    expected = {"passages": n, "facts": n, "entities": 2 * n, "schemas": 0}

    group = f"slots-{uuid.uuid4().hex[:6]}"

    async def write_and_read(tenant: str, write: bool) -> tuple[dict, list]:
        memory = Memory.from_url(redis_cluster_url)  # a process started after the move
        try:
            if write:
                await stage_memory(memory, tenant)
            overview = await drilldown.overview(memory, tenant)
            found = [h.id for h in await memory.lexical(tenant, "Tarn Mill rye", 3)]
            return overview.layers, found
        finally:
            await memory.close()

    async def applied(record: bool) -> dict:
        memory = Memory.from_url(redis_cluster_url)
        try:
            if record:
                await memory.record_applied(group, "memstream.chunks", 0, 41)
            return await memory.applied_offsets(group, "memstream.chunks", [0])
        finally:
            await memory.close()

    assert asyncio.run(write_and_read(on_one[0], True))[0] == expected
    assert asyncio.run(applied(True)) == {0: 41}
    try:
        _move(redis_cluster_url, first - 1, 1)  # shard 1 gains a slot below its first one
        for tenant, write in ((on_one[1], True), (on_one[0], False)):
            layers, found = asyncio.run(write_and_read(tenant, write))
            assert layers == expected and found[0] == "passage-mill"
        assert asyncio.run(applied(False)) == {0: 41}  # each shard's applied offsets kept their name
        _move(redis_cluster_url, first - 1, 0)
        _move(redis_cluster_url, first, 2)  # ... then loses the slot its indexes are named in
        for tenant, write in ((on_one[2], True), (on_one[0], False), (on_one[1], False)):
            layers, found = asyncio.run(write_and_read(tenant, write))
            assert layers == expected and found[0] == "passage-mill"
    finally:
        for slot, owner in owners.items():
            _move(redis_cluster_url, slot, owner)
    for tenant in on_one:  # both of its indexes in reach again: still counted once
        layers, found = asyncio.run(write_and_read(tenant, False))
        assert layers == expected and found[0] == "passage-mill"


def test_a_shard_without_a_layers_index_lists_its_indexes_once_to_name_it(redis_cluster_url):
    """The tag of a layer's shared index on a shard that has none of that layer yet is that of
    another index the shard has (else its first slot): the shard's index names were listed twice
    for it (FT._LIST, once to look for the layer's, once more for any other's)."""
    from store import Memory

    async def listings() -> int:
        memory = Memory.from_url(redis_cluster_url)
        calls = 0
        listed = memory._index_names

        async def counted(client):
            nonlocal calls
            calls += 1
            return await listed(client)

        memory._index_names = counted  # type: ignore[method-assign]
        try:
            # no layer is ever indexed with 7 dimensions: the shard has none of it
            assert await memory.index(memory.shard("listing-probe"), "passages", create=False, dims=7) is None
            return calls
        finally:
            await memory.close()

    assert asyncio.run(listings()) == 1
