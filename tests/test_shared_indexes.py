"""Shared indexes (store.indexes): one per layer and vector size, every search filtered on the
tenant. A tenant never sees another's records or statistics, whatever their ids and texts; a
tenant written under the layout from before (indexes of its own) moves with `memstream migrate`
and answers as it did."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from store.keys import LAYERS
from store.redis.search import LEXICAL_READ_ALL
from tests.conftest import Cli
from tests.test_lexical import CORPUS, QUERIES, TOP, _chunk, _fill, _rankings

pytestmark = pytest.mark.stack

DIMS = 8
WORDS = ["dog", "cat", "lake", "biscuit", "museum", "pottery", "adoption", "camping", "sunrise", "group"]


async def _answers(memory, tenant: str, probes: list[np.ndarray], queries: list[str]) -> dict:
    """Everything a tenant's searches give: nearest records of each layer, BM25, facts by entity."""
    out = {}
    for layer, fields in (
        ("passages", ["doc_id"]),
        ("entities", ["name"]),
        ("facts", ["text", "status"]),
        ("schemas", ["relation"]),
    ):
        out[layer] = [
            [(h.id, round(h.score, 5), h.fields) for h in hits]
            for hits in await memory.knn_many(tenant, layer, probes, 10, fields)
        ]
    out["lexical"] = {q: [(h.id, h.score, h.fields) for h in await memory.lexical(tenant, q, TOP)] for q in queries}
    out["naming"] = await memory.facts_naming(tenant, "e0")
    return out


async def _write(memory, tenant: str, texts: list[str], seed: int, dims: int = DIMS) -> None:
    """Passages p0.. (doc d<i>-<tenant>), entities e0.., facts f0.. naming them, one schema: the
    same ids in every tenant, its texts and vectors its own."""
    from store.facts import Fact

    rng = np.random.default_rng(seed)
    await memory.ensure_indexes(tenant)
    pipe = memory.pipeline(tenant)
    for i, text in enumerate(texts):
        chunk = _chunk(i, "", text)
        memory.stage_passage(
            pipe,
            tenant,
            dataclasses.replace(chunk, chunk_id=f"p{i}", doc_id=f"d{i}-{tenant}"),
            [],
            rng.normal(size=dims),
        )
        memory.stage_entity(pipe, tenant, f"e{i}", f"{tenant} thing {i}", "thing", rng.normal(size=dims), f"p{i}")
        fact = Fact(
            id=f"f{i}",
            head=f"{tenant} thing 0",
            relation="likes",
            tail=f"{tenant} thing {i}",
            head_type="thing",
            tail_type="thing",
            head_id="e0",
            tail_id=f"e{i}",
            schema_id="s0",
            text=f"{tenant} fact {i}",
        )
        memory.stage_new_fact(pipe, tenant, fact, rng.normal(size=dims), passage_id=f"p{i}")
    memory.stage_schema(pipe, tenant, "s0", "thing", "likes", "thing", rng.normal(size=dims), "p0")
    await pipe.execute()


async def _settled(memory, tenants: list[str], counts: list[int], dims: int = DIMS) -> None:
    for _ in range(200):
        seen = [len((await memory.knn_many(t, "passages", [np.ones(dims)], 100, ["doc_id"]))[0]) for t in tenants]
        if seen == counts:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"indexed {seen}, expected {counts}")


