"""A large tenant's lexical index of its own (store.redis.lexical_index): the same per-tenant BM25
as the shared path scores in the client — ranks equal, scores to float precision — answered in
Redis; promotion online, idempotent and resumable after SIGKILL; erasure and purge leave nothing.

The corpus is HotpotQA-100's passages (read by path from ../shared/data), its questions the queries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import store.redis.lexical_index as lexical_index
from ops.bench.datasets import load_dataset
from store.records import Erasure
from store.redis.lexical_index import LEXICAL_READER_DRIFT
from store.redis.search import LEXICAL_READ_ALL
from tests.shared_data import SHARED_DATA, needs_shared
from topics.records import Chunk

pytestmark = pytest.mark.stack
hotpotqa = needs_shared("hotpotqa_train_100")  # the tests that read _corpus()
PASSAGES = 240  # past LEXICAL_READ_ALL: the shared path scores candidates in the client
TOP = 10


def _corpus() -> tuple[list[str], list[str]]:
    dataset = load_dataset("hotpotqa", SHARED_DATA)
    return dataset.passages[:PASSAGES], [q.text for q in dataset.questions[:40]]


def _chunk(tenant: str, i: int, text: str) -> Chunk:
    return Chunk(
        tenant=tenant,
        chunk_id=f"p{i:04d}",
        doc_id=f"d{i:04d}",
        seq=0,
        n_chunks=1,
        text=text,
        doc_version=1,
        doc_hash=f"h{i}",
        metadata={},
    )


async def _write(memory, tenant: str, texts: list[str], start: int = 0) -> None:
    await memory.ensure_indexes(tenant)
    rng = np.random.default_rng(start)
    pipe = memory.pipeline(tenant)
    for i, text in enumerate(texts, start):
        memory.stage_passage(pipe, tenant, _chunk(tenant, i, text), [], rng.normal(size=memory.dims))
    await pipe.execute()


def _with_a_twin(stack_env):
    """(memory, twin, tenant, twin tenant): a second client and tenant for the same writes, never
    promoted — its rankings are the shared path's, the tenant's exact BM25."""
    return _memory(stack_env), _memory(stack_env), f"own-{uuid.uuid4().hex[:8]}", f"own-{uuid.uuid4().hex[:8]}"


async def _purge_and_close_one(memory, tenant: str) -> None:
    """The tenant purged (its own indexes, copies and keys), the client closed."""
    await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
    await memory.close()


async def _purge_and_close(memory, tenant: str, twin, exact: str) -> None:
    """Both tenants purged (_with_a_twin's), both clients closed."""
    await _purge_and_close_one(memory, tenant)
    await _purge_and_close_one(twin, exact)


async def _copies(memory, tenant: str, generation: int) -> int:
    """How many copies the tenant's lexical index generation has."""
    match = memory.keys(tenant).lexical_mirror_prefix(generation) + "*"
    return len([k async for k in memory.redis.scan_iter(match=match, count=1000)])


async def _retire_and_erase(memory, tenant: str) -> None:
    """Passages out of memory, as versions and erasures leave them: retired (p0003, p0007) and
    erased (p0011). Both still count in the tenant's passages, as on the shared path."""
    pipe = memory.pipeline(tenant)
    memory.stage_retire_passage(pipe, tenant, "p0003")
    memory.stage_retire_passage(pipe, tenant, "p0007")
    memory.stage_erase(pipe, tenant, Erasure("d0011", ("p0011",), (), (), (), (), ()))
    await pipe.execute()


async def _rankings(memory, tenant: str, queries: list[str]) -> dict[str, list[tuple[str, float, str]]]:
    return {q: [(h.id, h.score, h.fields["doc_id"]) for h in await memory.lexical(tenant, q, TOP)] for q in queries}


def _same(before: dict, after: dict) -> None:
    for query, ranked in before.items():
        assert [pid for pid, _, _ in after[query]] == [pid for pid, _, _ in ranked], query
        assert [doc for _, _, doc in after[query]] == [doc for _, _, doc in ranked], query
        for (_, a, _), (_, b, _) in zip(after[query], ranked):
            assert a == pytest.approx(b, rel=1e-6), query


def _shared_path_forbidden(memory) -> None:
    """Past this, a search that moved candidates' terms to the client fails the test."""

    async def forbidden(*args, **kwargs):
        raise AssertionError("scored in the client: the tenant's own index was not used")

    memory._lexical_candidates = forbidden


def _record_commands(memory) -> list[tuple]:
    """Every command the memory's client sends from now on, as its arguments (a test's spy)."""
    sent: list[tuple] = []
    send = memory.redis.execute_command

    async def recording(*args, **kwargs):
        sent.append(args)
        return await send(*args, **kwargs)

    memory.redis.execute_command = recording
    return sent


def _memory(stack_env, **kwargs):
    from store import Memory

    return Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=8, **kwargs)


