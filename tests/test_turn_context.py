"""A conversation turn's vector embeds it after the turn before it in its session
(workers.algorithms.turns.turn_embedded_text), and its lexical terms follow that turn's
(store.lexical.passage_terms): "Yes! At the beach." says where only after "Where did you camp?".
Turns arrive on any partition in any order; whichever of two neighbours is indexed second embeds
the later one after the earlier, so every order gives the same vectors and terms. An erased
turn's cached vector of that text goes with it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from store.caches import text_sha256
from store.in_memory import InMemoryStore
from store.lexical import LEXICAL_FIELD, LEXICAL_LENGTH_FIELD, passage_terms, term_count
from tests.inprocess import DIMS, Delivery, HashEmbedder, InProcess
from workers.algorithms.chunking import turn_chunk_id
from workers.algorithms.turns import turn_context, turn_embedded_text
from workers.models.embedding import BatchingEmbedder, embedder_id
from workers.models.extraction import RulesExtractor

SESSION = "trip:session_1"
TURNS = [  # (speaker, text): a session of five turns
    ("Ann", "Where did you camp this summer?"),
    ("Bob", "At the beach, with the kids."),
    ("Ann", "Did they like it?"),
    ("Bob", "They loved the waves."),
    ("Ann", "We should go together next year."),
]


def run(coro):
    return asyncio.run(coro)


def _stages(redis_url, delivery: Delivery | None = None, cached: bool = False) -> InProcess:
    from store import Memory

    memory = Memory.from_url(redis_url, tau=2) if redis_url else InMemoryStore(DIMS, tau=2)
    model = HashEmbedder()
    embedder = BatchingEmbedder(model, cache=memory.embedding_cache(embedder_id(model).cache_name) if cached else None)
    return InProcess(None, RulesExtractor(), embedder, memory=memory, delivery=delivery)


def _passage_id(n: int) -> str:
    speaker, text = TURNS[n - 1]
    return turn_chunk_id(f"turn-{n}", turn_context(speaker), text)


def _expected_texts() -> list[str]:
    """What each turn's vector embeds: its speaker line and text, then the text of the turn before."""
    out = []
    for n, (speaker, text) in enumerate(TURNS, 1):
        before = TURNS[n - 2][1] if n > 1 else None
        out.append(turn_embedded_text(f"{turn_context(speaker)}\n{text}", before))
    return out


def _expected_terms() -> list[str]:
    """What each turn is indexed as for BM25: its speaker line and text, then the turn before's text."""
    return [
        passage_terms(turn_context(speaker), text, TURNS[n - 2][1] if n > 1 else None)
        for n, (speaker, text) in enumerate(TURNS, 1)
    ]


async def _terms_of(stages: InProcess, numbers: list[int]) -> list[tuple[str, str]]:
    """Each turn's stored lexical terms and their count (the store's own fields: what its BM25
    counts)."""
    memory, tenant, ids = stages.memory, stages.tenant, [_passage_id(n) for n in numbers]
    if isinstance(memory, InMemoryStore):
        rows = [memory._tenants[tenant].records["passages"][pid] for pid in ids]
        return [(row[LEXICAL_FIELD], row[LEXICAL_LENGTH_FIELD]) for row in rows]
    shard, keys = memory.shard(tenant), memory.keys(tenant)
    read = [await shard.hmget(keys.passage(pid), [LEXICAL_FIELD, LEXICAL_LENGTH_FIELD]) for pid in ids]
    return [(terms.decode(), length.decode()) for terms, length in read]


def _assert_terms_as_said(terms: list[tuple[str, str]]) -> None:
    assert [t for t, _ in terms] == _expected_terms()
    assert [int(n) for _, n in terms] == [term_count(t) for t in _expected_terms()]