@pytest.mark.parametrize("redis", ["one server", "cluster"])
def test_no_query_of_a_tenant_returns_another_tenants_records_or_moves_its_scores(redis, request):
    """Property: tenants with the same record ids and overlapping words. Every answer of the
    first tenant — nearest records of each layer, BM25 ids and scores, facts by entity — is the
    same before the others are written, with them, and after they are erased; every passage
    any tenant finds is its own. So no id, field or BM25 statistic of one reaches another — on one
    Redis and on a 3-shard cluster (conftest's redis_cluster_url: tenants on one shard or several)."""
    from store import Memory

    if redis == "cluster":
        url = request.getfixturevalue("redis_cluster_url")
    else:
        url = request.getfixturevalue("stack_env")["MEMSTREAM_REDIS_URL"]

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    @given(
        st.lists(
            st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join), min_size=1, max_size=5),
            min_size=2,
            max_size=4,
        ),
        st.randoms(use_true_random=False),
        st.booleans(),
    )
    def check(tenant_texts, rnd, promote):
        async def main():
            memory = Memory.from_url(url, dims=DIMS)
            run = uuid.uuid4().hex[:6]
            tenants = [f"iso-{run}-{n}" for n in range(len(tenant_texts))]
            probes = [np.random.default_rng(n).normal(size=DIMS) for n in range(3)]
            queries = [" ".join(rnd.sample(WORDS, 2)) for _ in range(4)]
            first = tenants[0]
            try:
                await _write(memory, first, tenant_texts[0], seed=0)
                await _settled(memory, [first], [len(tenant_texts[0])])
                alone = await _answers(memory, first, probes, queries)
                if promote:  # its own lexical index from here on (store.redis.lexical_index)
                    await memory.promote_lexical(first)
                    _same_answers(await _answers(memory, first, probes, queries), alone)
                others = list(range(1, len(tenants)))
                rnd.shuffle(others)
                for n in others:
                    await _write(memory, tenants[n], tenant_texts[n], seed=n)
                await _settled(memory, tenants, [len(t) for t in tenant_texts])
                _same_answers(await _answers(memory, first, probes, queries), alone)
                for tenant in tenants:
                    found = await _answers(memory, tenant, probes, queries)
                    assert all(h[2]["doc_id"].endswith(tenant) for hits in found["passages"] for h in hits)
                    assert all(h[2]["doc_id"].endswith(tenant) for hits in found["lexical"].values() for h in hits)
                for tenant in tenants[1:]:
                    await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
                _same_answers(await _answers(memory, first, probes, queries), alone)
            finally:
                for tenant in tenants:
                    await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
                await memory.close()

        # a promoted tenant is searched on its own index only past the whole-read size: every
        # tenant here is smaller, so the whole read is off while a promoted example runs
        with mock.patch("store.redis.search.LEXICAL_READ_ALL", 0 if promote else LEXICAL_READ_ALL):
            asyncio.run(main())

    check()


def _same_answers(found: dict, expected: dict) -> None:
    """Equal answers; BM25 scores to float precision (the query engine's sum on an own index
    and the client's differ in the last bits), ids, order and fields exactly."""
    assert {k: v for k, v in found.items() if k != "lexical"} == {k: v for k, v in expected.items() if k != "lexical"}
    assert found["lexical"].keys() == expected["lexical"].keys()
    for query, hits in expected["lexical"].items():
        assert [(h[0], h[2]) for h in found["lexical"][query]] == [(h[0], h[2]) for h in hits], query
        assert [h[1] for h in found["lexical"][query]] == pytest.approx([h[1] for h in hits], rel=1e-6), query


async def _make_legacy(memory, tenant: str, drop_terms: list[str]) -> None:
    """The tenant as written before shared indexes: its records under `ms:{tenant}:<layer>:`,
    no tenant tag or term count, `drop_terms` passages without terms (before the lexical leg),
    and an index of its own per layer with the fields of then."""
    from redis.commands.search.field import TagField, TextField, VectorField
    from redis.commands.search.index_definition import IndexDefinition, IndexType

    keys = memory.keys(tenant)
    fields = {
        "passages": [TagField("doc_id")],
        "facts": [TagField(f) for f in ("status", "category", "head_id", "tail_id")],
        "entities": [TagField("type")],
        "schemas": [TagField("status")],
    }
    for layer in LAYERS:
        vector = VectorField("vec", "FLAT", {"TYPE": "FLOAT32", "DIM": DIMS, "DISTANCE_METRIC": "COSINE"})
        extra = [TextField("lexical", no_stem=True)] if layer == "passages" else []
        await memory.redis.ft(keys.legacy_index_name(layer)).create_index(
            [*fields[layer], *extra, vector],
            definition=IndexDefinition(prefix=[keys.legacy_prefix(layer)], index_type=IndexType.HASH),
        )
        async for key in memory.redis.scan_iter(match=keys.prefix(layer) + "*"):
            old = keys.legacy_prefix(layer) + key.decode().removeprefix(keys.prefix(layer))
            await memory.redis.rename(key, old)
            await memory.redis.hdel(old, "tenant", "lexical_len")
            if layer == "passages" and old.rsplit(":", 1)[1] in drop_terms:
                await memory.redis.hdel(old, "lexical")