@hotpotqa
def test_a_tenant_promoted_to_its_own_index_ranks_as_before_and_follows_its_writes(stack_env):
    texts, queries = _corpus()
    assert len(texts) > LEXICAL_READ_ALL

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        try:
            await _write(memory, tenant, texts)
            await _retire_and_erase(memory, tenant)
            before = await _rankings(memory, tenant, queries)
            assert await memory.promote_lexical(tenant) == len(texts)
            assert await memory.promote_lexical(tenant) == len(texts)  # again: idempotent
            info = await memory.redis.ft(memory.keys(tenant).lexical_index_name).info()
            assert int(info["num_docs"]) == len(texts)  # one document a passage, retired and erased ones too
            _shared_path_forbidden(memory)
            after = await _rankings(memory, tenant, queries)
            _same(before, after)
            assert all("p0003" not in [pid for pid, _, _ in hits] for hits in after.values())
            # writes after the promotion reach the own index: a new passage, a retirement, a return
            await _write(memory, tenant, ["Zyxquorp the unmistakable lighthouse keeper of Brannoc"], start=9000)
            assert [h.id for h in await memory.lexical(tenant, "Zyxquorp lighthouse", 1)] == ["p9000"]
            pipe = memory.pipeline(tenant)
            memory.stage_retire_passage(pipe, tenant, "p9000")
            await pipe.execute()
            assert "p9000" not in [h.id for h in await memory.lexical(tenant, "Zyxquorp", 5)]
            pipe = memory.pipeline(tenant)
            memory.stage_restore_passage(pipe, tenant, "p9000", 2)
            await pipe.execute()
            assert [h.id for h in await memory.lexical(tenant, "Zyxquorp", 5)] == ["p9000"]
        finally:
            await _purge_and_close_one(memory, tenant)
        # the same memory written without a promotion ranks as the promoted one did
        fresh = _memory(stack_env)
        again = f"own-{uuid.uuid4().hex[:8]}"
        try:
            await _write(fresh, again, texts)
            await _retire_and_erase(fresh, again)
            await _write(fresh, again, ["Zyxquorp the unmistakable lighthouse keeper of Brannoc"], start=9000)
            shared = await _rankings(fresh, again, queries)
            await fresh.promote_lexical(again)
            _shared_path_forbidden(fresh)
            _same(shared, await _rankings(fresh, again, queries))
        finally:
            await _purge_and_close_one(fresh, again)

    asyncio.run(main())


@hotpotqa
def test_a_writer_promotes_a_tenant_that_crosses_the_size_in_the_background(stack_env):
    """ensure_indexes (every chunk's write) counts the tenant once per LEXICAL_SIZE_RECHECK_S;
    past lexical_own_index_at it promotes it without holding the write up."""
    texts, queries = _corpus()

    async def main():
        memory = _memory(stack_env)
        memory.lexical_own_index_at = 200
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        state = memory.keys(tenant).lexical_index_state
        try:
            await _write(memory, tenant, texts[:150])
            assert await memory.redis.hget(state, "state") is None  # below the size: shared indexes only
            await _write(memory, tenant, texts[150:], start=150)
            memory._lexical_size_checked.clear()  # (as LEXICAL_SIZE_RECHECK_S later)
            await memory.ensure_indexes(tenant)  # the next chunk's write
            before = await _rankings(memory, tenant, queries[:10])
            for _ in range(200):
                if await memory.redis.hget(state, "state") == b"ready":
                    break
                await asyncio.sleep(0.05)
            assert await memory.redis.hget(state, "state") == b"ready"
            _shared_path_forbidden(memory)
            _same(before, await _rankings(memory, tenant, queries[:10]))
        finally:
            await _purge_and_close_one(memory, tenant)

    asyncio.run(main())


@hotpotqa
def test_two_writers_promoting_a_tenant_at_once_leave_one_whole_index(stack_env):
    """Every extractor counts a tenant in its background check; two whose checks come together
    when it crosses the size each promoted it, and each promotion begins by emptying its prefix:
    one deleted the copies the other had written into the index — an index short of copies,
    drifted, that readers searched. One process promotes at a time now (the tenant's lease):
    the index holds every passage once and ranks as the shared path does."""
    texts, queries = _corpus()
    texts, queries = texts[:300], queries[:10]

    async def main():
        first, second = _memory(stack_env), _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        keys = first.keys(tenant)
        try:
            await _write(first, tenant, texts)
            expected = await _rankings(first, tenant, queries)
            for memory in (first, second):
                memory.lexical_own_index_at = 200
            emptied = second._delete_matching

            async def emptied_once_the_first_copied(client, pattern):
                # the second found no index, then (a slower process) empties the prefix only once
                # the first is copying into the one it created (or, the lease the second's, after 2 s)
                for _ in range(200):
                    if [k async for k in client.scan_iter(match=keys.lexical_mirror_prefix() + "*", count=1000)]:
                        break
                    await asyncio.sleep(0.01)
                return await emptied(client, pattern)

            second._delete_matching = emptied_once_the_first_copied
            # both checks at once, as two extractors' (each process runs one a tenant at a time)
            await asyncio.gather(first._promote_if_large(tenant), second._promote_if_large(tenant))
            if await first.redis.hget(keys.lexical_index_state, "state") != b"ready":  # the one that waited
                await second._promote_if_large(tenant)
            info = await first.redis.ft(keys.lexical_index_name).info()
            assert int(info["num_docs"]) == int(info["max_doc_id"]) == len(texts)
            assert not await first.redis.exists(keys.lexical_rebuild_lease)
            _shared_path_forbidden(first)
            _same(expected, await _rankings(first, tenant, queries))
        finally:
            await _purge_and_close_one(first, tenant)
            await second.close()

    asyncio.run(main())