async def _publish(stages: InProcess, order: list[int], wait: bool = True) -> None:
    for n in order:
        speaker, text = TURNS[n - 1]
        await stages.publish(f"turn-{n}", text, session_id=SESSION, turn=n, speaker=speaker, wait=wait)
    await stages.drain()


async def _cosines_to_expected(stages: InProcess) -> tuple[list[float], list[float]]:
    """Each turn's stored vector against the vector of what it should embed, and against its own
    text alone (the vector before turns were embedded after the turn before)."""
    stored = await stages.memory.passage_vectors(stages.tenant, [_passage_id(n) for n in range(1, len(TURNS) + 1)])
    expected = HashEmbedder().embed(_expected_texts())
    alone = HashEmbedder().embed([f"{turn_context(s)}\n{t}" for s, t in TURNS])
    unit = [np.asarray(v, dtype=np.float32) / np.linalg.norm(v) for v in stored]
    return [float(u @ e) for u, e in zip(unit, expected)], [float(u @ a) for u, a in zip(unit, alone)]


def test_a_turn_is_embedded_after_the_turn_before_it(redis_url):
    """Published in order, as a conversation is said: each turn's vector is of its text followed
    by the turn before it (the first turn's, of its text alone); each records the passage it
    followed. Before: every turn's vector was of its own text alone."""

    async def scenario():
        stages = _stages(redis_url)
        try:
            await _publish(stages, [1, 2, 3, 4, 5])
            made = await stages.memory.turn_embeddings(stages.tenant, [_passage_id(n) for n in range(1, 6)])
            return await _cosines_to_expected(stages), made, await _terms_of(stages, [1, 2, 3, 4, 5])
        finally:
            await stages.close()

    (to_expected, to_alone), made, terms = run(scenario())
    _assert_terms_as_said(terms)  # before: each turn's own terms alone
    assert min(to_expected) > 0.999, to_expected  # (Redis holds float16)
    assert to_alone[0] > 0.999 and max(to_alone[1:]) < 0.5
    assert [m.preceded_by for m in made] == [""] + [_passage_id(n) for n in range(1, 5)]
    assert [m.embedded_sha for m in made] == [""] + [text_sha256(t) for t in _expected_texts()[1:]]


@pytest.mark.parametrize("order", [[5, 4, 3, 2, 1], [2, 4, 1, 5, 3]])
def test_turns_indexed_in_any_order_get_the_vectors_of_the_order_they_were_said_in(redis_url, order):
    """A turn indexed before the turn before it is embedded again when that one is: the later
    of two neighbours to be indexed embeds the turn after after the turn before."""

    async def scenario():
        stages = _stages(redis_url)
        try:
            await _publish(stages, order)
            return await _cosines_to_expected(stages), await _terms_of(stages, [1, 2, 3, 4, 5])
        finally:
            await stages.close()

    (to_expected, _), terms = run(scenario())
    assert min(to_expected) > 0.999, to_expected
    _assert_terms_as_said(terms)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_neighbouring_turns_indexed_at_once_on_several_partitions_still_follow_each_other(seed):
    """Four partitions, three messages in flight, a third of them delivered twice: two
    neighbours deciding at once both read the other absent, and the second to commit finds the
    session's turns changed (expect_session_turns), decides again and embeds after the first."""

    async def scenario():
        stages = _stages(None, Delivery(partitions=4, consumers=3, seed=seed, redeliver=0.3))
        try:
            await _publish(stages, [3, 1, 5, 2, 4], wait=False)
            return await _cosines_to_expected(stages), await _terms_of(stages, [1, 2, 3, 4, 5])
        finally:
            await stages.close()

    (to_expected, _), terms = run(scenario())
    assert min(to_expected) > 0.999, to_expected
    _assert_terms_as_said(terms)