def test_memstream_migrate_moves_a_tenant_off_its_own_indexes(stack_env):
    """A tenant under the old layout answers nothing from the shared indexes; `memstream
    migrate` moves it (terms written for passages from before the lexical leg) and it answers
    exactly as before; a second run finds nothing to move."""
    from store import Memory

    tenant = f"legacy-{uuid.uuid4().hex[:8]}"
    probes = [np.random.default_rng(n).normal(size=DIMS) for n in range(3)]
    cli = Cli({**stack_env, "MEMSTREAM_VECTOR_INDEX": "flat"})

    async def written():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=DIMS)
        try:
            await _fill(memory, tenant)
            await _settled(memory, [tenant], [len(CORPUS)])
            before = await _rankings(memory, tenant), await _answers(memory, tenant, probes, QUERIES)
            records = {layer: await memory.records(tenant, layer) for layer in LAYERS}
            await _make_legacy(memory, tenant, drop_terms=["p00", "p08"])
            assert await _rankings(memory, tenant) == {q: [] for q in QUERIES}  # nothing on the shared index
            return before, records
        finally:
            await memory.close()

    before, records = asyncio.run(written())
    listed = cli.run("migrate", "--dry-run", "--tenant", tenant)
    assert f"1 tenant(s) on indexes of their own: {tenant}" in listed.stdout
    moved = cli.run("migrate", "--tenant", tenant)
    assert f"[1/1] {tenant}: {len(CORPUS)} passages, 0 facts, 0 entities, 0 schemas moved" in moved.stdout

    async def after():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=DIMS)
        try:
            await _settled(memory, [tenant], [len(CORPUS)])
            found = await _rankings(memory, tenant), await _answers(memory, tenant, probes, QUERIES)
            again = {layer: await memory.records(tenant, layer) for layer in LAYERS}
            names = await memory._index_names(memory.redis)
            left = await memory.legacy_tenants()
            await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
            return found, again, names, left
        finally:
            await memory.close()

    found, again, names, left = asyncio.run(after())
    assert found == before
    assert again == records
    assert not any(name.startswith(f"ms_{tenant}_") for name in names) and tenant not in left
    again = cli.run("migrate", "--tenant", tenant).stdout  # a tenant moved already: nothing to do, and said so
    assert f"nothing to move for {tenant}: on the shared indexes already, or no such tenant" in again
    assert "0 tenant(s) on indexes of their own" in again and "[1/" not in again
    # (the dry run listed an asked tenant as on indexes of its own whatever it was on: an audit)
    listed = cli.run("migrate", "--dry-run", "--tenant", tenant, "--tenant", "no-such-tenant").stdout
    assert (
        "0 tenant(s) on indexes of their own\n" in listed and f"nothing to move for {tenant}, no-such-tenant" in listed
    )


def test_bench_tenants_measures_this_tree_and_a_baseline_side_by_side(stack_env):
    """`memstream bench tenants`, small: each tree on a Redis of its own, every figure present
    and plausible (this tree's four shared indexes and the large tenant's own lexical one; the
    same tree as its own baseline); the large
    tenant, at the lexical index's size, queried on its own lexical index as a writer leaves it."""
    import json as json_

    from tests.conftest import ROOT

    out = Cli(stack_env).run(
        "bench",
        "tenants",
        "--tenants",
        "3",
        "--passages",
        "2",
        "--large",
        "1000",
        "--idle",
        "0.5",
        "--queries",
        "3",
        "--rounds",
        "2",
        "--baseline-tree",
        str(ROOT),
        "--baseline-tenants",
        "2",
        "--json",
        timeout=300,
    )
    rows = json_.loads(out.stdout)
    assert [r["tree"] for r in rows] == ["this", "baseline"] and [r["tenants"] for r in rows] == [3, 2]
    for row in rows:
        assert row["large_promoted"] == ["lexical"]  # (the vector indexes' size is 20,000)
        assert row["indexes"] == 5 and row["memory_per_tenant_kb"] > row["raw_per_tenant_kb"] > 0
        assert 0 <= row["idle_core_share"] < 1 and row["index_ms_mean"] >= 0
        assert all(
            0 < ms for key in ("small_knn_ms", "small_bm25_ms", "large_knn_ms", "large_bm25_ms") for ms in row[key]
        )
        assert row["rounds"] == 2 and len(row["small_bm25_round_p50_ms"]) == 2
    ratios = rows[0]["small_p50_ratios"]["bm25"]
    assert 0 < ratios["min"] <= ratios["median"] <= ratios["max"]