async def _retire(memory, tenant: str, passage_ids: list[str]) -> None:
    pipe = memory.pipeline(tenant)
    for pid in passage_ids:
        memory.stage_retire_passage(pipe, tenant, pid)
    await pipe.execute()


@hotpotqa
def test_an_own_index_whose_copies_were_replaced_is_built_again_to_the_exact_bm25(stack_env):
    """This RediSearch keeps a replaced document's length in its BM25 average, and its terms'
    document frequency until its GC runs: after edits (each retirement replaces a copy) the own
    index scored away from the tenant's BM25. A writer's check builds it again beside the
    searched one and moves the name to it; the searches stay on the own index, exact again, and
    follow later writes; a purge leaves no index of any generation."""
    texts, queries = _corpus()
    edited = [f"p{i:04d}" for i in range(0, 40, 2)]  # 20 of 240 copies replaced: past LEXICAL_REBUILD_DRIFT

    async def main():
        memory, twin, tenant, exact = _with_a_twin(stack_env)
        keys = memory.keys(tenant)
        try:
            for store, name in ((memory, tenant), (twin, exact)):
                await _write(store, name, texts)
                await _retire(store, name, edited)
            await memory.promote_lexical(tenant)
            await _retire(memory, tenant, ["p0041"])
            await _retire(twin, exact, ["p0041"])  # replaced after the promotion
            pipe = memory.pipeline(tenant)
            for pid in edited:  # back, and retired again: each one's copy replaced twice more
                memory.stage_restore_passage(pipe, tenant, pid, 2)
            await pipe.execute()
            await _retire(memory, tenant, edited)
            expected = await _rankings(twin, exact, queries)  # scored in the client: the tenant's BM25
            assert await memory.lexical_drift(tenant) > 0.1

            memory._lexical_size_checked.clear()  # (as LEXICAL_SIZE_RECHECK_S later)
            await memory.ensure_indexes(tenant)  # a writer's check: rebuilt in the background
            _shared_path_forbidden(memory)
            for _ in range(400):
                if await memory.redis.hget(keys.lexical_index_state, "gen") == b"1":
                    break
                await asyncio.sleep(0.05)
            assert await memory.lexical_drift(tenant) == 0.0
            _same(expected, await _rankings(memory, tenant, queries))

            # later writes reach the new generation; a second rebuild moves the alias on
            await _retire(memory, tenant, ["p0043"])
            await _retire(twin, exact, ["p0043"])
            assert await memory.rebuild_lexical(tenant) == len(texts)
            assert await memory.redis.hget(keys.lexical_index_state, "gen") == b"2"
            _same(await _rankings(twin, exact, queries), await _rankings(memory, tenant, queries))
            # the older generations' copies gone
            assert [await _copies(memory, tenant, generation) for generation in (0, 1, 2)] == [0, 0, len(texts)]
        finally:
            await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
            await twin.purge_tenant(exact, lambda p: [], lambda *a: [])
        left = [k async for k in memory.redis.scan_iter(match=f"*{{{tenant}}}*", count=1000)]
        names = [n.decode() for n in await memory.redis.execute_command("FT._LIST")]
        await memory.close()
        await twin.close()
        assert left == []
        assert [n for n in names if tenant in n] == []

    asyncio.run(main())


@hotpotqa
def test_an_own_index_keeps_no_term_positions_and_one_made_with_them_still_answers(stack_env, monkeypatch):
    """BM25 reads a term's documents and frequencies, never its positions: an own index is made
    without them (OWN_LEXICAL_OPTIONS: 40% less inverted index, a little faster). One made with
    them — by a release before this — ranks the same, and is not built again for that alone
    (a rebuild copies every passage; its drift decides)."""
    texts, queries = _corpus()

    async def options(memory, tenant: str) -> set[str]:
        info = await memory.redis.ft(memory.keys(tenant).lexical_index_name).info()
        return {o.decode() if isinstance(o, bytes) else o for o in info["index_options"]}

    async def main():
        memory, twin, tenant, exact = _with_a_twin(stack_env)
        try:
            await _write(memory, tenant, texts)
            await _write(twin, exact, texts)
            expected = await _rankings(twin, exact, queries)  # scored in the client: the tenant's BM25

            await twin.promote_lexical(exact)
            assert {"NOOFFSETS", "NOFIELDS", "NOHL"} <= await options(twin, exact)
            _shared_path_forbidden(twin)
            _same(expected, await _rankings(twin, exact, queries))

            with monkeypatch.context() as patched:  # the index as a release before this made it
                patched.setattr(lexical_index, "OWN_LEXICAL_OPTIONS", (), raising=False)
                await memory.promote_lexical(tenant)
            assert "NOOFFSETS" not in await options(memory, tenant)
            _shared_path_forbidden(memory)
            _same(expected, await _rankings(memory, tenant, queries))
            assert tenant not in await memory.own_lexical_upkeep()  # exact: nothing to build again
        finally:
            await _purge_and_close(memory, tenant, twin, exact)

    asyncio.run(main())


