"""The lexical leg (store.lexical): its text rules, BM25 in both stores, their agreement on a
fixed corpus (a passages index made before the leg gains it on `memstream migrate`:
tests/test_shared_indexes.py)."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from store.in_memory import InMemoryStore
from store.lexical import (
    STOP_WORDS,
    by_score,
    passage_terms,
    query_stop_words,
    query_terms,
    redis_query,
    search_terms,
    stems,
    tokens,
)
from topics.records import Chunk

# A fixed corpus of turns with context lines: words shared, stemmed forms ("adopted" / "adopting"),
# a rare name, stop words, punctuation and underscores.
CORPUS = [
    ("Caroline (1:56 pm on 8 May, 2023):", "I adopted a dog last week, her name is Biscuit!"),
    ("Melanie (1:58 pm on 8 May, 2023):", "That's lovely. Are you thinking of adopting another one?"),
    ("Caroline (2:01 pm on 8 May, 2023):", "Maybe a cat. I went to the LGBTQ support group yesterday."),
    ("Melanie (2:03 pm on 8 May, 2023):", "I painted a sunrise over the lake; painting calms me."),
    (
        "Caroline (6:10 pm on 25 May, 2023):",
        "The support group talked about adoption agencies and transgender stories.",
    ),
    ("Melanie (6:12 pm on 25 May, 2023):", "We went camping with the kids at the lake — roasted marshmallows."),
    ("Caroline (6:15 pm on 25 May, 2023):", "I'm researching adoption agencies; counseling is my career goal."),
    ("Melanie (6:20 pm on 25 May, 2023):", "My kids love dinosaurs and the museum_trip we took."),
    ("", "A passage with no context line about Biscuit the dog and a lake."),
    ("Caroline:", "Pottery class was fun; I made a bowl for my mom."),
]
QUERIES = [
    "What did Caroline adopt?",
    "When did Melanie paint a sunrise?",
    "adoption agencies",
    "Biscuit",
    "lake camping kids",
    "What is Caroline's career goal in counseling?",
    "museum_trip",
    "the of and",
    "pottery bowl mom",
    "support group",
]
TOP = 10


def test_tokens_follow_the_query_engines_rules():
    assert tokens("Caroline's dog, Biscuit—adopted!") == ["caroline", "s", "dog", "biscuit", "adopted"]
    assert tokens("The museum_trip of 2023") == ["museum_trip", "2023"]  # underscores join; stop words go
    assert query_terms("the of and") == []


def test_a_query_leaves_out_the_longer_stop_list_and_a_passage_keeps_it():
    """A query asks for none of NLTK's English stop words (query_stop_words: the possessive's
    "s", question words, pronouns, auxiliaries) — each is in a large share of any memory's
    passages, weighs little in BM25 and doubled the query engine's work at 200,000 passages —
    but a query of nothing else keeps them; a passage's terms (and BM25 length) keep every one."""
    assert query_terms("the dog and the Dog's dog") == ["dog"]
    assert search_terms("When did Caroline go to the LGBTQ support group?") == [
        "carolin",
        "go",
        "lgbtq",
        "support",
        "group",
    ]
    assert search_terms("Who was the first president of it?") == ["first", "presid"]
    assert query_terms("Who are you?") == ["who", "you"]  # stop words alone: asked for, not dropped
    assert passage_terms("Caroline", "Who said it's hers?").split() == ["carolin", "who", "said", "s", "her"]
    assert query_stop_words() & STOP_WORDS == frozenset()  # the index's own list is dropped as ever
    assert stems(["adopted", "adopting", "adoption"]) == ["adopt", "adopt", "adopt"]
    assert redis_query(["dog", "biscuit"]) == "@lexical:(dog|biscuit)"


def _chunk(i: int, context: str, text: str) -> Chunk:
    return Chunk(
        tenant="t",
        chunk_id=f"p{i:02d}",
        doc_id=f"d{i:02d}",
        seq=0,
        n_chunks=1,
        text=text,
        doc_version=1,
        doc_hash=f"h{i}",
        context=context,
    )