def test_an_erased_turn_takes_the_cached_vector_of_what_it_embedded(redis_url):
    """The embedding cache keys a vector by its text's digest; an erasure computes the digests of
    a passage's texts from its row, which does not hold the turn before it. The turn records the
    digest of what it embedded, and its erasure deletes that entry too."""

    async def scenario():
        stages = _stages(redis_url, cached=True)
        try:
            await _publish(stages, [1, 2])
            cache = stages.memory.embedding_cache(embedder_id(HashEmbedder()).cache_name)
            embedded = _expected_texts()[1]
            before = await cache.get_many([embedded])
            await stages.delete("turn-2", purge=True)
            return before, await cache.get_many([embedded]), await cache.get_many([_expected_texts()[0]])
        finally:
            await stages.close()

    before, after, first = run(scenario())
    assert list(before) == [_expected_texts()[1]]
    assert after == {}
    assert list(first) == [_expected_texts()[0]]  # the turn before, not erased, keeps its own


def test_the_next_turns_cached_vector_goes_when_the_turn_before_it_is_erased(redis_url):
    """The next turn's vector embeds the erased turn's words after its own: the cached vector of
    that text is deleted with the erased turn's own."""

    async def scenario():
        stages = _stages(redis_url, cached=True)
        try:
            await _publish(stages, [1, 2, 3])
            cache = stages.memory.embedding_cache(embedder_id(HashEmbedder()).cache_name)
            texts = _expected_texts()
            before = await cache.get_many(texts[:3])
            await stages.delete("turn-1", purge=True)
            return before, await cache.get_many(texts[:3])
        finally:
            await stages.close()

    before, after = run(scenario())
    texts = _expected_texts()
    assert sorted(before) == sorted(texts[:3])
    assert sorted(after) == [texts[2]]  # turn 3's, which follows turn 2, stays


def test_a_turn_retired_while_the_turn_before_it_decides_gets_no_vector_back():
    """The turn before, indexed second, embeds the next turn again; that turn is retired between
    the decision's read and its commit. The decision expects the state it decided on, so it
    decides again and leaves the retired passage alone — its vector stays set aside, out of the
    indexes (before: its state was read after its row, the expectation took the retirement in,
    and the commit wrote a vector back onto the retired passage)."""
    memory = InMemoryStore(DIMS, tau=2)
    retired: list[str] = []
    read_rows = memory.passages

    async def passages_then_retire(tenant, ids):
        rows = await read_rows(tenant, ids)
        follower = _passage_id(2)
        if follower in ids and not retired:  # the first decision of turn 1 has read turn 2
            retired.append(follower)
            pipe = memory.pipeline(tenant)
            memory.stage_retire_passage(pipe, tenant, follower)
            await pipe.execute()
        return rows

    async def scenario():
        stages = InProcess(None, RulesExtractor(), BatchingEmbedder(HashEmbedder()), memory=memory)
        try:
            await _publish(stages, [2])
            memory.passages = passages_then_retire  # type: ignore[method-assign]
            await _publish(stages, [1])
            return dict(memory._tenants[stages.tenant].records["passages"][_passage_id(2)])
        finally:
            await stages.close()

    row = run(scenario())
    assert retired == [_passage_id(2)]
    assert row.get("retired") == "1"
    assert "vec" not in row and "retired_vec" in row
    assert not row.get("preceded_by")


async def _lexical(stages: InProcess, query: str) -> list[str]:
    return [hit.id for hit in await stages.memory.lexical(stages.tenant, query, 5)]


async def _vector_of(stages: InProcess, n: int) -> np.ndarray:
    [vector] = await stages.memory.passage_vectors(stages.tenant, [_passage_id(n)])
    return np.asarray(vector, dtype=np.float32) / np.linalg.norm(vector)