@hotpotqa
def test_an_own_index_a_restart_on_the_aof_indexed_twice_is_built_again_and_the_next_restart_leaves_it_whole(
    tmp_path, monkeypatch
):
    """A Redis restarted on its AOF (SIGTERM: flushed) whose log holds an own index's FT.CREATE,
    made with the scan FT.CREATE starts, and then its copies scans them once loading ends, after
    the replay indexed them: every copy twice — max_doc_id twice num_docs; seen at 240 copies
    here and at 50,000 (BM25's average length doubled for good; the top five of 85 of 100
    questions changed) — with no write following. Readers pass such an index over (the shared path
    is exact) where they searched it and ranked away from the tenant's BM25; the extractors'
    upkeep, which needs no write of the tenant, builds it again, without that scan: the next
    restart, replaying that FT.CREATE, brings it back whole and its readers stay on it (the
    rebuilt one was indexed twice again, a cycle only a rewrite of the AOF broke), and so does
    one after the log's rewrite (the index loaded with the snapshot)."""
    from redis.commands.search.commands import AsyncSearchCommands

    from tests.test_rebuild_from_log import OwnRedis

    texts, queries = _corpus()
    queries = queries[:12]
    redis = OwnRedis(tmp_path / "own-redis")
    env = {"MEMSTREAM_REDIS_URL": redis.url}
    tenant = f"own-{uuid.uuid4().hex[:8]}"

    def restart() -> None:
        redis.stack.service_down("redis")
        redis.stack.service_up("redis", lambda m: None)

    async def made_with_a_scan() -> dict:  # as the release before this made it
        create = AsyncSearchCommands.create_index
        with monkeypatch.context() as patched:
            patched.setattr(
                AsyncSearchCommands,
                "create_index",
                lambda self, *a, **kw: create(self, *a, **{**kw, "skip_initial_scan": False}),
            )
            memory = _memory(env)
            await _write(memory, tenant, texts)
            expected = await _rankings(memory, tenant, queries)  # the shared path: the tenant's BM25
            await memory.promote_lexical(tenant)
        assert await memory.lexical_drift(tenant) == 0.0
        await memory.close()
        return expected

    async def indexed_twice_then_built_again(expected: dict) -> None:
        memory, reader = _memory(env), _memory(env)
        keys = memory.keys(tenant)
        await memory._initial_scan_done(memory.redis, keys.lexical_index_name)  # Redis indexes it again
        if await memory.lexical_drift(tenant) <= LEXICAL_READER_DRIFT:  # (a Redis that no longer does)
            await memory.close()
            await reader.close()
            return False
        _same(expected, await _rankings(reader, tenant, queries))
        assert not await reader.own_lexical_ready(tenant)

        assert tenant in await memory.own_lexical_upkeep()
        assert await memory.lexical_drift(tenant) == 0.0
        assert await memory.redis.hget(keys.lexical_index_state, "gen") == b"1"
        assert not await memory.redis.exists(keys.lexical_rebuild_lease)
        assert tenant not in await memory.own_lexical_upkeep()  # whole: nothing to do
        reader._own_lexical_read.clear()  # (as LEXICAL_STATE_RECHECK_S later)
        _shared_path_forbidden(reader)
        _same(expected, await _rankings(reader, tenant, queries))
        await memory.close()
        await reader.close()
        return True

    async def whole_after_a_restart(expected: dict, generation: bytes, rewrite_the_log: bool) -> None:
        memory, reader = _memory(env), _memory(env)
        keys = memory.keys(tenant)
        await memory._initial_scan_done(memory.redis, keys.lexical_index_name)
        assert await memory.lexical_drift(tenant) == 0.0
        assert await memory.redis.hget(keys.lexical_index_state, "gen") == generation
        assert await reader.own_lexical_ready(tenant)
        _shared_path_forbidden(reader)
        _same(expected, await _rankings(reader, tenant, queries))
        assert tenant not in await memory.own_lexical_upkeep()
        if rewrite_the_log:  # the index's FT.CREATE and copies into the AOF's snapshot (its preamble)
            await memory.redis.bgrewriteaof()
            while (await memory.redis.info("persistence"))["aof_rewrite_in_progress"]:
                await asyncio.sleep(0.1)
        await memory.close()
        await reader.close()

    try:
        expected = asyncio.run(made_with_a_scan())
        restart()
        rebuilt = asyncio.run(indexed_twice_then_built_again(expected))
        generation = b"1" if rebuilt else b"0"
        restart()  # the rebuilt index's FT.CREATE replayed from the log's tail
        asyncio.run(whole_after_a_restart(expected, generation, rewrite_the_log=True))
        restart()  # ... and loaded from its snapshot
        asyncio.run(whole_after_a_restart(expected, generation, rewrite_the_log=False))
    finally:
        redis.stop()