async def _fill(store, tenant: str) -> None:
    await store.ensure_indexes(tenant)
    pipe = store.pipeline(tenant)
    rng = np.random.default_rng(7)
    for i, (context, text) in enumerate(CORPUS):
        store.stage_passage(pipe, tenant, _chunk(i, context, text), [], rng.normal(size=store.dims))
    await pipe.execute()


async def _rankings(store, tenant: str) -> dict[str, list[tuple[str, float]]]:
    return {q: [(h.id, h.score) for h in await store.lexical(tenant, q, TOP)] for q in QUERIES}


def test_scores_equal_but_for_their_last_bit_rank_by_id():
    """Two sums of the same terms in another order differ in their last bit (RediSearch's index
    options change its order: 79.88473566981547 and ...546 for one pair of equal passages):
    they rank as equal scores do, by id; a real difference still ranks by score."""
    scored = [("s0048646", 79.88473566981547), ("s0010340", 79.88473566981546), ("s0000001", 79.8847356)]
    assert [pid for pid, score in sorted(scored, key=lambda hit: by_score(hit[1], hit[0]))] == [
        "s0010340",
        "s0048646",
        "s0000001",
    ]
    assert sorted([("b", 1.0), ("a", 1.0)], key=lambda hit: by_score(hit[1], hit[0])) == [("a", 1.0), ("b", 1.0)]


def test_in_memory_bm25_ranks_by_rare_words_and_stems():
    async def main():
        store = InMemoryStore(dims=8)
        await _fill(store, "t")
        found = await _rankings(store, "t")
        assert [pid for pid, _ in found["Biscuit"]] == ["p08", "p00"]  # the shorter passage first
        assert {pid for pid, _ in found["What did Caroline adopt?"][:2]} >= {"p00"}  # "adopted" matches "adopt"
        assert found["the of and"] == []  # stop words only: nothing to match
        assert [pid for pid, _ in found["museum_trip"]] == ["p07"]
        assert await store.lexical("nobody", "Biscuit", 5) == []  # an unknown tenant has no passages
        # a passage added later is found: the index follows the passages
        pipe = store.pipeline("t")
        store.stage_passage(pipe, "t", _chunk(50, "", "Biscuit again"), [], np.ones(8))
        await pipe.execute()
        assert [h.id for h in await store.lexical("t", "Biscuit", 1)] == ["p50"]

    asyncio.run(main())


@pytest.mark.stack
def test_redis_and_the_in_memory_store_agree_on_a_fixed_corpus(stack_env):
    """Top 10 of every query: the same passages in the same order, BM25 scores equal to float
    precision (store.lexical)."""
    from store import Memory

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=8)
        tenant = f"lex-{uuid.uuid4().hex[:8]}"
        try:
            await _fill(memory, tenant)
            await _wait_indexed(memory, tenant, len(CORPUS))
            # a passage written while its new index still scanned the keyspace was indexed twice,
            # its terms' frequencies doubled once that scan ended (Memory._initial_scan_done)
            await asyncio.sleep(0.5)
            in_redis = await _rankings(memory, tenant)
        finally:
            await memory.close()
        in_process = InMemoryStore(dims=8)
        await _fill(in_process, tenant)
        return in_redis, await _rankings(in_process, tenant)

    in_redis, in_process = asyncio.run(main())
    for query in QUERIES:
        assert [pid for pid, _ in in_redis[query]] == [pid for pid, _ in in_process[query]], query
        for (_, a), (_, b) in zip(in_redis[query], in_process[query]):
            assert a == pytest.approx(b, rel=1e-6), query


async def _wait_indexed(memory, tenant: str, count: int) -> None:
    for _ in range(100):
        if len(await memory.lexical(tenant, "caroline melanie passage", 50)) >= count - 1:
            return
        await asyncio.sleep(0.05)