def test_memstream_migrate_reencodes_the_float32_vectors_of_the_shared_indexes_before_float16(stack_env):
    """A tenant as the version before float16 held it: float32 vectors (the embedder's own) under
    `ms:index:<layer>:<dims>` indexes of FLOAT32. This version answers nothing from it; `memstream
    migrate` re-encodes every record and drops the old indexes, and the tenant answers exactly as
    when written by this version; a second run finds nothing left."""
    from redisvl.index import AsyncSearchIndex
    from redisvl.schema import IndexSchema

    from store import Memory
    from store.indexes import layer_schema
    from store.keys import float32_index_name, shared_index_name

    dims, tenant = 12, f"f32-{uuid.uuid4().hex[:8]}"  # a size no other test writes: these indexes are this test's
    texts = ["dog biscuit lake", "museum pottery", "camping sunrise group", "cat adoption"]
    probes = [np.random.default_rng(n).normal(size=dims) for n in range(3)]
    cli = Cli({**stack_env, "MEMSTREAM_VECTOR_INDEX": "flat"})

    async def written():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=dims)
        try:
            await _write(memory, tenant, texts, seed=7, dims=dims)
            await _settled(memory, [tenant], [len(texts)], dims)
            before = await _answers(memory, tenant, probes, ["dog lake", "pottery"])
            # as the version before wrote it: _write's vectors, drawn again, as float32
            rng, keys = np.random.default_rng(7), memory.keys(tenant)
            for i in range(len(texts)):
                for key in (keys.passage(f"p{i}"), keys.entity(f"e{i}"), keys.fact(f"f{i}")):
                    await memory.redis.hset(key, "vec", rng.normal(size=dims).astype(np.float32).tobytes())
            await memory.redis.hset(keys.schema("s0"), "vec", rng.normal(size=dims).astype(np.float32).tobytes())
            for layer in LAYERS:
                await memory.redis.execute_command("FT.DROPINDEX", shared_index_name(layer, dims))
                old = layer_schema(layer, dims).to_dict()
                old["index"]["name"] = float32_index_name(layer, dims)
                next(f for f in old["fields"] if f["name"] == "vec")["attrs"]["datatype"] = "float32"
                await AsyncSearchIndex(IndexSchema.from_dict(old), redis_client=memory.redis).create(overwrite=False)
            await asyncio.sleep(0.2)
            fresh = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=dims)
            try:
                assert (await fresh.knn_many(tenant, "passages", probes, 10, ["doc_id"])) == [
                    [],
                    [],
                    [],
                ]  # no float16 index
            finally:
                await fresh.close()
            return before
        finally:
            await memory.close()

    before = asyncio.run(written())
    listed = cli.run("migrate", "--dry-run")
    assert all(float32_index_name(layer, dims) in listed.stdout for layer in LAYERS)
    migrated = cli.run("migrate", timeout=600)
    assert (
        f"{float32_index_name('passages', dims)}: " in migrated.stdout
        and "re-encoded as float16, index dropped" in migrated.stdout
    )

    async def after():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=dims)
        try:
            await _settled(memory, [tenant], [len(texts)], dims)
            found = await _answers(memory, tenant, probes, ["dog lake", "pottery"])
            names = await memory._index_names(memory.redis)
            await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
            return found, names
        finally:
            await memory.close()

    found, names = asyncio.run(after())
    assert found == before
    assert not any(float32_index_name(layer, dims) == name for layer in LAYERS for name in names)
    assert "0 shared index(es) of float32 vectors" in cli.run("migrate", "--dry-run").stdout