@hotpotqa
def test_an_own_index_still_scanning_its_copies_is_passed_over_while_the_shared_one_is_whole(stack_env):
    """After a restart Redis indexes documents again in the background: an own index whose
    FT.CREATE an AOF replayed scans alone (a 50,000-copy one for 25 s, the shared indexes whole
    by then), holding part of its copies meanwhile — readers searched it as if whole. Where the
    shared index scans too, both are partial, and the own one (faster) answers."""
    texts, queries = _corpus()
    queries = queries[:5]

    async def main():
        memory, reader, tenant, _ = _with_a_twin(stack_env)
        try:
            await _write(memory, tenant, texts)
            await memory.promote_lexical(tenant)
            expected = await _rankings(memory, tenant, queries)
            info, own = memory._index_info, memory.keys(tenant).lexical_index_name

            def scanning(which):  # FT.INFO as a restarted Redis answers it mid-scan, for `which` indexes
                async def answer(client, name):
                    found = await info(client, name)
                    if found is None or not which(name):
                        return found
                    return {**found, "indexing": "1", "percent_indexed": "0.3"}

                return answer

            reader._index_info = scanning(lambda name: name == own)
            assert not await reader.own_lexical_ready(tenant)
            _same(expected, await _rankings(reader, tenant, queries))
            reader._index_info = scanning(lambda name: True)
            reader._own_lexical_read.clear()  # (as LEXICAL_STATE_RECHECK_S later)
            assert await reader.own_lexical_ready(tenant)
            reader._index_info = info
            reader._own_lexical_read.clear()
            assert await reader.own_lexical_ready(tenant)
        finally:
            await _purge_and_close_one(memory, tenant)
            await reader.close()

    asyncio.run(main())


def test_own_lexical_index_names_give_their_tenant():
    from store.keys import TenantKeys, own_lexical_tenant

    for tenant in ("acme", "a.b-c_9"):
        for tagged in (False, True):
            keys = TenantKeys(tenant, tagged_indexes=tagged)
            assert own_lexical_tenant(keys.lexical_index_name) == tenant
            assert own_lexical_tenant(keys.lexical_generation_index(3)) == tenant
            assert own_lexical_tenant(keys.vector_index_name("passages", 384)) is None
    for other in (
        "ms:index:passages:384:f16",
        "ms:own:acme:lexical:x",
        "ms:own::lexical",
        "ms_acme_passages",
        "ms:own:{acme:lexical",  # no tenant's: a foreign or damaged name
        "ms:own:_x:lexical",
        "ms:own:a b:lexical",
    ):
        assert own_lexical_tenant(other) is None


@hotpotqa
def test_a_promoted_tenant_is_not_asked_again_whether_it_is_small(stack_env):
    """A large tenant is asked every TENANT_DIMS_RECHECK_S whether it shrank to a few passages (a
    search of the shared index reading up to LEXICAL_READ_ALL of them: ~10 ms of Redis at 50,000
    passages); one with an index of its own is not — that index stays exact whatever its size."""
    texts, queries = _corpus()

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        try:
            await _write(memory, tenant, texts)
            await memory.promote_lexical(tenant)
            expected = await _rankings(memory, tenant, queries[:3])  # the first: it is found large
            sent = _record_commands(memory)
            memory._tenant_large[tenant] -= 3600  # (as TENANT_DIMS_RECHECK_S later)
            memory._own_lexical_read.pop(tenant)  # (and LEXICAL_STATE_RECHECK_S)
            assert await _rankings(memory, tenant, queries[:3]) == expected
            searched = [str(args[1]) for args in sent if str(args[0]).upper() == "FT.SEARCH"]
            assert searched == [memory.keys(tenant).lexical_index_name] * 3
        finally:
            await _purge_and_close_one(memory, tenant)

    asyncio.run(main())


_PROMOTE_SLOWLY = """
import asyncio, sys, time
import store.redis.lexical_index as lexical_index
from store import Memory
lexical_index.PROMOTION_BATCH = 10
async def main():
    memory = Memory.from_url(sys.argv[1], dims=8)
    def progress(done, total):
        print(done, flush=True)
        time.sleep(0.2)  # killed in here, its batches half done
    await getattr(memory, sys.argv[3])(sys.argv[2], progress)  # promote_lexical or rebuild_lexical
asyncio.run(main())
"""


def _killed_after_three_batches(url: str, tenant: str, method: str) -> None:
    """`method` of the tenant's lexical index run slowly in a process SIGKILLed after three batches."""
    worker = subprocess.Popen(
        [sys.executable, "-c", _PROMOTE_SLOWLY, url, tenant, method],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert worker.stdout is not None
    for _ in range(3):  # three batches copied
        assert worker.stdout.readline().strip()
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)