def test_a_turn_whose_turn_before_leaves_memory_gets_its_own_vector_back_and_follows_its_next_version(redis_url):
    """Memory is a function of the current documents: the turn before deleted, the next turn's
    vector is of its own text again (kept for this: the stage that retires a passage runs no
    model); erased, the same, and the cached vector of what it had embedded goes; edited, the
    next turn follows the new text. Before: it kept the vector embedded after the deleted text."""
    edited = "Where did you camp last summer, in the end?"

    async def scenario():
        stages = _stages(redis_url, cached=True)
        cache = stages.memory.embedding_cache(embedder_id(HashEmbedder()).cache_name)
        try:
            await _publish(stages, [1, 2, 3])
            embedded = await _vector_of(stages, 2)
            camp = await _lexical(stages, "camp")
            await stages.delete("turn-1")
            deleted = await _vector_of(stages, 2), await stages.memory.turn_embeddings(stages.tenant, [_passage_id(2)])
            camp_deleted, terms_deleted = await _lexical(stages, "camp"), await _terms_of(stages, [2])
            await stages.publish("turn-1", edited, session_id=SESSION, turn=1, speaker="Ann", version=2)
            after_edit, edit_words = await _vector_of(stages, 2), await _lexical(stages, "end")
            await stages.delete("turn-1", purge=True)
            erased = await _vector_of(stages, 2), await cache.get_many([_expected_texts()[1]])
            terms_erased = await _terms_of(stages, [2])
            return embedded, deleted, after_edit, erased, (camp, camp_deleted, edit_words, terms_deleted, terms_erased)
        finally:
            await stages.close()

    embedded, (deleted, made), after_edit, (erased, cached), lexical = run(scenario())
    camp, camp_deleted, edit_words, terms_deleted, terms_erased = lexical
    # BM25 finds the reply by the question's word while the question is in memory, and not after
    own = [(passage_terms("Bob:", TURNS[1][1]), str(term_count(passage_terms("Bob:", TURNS[1][1]))))]
    assert camp == [_passage_id(1), _passage_id(2)] or camp == [_passage_id(2), _passage_id(1)]
    assert camp_deleted == [] and terms_deleted == own and terms_erased == own
    assert _passage_id(2) in edit_words  # the edited question's new word
    alone, combined, after_new = HashEmbedder().embed(
        [f"Bob:\n{TURNS[1][1]}", _expected_texts()[1], turn_embedded_text(f"Bob:\n{TURNS[1][1]}", edited)]
    )
    assert float(embedded @ combined) > 0.999
    assert float(deleted @ alone) > 0.999 and made[0].preceded_by == ""
    assert float(after_edit @ after_new) > 0.999
    assert float(erased @ alone) > 0.999
    assert cached == {}


def test_a_large_tenants_own_lexical_index_takes_the_terms_a_turn_gets_after_the_turn_before(redis_url):
    """A tenant with a lexical index of its own (store.redis.lexical_index) searches copies of
    its passages' terms: a turn indexed again after the turn before it, and given its own terms
    back when that turn leaves, has its copy changed in the same transaction, so the own index
    ranks as the passages read."""
    if redis_url is None:
        pytest.skip("the in-memory store scores its passages' own fields: no copies")

    async def scenario():
        stages = _stages(redis_url)
        memory, tenant = stages.memory, stages.tenant
        shard, keys = memory.shard(tenant), memory.keys(tenant)
        copy = keys.lexical_mirror(_passage_id(2))
        try:
            await _publish(stages, [2, 3])
            await memory.promote_lexical(tenant)
            alone = await shard.hget(copy, LEXICAL_FIELD)
            await _publish(stages, [1])  # turn 2 follows it now: its copy too
            after = await shard.hget(copy, LEXICAL_FIELD), await _terms_of(stages, [2])
            await stages.delete("turn-1")
            back = await shard.hget(copy, LEXICAL_FIELD)
            return alone, after, back
        finally:
            await stages.close()

    alone, (after, stored), back = run(scenario())
    own = passage_terms("Bob:", TURNS[1][1])
    assert alone.decode() == own
    assert after.decode() == stored[0][0] == _expected_terms()[1]  # before: the copy kept its own terms
    assert back.decode() == own