@pytest.mark.stack
@pytest.mark.parametrize("cap", [2, 3, 5])
def test_past_the_candidate_limit_the_ranking_is_the_in_memory_stores(stack_env, monkeypatch, cap):
    """More passages match than one search reads (LEXICAL_CANDIDATES made tiny), and another
    tenant's passages skew the shared index's BM25STD: the top k is still the in-memory store's,
    ids and scores — the passages of the rarest terms read, the rest bounded, or every page read."""
    import store.redis.search
    from store import Memory

    monkeypatch.setattr(store.redis.search, "LEXICAL_CANDIDATES", cap)  # read where it is defined
    queries = ("caroline melanie lake", "adoption agencies", "caroline", "melanie painted the lake sunrise", "lake")

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"], dims=8)
        tenant, other = f"lexcap-{uuid.uuid4().hex[:8]}", f"lexskew-{uuid.uuid4().hex[:8]}"
        try:
            await _fill(memory, tenant)
            await memory.ensure_indexes(other)  # another tenant saying "lake" often: the shared idf of "lake" falls
            pipe = memory.pipeline(other)
            for i in range(12):
                memory.stage_passage(
                    pipe, other, _chunk(i, "", "lake lake lake caroline " + "word " * i), [], np.ones(8)
                )
            await pipe.execute()
            await _wait_indexed(memory, tenant, len(CORPUS))
            await asyncio.sleep(0.5)
            return {q: [(h.id, round(h.score, 9)) for h in await memory.lexical(tenant, q, TOP)] for q in queries}
        finally:
            for name in (tenant, other):
                await memory.purge_tenant(name, lambda p: [], lambda *a: [])
            await memory.close()

    async def reference():
        store_ = InMemoryStore(dims=8)
        await _fill(store_, "t")
        return {q: [(h.id, round(h.score, 9)) for h in await store_.lexical("t", q, TOP)] for q in queries}

    found, expected = asyncio.run(main()), asyncio.run(reference())
    for query in queries:
        assert [i for i, _ in found[query]] == [i for i, _ in expected[query]], query
        assert [s for _, s in found[query]] == pytest.approx([s for _, s in expected[query]], rel=1e-6), query


def test_search_replies_read_the_same_in_either_protocol():
    from store.indexes import reply_rows

    resp2 = [2, b"ms:pas:{t}:p1", [b"doc_id", b"d1", b"lexical", b"dog cat"], b"ms:pas:{t}:p2", [b"doc_id", b"d2"]]
    resp3 = {
        b"total_results": 2,
        b"results": [
            {b"id": b"ms:pas:{t}:p1", b"extra_attributes": {b"doc_id": b"d1", b"lexical": b"dog cat"}},
            {b"id": b"ms:pas:{t}:p2", b"extra_attributes": {b"doc_id": b"d2"}},
        ],
    }
    assert (
        reply_rows(resp2)
        == reply_rows(resp3)
        == (2, [("ms:pas:{t}:p1", {"doc_id": "d1", "lexical": "dog cat"}), ("ms:pas:{t}:p2", {"doc_id": "d2"})])
    )
    # the lexical leg reads a RESP3 reply in place: the same passages, terms and doc ids
    from store.indexes import TenantIndex
    from store.redis.search import _lexical_rows

    passages = TenantIndex(redis=None, index=None, tenant="t", layer="passages")  # no search sent
    assert passages.prefix == "ms:pas:{t}:"
    assert (
        _lexical_rows(passages, resp2)
        == _lexical_rows(passages, resp3)
        == (2, {"p1": ["dog", "cat"], "p2": []}, {"p1": "d1", "p2": "d2"}, 2)
    )
    # a small tenant's whole read keeps the passages holding a query term, and counts every one
    for holding, kept in ((["cat"], ["p1"]), (["ca"], []), (["dog", "bird"], ["p1"]), (["bird"], [])):
        for reply in (resp2, resp3):
            read = _lexical_rows(passages, reply, holding)
            assert (read.total, list(read.documents), list(read.doc_ids), read.length) == (2, kept, kept, 2)
    aggregate2, aggregate3 = (
        [1, [b"n", b"10", b"length", b"42"]],
        {b"total_results": 1, b"results": [{b"extra_attributes": {b"n": b"10", b"length": b"42"}}]},
    )
    assert reply_rows(aggregate2) == reply_rows(aggregate3) == (1, [(None, {"n": "10", "length": "42"})])