@hotpotqa
def test_a_promotion_killed_midway_resumes_to_one_consistent_index(stack_env):
    """SIGKILL after a few batches of copies: readers keep the (exact) shared path, the state
    says building; the next promotion finishes the same index — one document a passage, no term
    counted twice, the ranks of the shared path — while writes went on meanwhile."""
    texts, queries = _corpus()
    url = stack_env["MEMSTREAM_REDIS_URL"]

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        keys = memory.keys(tenant)
        try:
            await _write(memory, tenant, texts[:200])
            await _retire_and_erase(memory, tenant)
            _killed_after_three_batches(url, tenant, "promote_lexical")
            assert await memory.redis.hget(keys.lexical_index_state, "state") == b"building"
            copied = [k async for k in memory.redis.scan_iter(match=keys.lexical_mirror_prefix() + "*", count=1000)]
            assert 0 < len(copied) < 200
            # writes while it lay cut off are copied by the writes themselves
            await _write(memory, tenant, texts[200:], start=200)
            shared = await _rankings(memory, tenant, queries)  # still the shared path: not ready
            started = time.monotonic()
            assert await memory.promote_lexical(tenant) == len(texts)
            assert time.monotonic() - started < 30
            info = await memory.redis.ft(keys.lexical_index_name).info()
            assert int(info["num_docs"]) == len(texts)
            _shared_path_forbidden(memory)
            _same(shared, await _rankings(memory, tenant, queries))
            names = [n.decode() for n in await memory.redis.execute_command("FT._LIST")]
            assert names.count(keys.lexical_index_name) == 1
        finally:
            await _purge_and_close_one(memory, tenant)

    asyncio.run(main())


@hotpotqa
def test_a_copy_written_before_its_index_was_created_is_copied_again_into_it(stack_env, monkeypatch):
    """An own index is created without a scan: a copy there when it is created — written just
    before it, as a writer would whose state's deletion a failover lost — is in no index, and the
    copy pass leaves a copy equal to its passage alone. Such a copy is deleted once the index
    exists and copied again: the index holds every passage and ranks as the shared path does."""
    texts, queries = _corpus()
    texts, queries = texts[:200], queries[:5]

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        keys = memory.keys(tenant)
        try:
            await _write(memory, tenant, texts)
            expected = await _rankings(memory, tenant, queries)
            await memory.promote_lexical(tenant)
            early = {}  # copies as the index's first promotion wrote them, equal to their passages
            async for key in memory.redis.scan_iter(match=keys.lexical_mirror_prefix() + "*", count=1000):
                if len(early) < 20:
                    early[key] = await memory.redis.hgetall(key)
            await memory.redis.execute_command("FT.DROPINDEX", keys.lexical_index_name, "DD")  # the index lost
            creating = lexical_index.create_unless_exists

            async def written_early_then_created(creation):
                for key, fields in early.items():
                    await memory.redis.hset(key, mapping=fields)
                early.clear()
                return await creating(creation)

            monkeypatch.setattr(lexical_index, "create_unless_exists", written_early_then_created)
            await memory.promote_lexical(tenant)
            assert not early  # they were written, just before the index was created
            info = await memory.redis.ft(keys.lexical_index_name).info()
            assert int(info["num_docs"]) == int(info["max_doc_id"]) == len(texts)
            _shared_path_forbidden(memory)
            _same(expected, await _rankings(memory, tenant, queries))
        finally:
            await _purge_and_close_one(memory, tenant)

    asyncio.run(main())


@hotpotqa
def test_a_tenant_whose_index_is_lost_at_a_later_generation_is_promoted_without_its_old_copies(stack_env):
    """A Redis Cluster slot moved to another shard brings a tenant's keys — its state, 'ready' at
    generation g, and its copies under `lex<g>:` — and not its index: the writer's check finds it
    ready and not there and promotes it again, at generation 0. Every generation's copies go
    first: g's were left behind, in no index, until a rebuild came back to g."""
    texts, queries = _corpus()
    texts, queries = texts[:200], queries[:5]

    async def main():
        memory = _memory(stack_env)
        memory.lexical_own_index_at = 100
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        keys = memory.keys(tenant)
        try:
            await _write(memory, tenant, texts)
            expected = await _rankings(memory, tenant, queries)
            await memory.promote_lexical(tenant)
            await memory.rebuild_lexical(tenant)
            assert await memory.redis.hget(keys.lexical_index_state, "gen") == b"1"
            assert await _copies(memory, tenant, 1) == len(texts)
            # the index, not its keys, left behind (as on the shard the slot left)
            await memory.redis.execute_command("FT.ALIASDEL", keys.lexical_index_name)
            await memory.redis.execute_command("FT.DROPINDEX", keys.lexical_generation_index(1))
            memory._lexical_size_checked.clear()
            await memory._promote_if_large(tenant)
            assert await memory.redis.hget(keys.lexical_index_state, "state") == b"ready"
            assert await _copies(memory, tenant, 1) == 0
            assert await _copies(memory, tenant, 0) == len(texts)
            info = await memory.redis.ft(keys.lexical_index_name).info()
            assert int(info["num_docs"]) == int(info["max_doc_id"]) == len(texts)
            memory._own_lexical_read.clear()
            _shared_path_forbidden(memory)
            _same(expected, await _rankings(memory, tenant, queries))
        finally:
            await _purge_and_close_one(memory, tenant)

    asyncio.run(main())


@hotpotqa
def test_a_rebuild_killed_midway_resumes_to_one_exact_index(stack_env):
    """SIGKILL while a rebuild copies its passages: searches stay on the searched generation's
    index (the own index, never the shared path), writes go on into both generations; the next
    rebuild finishes the same generation, exact again, and leaves one index and one set of copies."""
    texts, queries = _corpus()
    url = stack_env["MEMSTREAM_REDIS_URL"]

    async def main():
        memory, twin, tenant, exact = _with_a_twin(stack_env)
        keys = memory.keys(tenant)
        try:
            for store, name in ((memory, tenant), (twin, exact)):
                await _write(store, name, texts[:200])
            await memory.promote_lexical(tenant)
            for store, name in ((memory, tenant), (twin, exact)):
                await _retire(store, name, [f"p{i:04d}" for i in range(0, 30, 3)])
            _killed_after_three_batches(url, tenant, "rebuild_lexical")
            state = await memory.redis.hmget(keys.lexical_index_state, "state", "gen", "next")
            assert state == [b"ready", None, b"1"]  # generation 0 searched, 1 cut off midway
            _shared_path_forbidden(memory)
            assert all(await _rankings(memory, tenant, queries[:5]))  # answered by generation 0
            for store, name in ((memory, tenant), (twin, exact)):  # writes meanwhile reach both
                await _write(store, name, texts[200:], start=200)
                await _retire(store, name, ["p0100"])
            assert await memory.rebuild_lexical(tenant) == len(texts)
            assert await memory.redis.hmget(keys.lexical_index_state, "gen", "next") == [b"1", None]
            assert await memory.lexical_drift(tenant) == 0.0
            _same(await _rankings(twin, exact, queries), await _rankings(memory, tenant, queries))
            names = [n.decode() for n in await memory.redis.execute_command("FT._LIST")]
            assert [n for n in names if tenant in n] == [keys.lexical_generation_index(1)]
            assert [await _copies(memory, tenant, generation) for generation in (0, 1)] == [0, len(texts)]
        finally:
            await _purge_and_close(memory, tenant, twin, exact)

    asyncio.run(main())


@hotpotqa
def test_purging_a_promoted_tenant_leaves_no_key_and_no_index(stack_env):
    texts, _ = _corpus()

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        keys = memory.keys(tenant)
        try:
            await _write(memory, tenant, texts[:100])
            await memory.promote_lexical(tenant)
        finally:
            await memory.purge_tenant(tenant, lambda p: [], lambda *a: [])
        left = [k async for k in memory.redis.scan_iter(match=f"*{{{tenant}}}*", count=1000)]
        names = [n.decode() for n in await memory.redis.execute_command("FT._LIST")]
        await memory.close()
        return left, names, keys.lexical_index_name

    left, names, own = asyncio.run(main())
    assert left == []
    assert own not in names


def test_an_erasure_in_a_promoted_tenant_leaves_nothing_of_the_document(stack_env):
    """tests/test_erasure.py's check (every key of the server, any type) with the tenant's own
    lexical index built before the erasure: the copies of its passages' terms go too."""
    from tests.test_erasure import _stages, traces

    url = stack_env["MEMSTREAM_REDIS_URL"]
    # digits at the end: the stemmer keeps the word whole in the copy's terms (a hex suffix
    # ending in "e" or "ed" was cut, "zorvex012443be" → "zorvex012443b", and the test failed)
    word = f"Zorvex{uuid.uuid4().int % 10**8:08d}"

    async def scenario():
        stages = _stages(url)
        try:
            await stages.publish(
                "quill", f"{word} Quill lives in Brannoc. {word} Quill works for Orsk Mills.", version=1
            )
            await stages.publish("nora", "Nora Velt works for Orsk Mills.", version=1)
            await stages.memory.promote_lexical(stages.tenant)
            copies = [
                k
                async for k in stages.memory.redis.scan_iter(
                    match=stages.memory.keys(stages.tenant).lexical_mirror_prefix() + "*"
                )
            ]
            before = traces(stages, url, [word])
            await stages.delete("quill", purge=True)
            return copies, before, traces(stages, url, [word])
        finally:
            await stages.close()

    copies, before, after = asyncio.run(scenario())
    assert len(copies) == 2
    assert any(":lex:" in k for k in before), before  # its terms were copied
    assert after == [], after[:10]


def test_query_terms_are_matched_verbatim_not_expanded_by_their_stem(stack_env):
    """The query engine adds a term's stem at query time unless told VERBATIM: "continent" also
    matched the passages holding "contin" (the stem of "continental"), so the own index's
    document frequencies and scores were not the terms'. Its ranks and scores are the exact BM25
    of the tenant's terms (store.lexical.bm25 over every passage)."""
    from store.lexical import bm25, document_frequency, passage_terms, search_terms

    texts = [f"The continental shelf number {i} lies under the sea" for i in range(60)]
    texts += [f"A continent of ice, number {i}, and its lowest temperature" for i in range(12)]
    queries = ["What continent has the lowest temperature?", "continental shelf"]

    async def main():
        memory = _memory(stack_env)
        tenant = f"own-{uuid.uuid4().hex[:8]}"
        try:
            await _write(memory, tenant, texts)
            shared = await _rankings(memory, tenant, queries)
            await memory.promote_lexical(tenant)
            _shared_path_forbidden(memory)
            return shared, await _rankings(memory, tenant, queries)
        finally:
            await _purge_and_close_one(memory, tenant)

    shared, own = asyncio.run(main())
    documents = {f"p{i:04d}": passage_terms("", t).split() for i, t in enumerate(texts)}
    average = sum(map(len, documents.values())) / len(documents)
    for query in queries:
        terms = search_terms(query)
        exact = bm25(terms, documents, document_frequency(terms, documents), len(documents), average)
        expected = sorted(exact.items(), key=lambda item: (-item[1], item[0]))[:TOP]
        for found in (shared[query], own[query]):
            assert [pid for pid, _, _ in found] == [pid for pid, _ in expected], query
            assert [score for _, score, _ in found] == pytest.approx([s for _, s in expected], rel=1e-6), query


@pytest.mark.parametrize("server", ["redis", "redis-cluster"])
def test_a_graph_modes_first_stage_reads_its_hits_with_its_searches(server, request):
    """A graph mode's first stage (workers.query.first_stage: rows and cosines): each dense hit
    comes with its row, read in the search's command, and on a tenant with a lexical index of
    its own each lexical hit with its row and vector — they were one or two commands more after
    both legs (the vectors of the lexical-only hits, the candidates' rows), which a reconstruct
    walk's first step waited for. The stage is the same either way, before the tenant's
    promotion (shared indexes) and after, a retired passage left out."""
    from store import Memory
    from workers.query.first_stage import FirstStageSearch
    from workers.query.request import QueryRequest

    url = (
        request.getfixturevalue("stack_env")["MEMSTREAM_REDIS_URL"]
        if server == "redis"
        else request.getfixturevalue("redis_cluster_url")
    )
    tenant = f"read-{uuid.uuid4().hex[:6]}"
    vectors = np.random.default_rng(3).normal(size=(LEXICAL_READ_ALL + 16, 8)).astype(np.float32)

    async def main():
        memory = Memory.from_url(url, dims=8)
        memory.lexical_own_index_at = memory.vector_own_index_at = 10**9  # promoted below, not by a write
        pool = memory.shard(tenant).connection_pool
        sent: list = []  # a command (or a script) a connection taken from the tenant's server's pool
        take = pool.get_connection

        async def recording(*args, **kwargs):
            sent.append(args)
            return await take(*args, **kwargs)

        async def unread(*args, **kwargs):
            return None

        async def stages() -> list:
            stage, out = FirstStageSearch(memory), []
            for n, query in enumerate(["lantern keeper", "harbour tower number 12", "keeper number 3"]):
                asked, vector = QueryRequest(query, tenant, 5, "ppr"), vectors[n * 5] + 0.05
                for _ in range(2):  # the tenant known to be large, the own index's state read, the scripts loaded
                    await stage.search(asked, vector, with_rows=True)
                sent.clear()
                reading = await stage.search(asked, vector, with_rows=True)
                with_searches = len(sent)
                memory.passages_near_read = memory.lexical_read = unread  # type: ignore[method-assign]
                sent.clear()
                after = await stage.search(asked, vector, with_rows=True)
                out.append((reading, after, with_searches, len(sent)))
                del memory.passages_near_read, memory.lexical_read
            return out

        try:
            await memory.ensure_indexes(tenant)
            pipe = memory.pipeline(tenant)
            for i, vector in enumerate(vectors):
                text = f"harbour lantern number {i} " + ("keeper" if i % 3 == 0 else "tower")
                memory.stage_passage(pipe, tenant, _chunk(tenant, i, text), [], vector)
            memory.stage_retire_passage(pipe, tenant, "p0003")
            await pipe.execute()
            pool.get_connection = recording  # type: ignore[method-assign]
            shared = await stages()
            memory.lexical_own_index_at = memory.vector_own_index_at = 50
            await memory.promote_lexical(tenant)
            await memory.promote_vectors(tenant)
            return shared, await stages()
        finally:
            await _purge_and_close_one(memory, tenant)

    shared, own = asyncio.run(main())
    for reading, after, with_searches, read_after in shared + own:
        assert reading.fused == after.fused and reading.rows == after.rows and reading.cosines == after.cosines
        assert [(h.id, h.score) for h in reading.dense] == [(h.id, h.score) for h in after.dense]
        assert [(h.id, h.score) for h in reading.lexical] == [(h.id, h.score) for h in after.lexical]
        assert set(reading.cosines) - {h.id for h in reading.dense}  # lexical-only hits, their cosines
        assert "p0003" not in reading.rows and len(reading.rows) == len(reading.fused) - (
            "p0003" in dict(reading.fused)
        )
        assert with_searches <= read_after
    # over the tenant's own indexes: the two searches, nothing after them
    assert all(with_searches == 2 < read_after for _, _, with_searches, read_after in own), own
