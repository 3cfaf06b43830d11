"""Two timelines and expiry: TTLs per category (settings) and per document
(metadata), the expiry sweep (one `expired` event per fact and lapse, the graph edge dropped,
the fact gone from retrieval — before the sweep too), invalidation dropping a fact likewise,
`as_of` answering from the facts valid then, and bad TTLs and as_of refused by name.

In process (tests/inprocess.py, InMemoryStore): no stack needed."""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from store.in_memory import InMemoryStore
from store.nodes import entity_node
from tests.inprocess import DIMS, InProcess
from tests.test_query_bounds import NO_REDIS, GatedEmbedder, post, serve
from topics import ContractError
from topics.conversations import parse_time, turn_from_json
from topics.records import Document, Triple
from topics.times import iso_moment
from workers.algorithms.expiry import document_ttls, parse_as_of, parse_ttl_setting, turn_time, was_valid, world_time
from workers.algorithms.ppr import SparseGraph
from workers.algorithms.retrieval import FactHit, PassageStats, RetrievalParams, seed
from workers.models.extraction import Entity, Extraction
from workers.query.engine import QueryRequest
from workers.settings import Settings


class CategoryExtractor:
    """Test double: each text's facts as (head, relation, tail, category) tuples."""

    name = "scripted"
    grounded = True  # the test's facts, admitted as given (grounding has its tests: tests/test_grounding.py)

    def __init__(self, script: dict[str, list[tuple]]):
        self.script = script

    async def extract(self, text: str, context: str = "") -> Extraction:
        facts = [Triple(h, r, t, "PERSON", "THING", category) for h, r, t, category in self.script[text]]
        entities = sorted({(f.head, f.head_type) for f in facts} | {(f.tail, f.tail_type) for f in facts})
        return Extraction([Entity(n, t) for n, t in entities], facts)


class PrefixEmbedder:
    """Test double: a text's vector is mostly that of its first three words, so "Ana lives in
    Paris", "Ana lives in Berlin" and the query "Ana live in" are near (cosine ≈ 0.9) and
    texts with other beginnings are not (≈ 0)."""

    dims = DIMS

    @staticmethod
    def _vector(text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)

    async def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            vector = self._vector(" ".join(text.split()[:3]).lower()) + 0.3 * self._vector(text)
            rows.append(vector / np.linalg.norm(vector))
        return np.vstack(rows)


TOOL = ("booking api", "returned", "ROOM_UNAVAILABLE", "TOOL_FAILURE")
HOME = ("Ana", "lives in", "Madrid", "DECLARATIVE")
TEXTS = {
    "tool": "The booking API returned HTTP 409 ROOM_UNAVAILABLE. Ana lives in Madrid.",
    "a": "Note A: Ana lives in Madrid.",
    "b": "Note B: Ana lives in Madrid.",
    "c": "Note C: Ana lives in Madrid.",
    "paris": "I live in Paris.",
    "berlin": "I moved: I live in Berlin now.",
    "tool again": "The booking API returned ROOM_UNAVAILABLE again.",
}
SCRIPT = {
    TEXTS["tool"]: [TOOL, HOME],
    TEXTS["a"]: [HOME],
    TEXTS["b"]: [HOME],
    TEXTS["c"]: [HOME],
    TEXTS["paris"]: [("Ana", "lives in", "Paris", "DECLARATIVE")],
    TEXTS["berlin"]: [("Ana", "lives in", "Berlin", "DECLARATIVE")],
    TEXTS["tool again"]: [TOOL],
}
MAY_8, JUNE_10 = (
    datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc).timestamp(),
    datetime(2023, 6, 10, 9, 0, tzinfo=timezone.utc).timestamp(),
)


def harness(redis_url: str | None = None, **settings) -> InProcess:
    return InProcess(redis_url, CategoryExtractor(SCRIPT), PrefixEmbedder(), tau=1, **settings)


async def sweep(ip: InProcess, now: float) -> int:
    """The expiry sweep at `now`: over every tenant in process; on the shared stack's Redis only
    over this test's (others' tenants are there too)."""
    return await ip.pipeline.expire_lapsed(
        now=now, tenants=None if isinstance(ip.memory, InMemoryStore) else [ip.tenant]
    )


async def fact_named(ip: InProcess, head: str, tail: str):
    found = [f for f in (await ip.facts()).values() if (f.head, f.tail) == (head, tail)]
    assert len(found) == 1, found
    return found[0]


async def fact_edge(ip: InProcess, fact) -> float:
    """The weight of the fact edge between the fact's entities (0: none)."""
    head, tail = entity_node(fact.head_id), entity_node(fact.tail_id)
    async for edges in ip.memory.adjacency(ip.tenant, [head, tail]):
        for edge in edges:
            if edge.kind == "fact" and {edge.a, edge.b} == {head, tail}:
                return edge.weight
    return 0.0


def used(answer: dict) -> set[str]:
    """The fact ids a query answer used: its facts and its seeds."""
    return {f["id"] for f in answer["facts"]} | {f["id"] for f in answer.get("seeds", {}).get("facts", [])}


def events_of(ip: InProcess, fact_id: str, kind: str) -> list[dict]:
    return [e for e in ip.events() if e["fact_id"] == fact_id and e["event"] == kind]


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_category_ttl_from_the_settings_expires_the_fact_once_and_drops_it_from_retrieval(redis_url):
    async def scenario():
        ip = harness(redis_url, ttl_seconds="TOOL_FAILURE=60,DECLARATIVE=0")
        try:
            before = time.time()
            await ip.publish("tool", TEXTS["tool"])
            tool, home = await fact_named(ip, "booking api", "ROOM_UNAVAILABLE"), await fact_named(ip, "Ana", "Madrid")
            assert tool.status == home.status == "active" and home.expires_at is None
            assert before + 60 <= tool.expires_at <= time.time() + 60
            assert tool.id in used(await ip.query(tool.text)) and await fact_edge(ip, tool) == 1.0

            # lapsed, not swept yet: queries already leave it out
            ip.query_engine().clock = lambda: tool.expires_at + 1
            assert tool.id not in used(await ip.query(tool.text)) and tool.id not in used(
                await ip.query(tool.text, mode="dense")
            )
            assert await sweep(ip, tool.expires_at - 1) == 0  # not lapsed then: nothing to do

            # the sweep: one expired event, no edge; twice, or two at once: still one
            lapsed_by = tool.expires_at + 1
            assert await sweep(ip, lapsed_by) == 1
            assert await sweep(ip, lapsed_by) == 0
            await asyncio.gather(sweep(ip, lapsed_by + 5), sweep(ip, lapsed_by + 5))
            [expired] = events_of(ip, tool.id, "expired")
            assert expired["fact"]["status"] == "expired" and "TTL lapsed" in expired["reason"]
            # a date a reader can read, not seconds since the epoch
            lapsed_on = datetime.fromtimestamp(tool.expires_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            assert expired["reason"] == f"TTL lapsed at {lapsed_on}"
            stored = await ip.memory.fact(ip.tenant, tool.id)
            assert stored.status == "expired" and stored.expired_at and await fact_edge(ip, tool) == 0.0
            ip.query_engine().clock = time.time
            assert tool.id not in used(await ip.query(tool.text)) and tool.id not in used(
                await ip.query(tool.text, mode="dense")
            )
            # the DECLARATIVE fact of the same passage never lapses
            assert (await ip.memory.fact(ip.tenant, home.id)).status == "active" and home.id in used(
                await ip.query(home.text)
            )
            assert await ip.memory.lapsed_facts(ip.tenant, lapsed_by + 10**9) == []
        finally:
            await ip.close()

    run(scenario())


def test_a_document_ttl_from_metadata_and_the_latest_lapse_of_several_passages(redis_url):
    async def scenario():
        ip = harness(redis_url, ttl_seconds="DECLARATIVE=100000")
        try:
            await ip.publish("a", TEXTS["a"], metadata={"ttl_seconds": 30})
            home = await fact_named(ip, "Ana", "Madrid")
            assert home.expires_at == pytest.approx(
                home.created_at + 30, abs=5
            )  # the document's TTL, not the setting's
            await ip.publish("b", TEXTS["b"], metadata={"ttl_seconds": {"DECLARATIVE": 600, "TOOL_FAILURE": 5}})
            held = (await fact_named(ip, "Ana", "Madrid")).expires_at
            assert held == pytest.approx(home.created_at + 600, abs=5)  # supported by both: until the later lapse
            assert await sweep(ip, home.expires_at + 1) == 0  # the first passage alone lapsed
            assert await sweep(ip, held + 1) == 1
            assert len(events_of(ip, home.id, "expired")) == 1

            # said again after it expired: back in memory, until the new passage's support lapses (never: no TTL)
            await ip.publish("c", TEXTS["c"], metadata={"ttl_seconds": {"DECLARATIVE": 0}})
            back = await fact_named(ip, "Ana", "Madrid")
            assert back.status == "active" and back.expires_at is None and await fact_edge(ip, back) == 1.0
            assert [e["event"] for e in ip.events() if e["fact_id"] == home.id][-1] == "activated"
            assert home.id in used(await ip.query(home.text))
            assert await sweep(ip, held + 10**6) == 0
        finally:
            await ip.close()

    run(scenario())


def test_invalidation_drops_the_fact_and_as_of_answers_with_the_fact_valid_then(redis_url):
    async def scenario():
        ip = harness(redis_url)
        try:
            await ip.publish("paris", TEXTS["paris"], speaker="Ana", ts=MAY_8)
            await ip.publish("berlin", TEXTS["berlin"], speaker="Ana", ts=JUNE_10)
            paris, berlin = await fact_named(ip, "Ana", "Paris"), await fact_named(ip, "Ana", "Berlin")
            # a turn's fact holds from the turn on; the excluded one until the other begins
            assert (paris.valid_from, berlin.valid_from) == ("2023-05-08T13:56:00Z", "2023-06-10T09:00:00Z")
            assert paris.status == "invalid" and paris.invalid_at == berlin.valid_from and berlin.status == "active"
            [invalidated] = events_of(ip, paris.id, "invalidated")
            assert invalidated["fact"]["status"] == "invalid"
            assert await fact_edge(ip, paris) == 0.0 and await fact_edge(ip, berlin) == 1.0

            for mode in ("ppr", "dense", "reconstruct"):
                now = await ip.query("Ana live in", mode=mode)
                assert berlin.id in used(now) and paris.id not in used(now), mode
                assert paris.id not in used(await ip.query(paris.text, mode=mode))
                then = await ip.query("Ana live in", mode=mode, as_of="2023-05-20T12:00:00Z")
                assert used(then) == {paris.id}, mode
                assert used(await ip.query("Ana live in", mode=mode, as_of="2023-07-01")) == {berlin.id}
                assert used(await ip.query("Ana live in", mode=mode, as_of="2023-01-01")) == set()
        finally:
            await ip.close()

    run(scenario())


def test_the_sweep_decides_again_when_the_resolver_changes_the_fact_under_it(redis_url):
    async def scenario():
        ip = harness(redis_url, ttl_seconds="TOOL_FAILURE=60")
        try:
            await ip.publish("tool", TEXTS["tool"])
            tool = await fact_named(ip, "booking api", "ROOM_UNAVAILABLE")
            bump, raced = ip.memory.bump_graph_version, []

            async def bump_and_race(tenant):  # the sweep has read the fact active: another stage invalidates it now
                if not raced:
                    raced.append(True)
                    pipe, fact = ip.memory.pipeline(tenant), await ip.memory.fact(tenant, tool.id)
                    ip.pipeline.expiry.lifecycle.invalidate(
                        pipe, tenant, fact, await bump(tenant), {}, "excluded meanwhile"
                    )
                    await pipe.execute()
                return await bump(tenant)

            ip.memory.bump_graph_version = bump_and_race
            assert await sweep(ip, tool.expires_at + 1) == 1
            stored = await ip.memory.fact(ip.tenant, tool.id)
            assert raced and stored.status == "expired" and await fact_edge(ip, tool) == 0.0
            [expired] = events_of(ip, tool.id, "expired")
            assert expired["reason"].startswith("TTL lapsed")
        finally:
            await ip.close()

    run(scenario())


@pytest.mark.parametrize("category", ["HARD_CONSTRAINT", "REJECTED_OPTION"])
def test_constraints_and_rejections_keep_the_boost(category):
    graph = SparseGraph()
    for node in ("e:a", "e:b", "e:c", "e:d"):
        graph.node(node)
    facts = [FactHit("f1", "e:a", "e:b", 0.8, category), FactHit("f2", "e:c", "e:d", 0.8, "DECLARATIVE")]
    seeds = seed(graph, PassageStats(), {}, 1, facts, [], [], RetrievalParams())
    assert seeds.entities["e:a"] == pytest.approx(1.35 * seeds.entities["e:c"])


def test_bad_ttls_are_refused_by_name():
    with pytest.raises(ValueError, match="MEMSTREAM_TTL_SECONDS: unknown fact category 'TOOL'"):
        Settings.from_env({"MEMSTREAM_TTL_SECONDS": "TOOL=5"})
    with pytest.raises(ValueError, match="MEMSTREAM_TTL_SECONDS: TOOL_FAILURE='soon'"):
        Settings.from_env({"MEMSTREAM_TTL_SECONDS": "TOOL_FAILURE=soon"})
    assert Settings.from_env({"MEMSTREAM_TTL_SECONDS": " TOOL_FAILURE=86400, DECLARATIVE=0 "}).category_ttls == {
        "TOOL_FAILURE": 86400,
        "DECLARATIVE": 0,
    }
    assert parse_ttl_setting("") == {}
    with pytest.raises(ValueError, match=r"metadata.ttl_seconds must be a whole number"):
        document_ttls({"ttl_seconds": "1d"})
    with pytest.raises(ValueError, match=r"metadata.ttl_seconds.DECLARATIVE must be"):
        document_ttls({"ttl_seconds": {"DECLARATIVE": -1}})

    async def scenario():
        ip = harness()
        try:
            await ip.publish("a", TEXTS["a"], metadata={"ttl_seconds": {"SOMETIMES": 5}})
            [letter] = ip.dead_letters()
            assert (
                "documents: metadata.ttl_seconds: unknown fact category 'SOMETIMES'" in letter["error"]
            )  # refused at decode
            assert await ip.facts() == {}
        finally:
            await ip.close()

    run(scenario())


def test_bad_as_of_is_a_400_naming_the_field():
    with pytest.raises(ContractError, match="'as_of' is 'yesterday', not an ISO 8601 time"):
        QueryRequest.from_json({"query": "x", "as_of": "yesterday"}, "default", 5)
    with pytest.raises(ContractError, match="'as_of' must be an ISO 8601 time"):
        QueryRequest.from_json({"query": "x", "as_of": 1683554160}, "default", 5)
    assert QueryRequest.from_json({"query": "x", "as_of": "2023-05-08T13:56:00Z"}, "default", 5).as_of == MAY_8

    async def requests(client):
        return await post(client, b'{"query": "x", "as_of": "last May"}')

    embedder = GatedEmbedder()
    status, _, answer = serve(Settings(redis_url=NO_REDIS), embedder, requests)
    assert status == 400 and "'as_of' is 'last May', not an ISO 8601 time" in answer["error"] and embedder.calls == 0


def test_the_as_of_rule_reads_event_time_when_known_else_transaction_time():
    may, june = world_time("2023-05"), world_time("2023-06")
    event = dict(
        event_start="2023-05",
        event_end="2023-05",
        created_at=june + 10**7,
        expired_at=None,
        expires_at=None,
        activated_at=june,
    )
    assert was_valid(may + 1, **event) and not was_valid(june, **event)  # "2023-05" ends when June begins
    system = dict(event_start="", event_end="", created_at=may, expired_at=june, expires_at=None, activated_at=may)
    assert was_valid(may, **system) and not was_valid(june, **system) and not was_valid(may - 1, **system)
    assert not was_valid(may, **{**system, "activated_at": None})


def test_a_fact_never_activated_or_past_its_lapse_was_not_valid():
    may, june = world_time("2023-05"), world_time("2023-06")
    # excluded from birth (invalid, never activated): a status past "pending" is not enough
    assert not was_valid(
        may + 1,
        event_start="2023-05",
        event_end="2023-06",
        created_at=may,
        expired_at=may,
        expires_at=None,
        activated_at=None,
    )
    # its TTL lapsed (swept or not): transaction time ends at the earlier of expired_at and expires_at
    lapsing = dict(event_start="", event_end="", created_at=may, expired_at=None, expires_at=june, activated_at=may)
    assert was_valid(june - 1, **lapsing) and not was_valid(june, **lapsing) and not was_valid(june + 10**6, **lapsing)
    assert not was_valid(may + 10, **{**lapsing, "expired_at": may + 10})


def test_as_of_leaves_out_a_lapsed_fact_not_swept_yet(redis_url):
    async def scenario():
        ip = harness(redis_url, ttl_seconds="TOOL_FAILURE=60")
        try:
            await ip.publish("tool", TEXTS["tool"])
            tool = await fact_named(ip, "booking api", "ROOM_UNAVAILABLE")

            def iso(at: float) -> str:
                return datetime.fromtimestamp(at, tz=timezone.utc).isoformat()

            assert tool.id in used(await ip.query(tool.text, as_of=iso(tool.expires_at - 1)))
            assert tool.id not in used(await ip.query(tool.text, as_of=iso(tool.expires_at + 1)))
        finally:
            await ip.close()

    run(scenario())


def test_the_sweep_decides_again_when_a_new_passage_moves_the_lapse_under_it(redis_url):
    """The status stays active, only expires_at moves: the sweep's commit is fenced on it too,
    and the fact stays in the expiry index at its new lapse."""

    async def scenario():
        ip = harness(redis_url, ttl_seconds="TOOL_FAILURE=60")
        try:
            await ip.publish("tool", TEXTS["tool"])
            tool = await fact_named(ip, "booking api", "ROOM_UNAVAILABLE")
            bump, raced = ip.memory.bump_graph_version, []

            async def bump_and_race(
                tenant,
            ):  # the sweep has read the fact lapsed: a passage supports it for an hour now
                if not raced:
                    raced.append(True)
                    await ip.publish("again", TEXTS["tool again"], metadata={"ttl_seconds": {"TOOL_FAILURE": 3600}})
                return await bump(tenant)

            ip.memory.bump_graph_version = bump_and_race
            assert await sweep(ip, tool.expires_at + 1) == 0
            stored = await ip.memory.fact(ip.tenant, tool.id)
            assert raced and stored.status == "active" and stored.expires_at >= tool.expires_at + 3000
            assert events_of(ip, tool.id, "expired") == [] and await fact_edge(ip, tool) == 1.0
            assert await ip.memory.lapsed_facts(ip.tenant, stored.expires_at + 1) == [(tool.id, stored.expires_at)]
            assert await sweep(ip, stored.expires_at + 1) == 1  # its real lapse expires it
            assert len(events_of(ip, tool.id, "expired")) == 1
        finally:
            await ip.close()

    run(scenario())


async def stored_fields(ip: InProcess, fact_id: str) -> set[str]:
    """The fields of the fact as the store holds it (test-only peek at each store's layout)."""
    if isinstance(ip.memory, InMemoryStore):
        return set(ip.memory._tenant(ip.tenant).records["facts"][fact_id])
    return {k.decode() for k in await ip.memory.shard(ip.tenant).hkeys(ip.memory.keys(ip.tenant).fact(fact_id))}


async def tenant_key_count(ip: InProcess) -> int | None:
    if isinstance(ip.memory, InMemoryStore):
        return None
    return len(await ip.memory.shard(ip.tenant).keys(ip.memory.keys(ip.tenant).base + ":*"))


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_no_lapse_record_without_a_ttl_and_forever_wins_in_either_order(redis_url, order):
    """Doc "a" has no TTL, doc "b" one of 60 s: in either order Ana's home never lapses; before
    any TTL applies the fact carries no expires_at and the store no key for it."""

    async def scenario():
        ip = harness(redis_url)
        try:
            ttl = {"a": {}, "b": {"ttl_seconds": 60}}
            first, second = order
            await ip.publish(first, TEXTS[first], metadata=ttl[first])
            home = await fact_named(ip, "Ana", "Madrid")
            if first == "a":
                assert "expires_at" not in await stored_fields(ip, home.id)
                keys_before = await tenant_key_count(ip)
            else:
                assert home.expires_at and await ip.memory.lapsed_facts(ip.tenant, home.expires_at) == [
                    (home.id, home.expires_at)
                ]
            await ip.publish(second, TEXTS[second], metadata=ttl[second])
            home = await fact_named(ip, "Ana", "Madrid")
            assert home.expires_at is None and "expires_at" not in await stored_fields(ip, home.id)
            assert await ip.memory.lapsed_facts(ip.tenant, time.time() + 10**9) == []
            assert (
                await sweep(ip, time.time() + 10**6) == 0
                and (await ip.memory.fact(ip.tenant, home.id)).status == "active"
            )
            if first == "a" and keys_before is not None:  # the TTL'd passage adds no key of its own for the fact
                after = await ip.memory.shard(ip.tenant).keys(ip.memory.keys(ip.tenant).base + ":*")
                assert not [k for k in after if b"lapse" in k]
        finally:
            await ip.close()

    run(scenario())


def test_world_time_of_extreme_and_garbage_dates_never_raises():
    assert world_time("9999-12", end=True) == world_time("9999", end=True) == float("inf")
    assert world_time("9999-12-31", end=True) == world_time("9999-12-31") + 86400
    assert world_time("0001") == datetime(1, 1, 1, tzinfo=timezone.utc).timestamp()
    for garbage in ("0000", "2023-13", "2023-02-30", "yesterday", "10000", "-500", "", None):
        assert world_time(garbage) is None and world_time(garbage, end=True) is None, garbage
    for edge in ("0001-01-01T00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01", "9999-12-31T23:59:59.999999"):
        world_time(edge), world_time(edge, end=True)  # a number or None, never an exception
    # one reading of ISO times (topics.times.iso_moment): "Z" and "z" are UTC, no zone is UTC
    for text in ("2023-05-08T13:56:00Z", "2023-05-08T13:56:00z", "2023-05-08T13:56:00", "2023-05-08T15:56:00+02:00"):
        assert iso_moment(text) == parse_as_of(text) == parse_time(text) == world_time(text) == MAY_8, text


def test_a_ts_out_of_range_is_refused_by_the_contract_and_a_plain_documents_metadata_ts_is_no_turn_time():
    millis = MAY_8 * 1000
    with pytest.raises(
        ContractError,
        match=r"'ts' must be seconds since the epoch within years 1-9999 \(got 1.68\d*e\+12: milliseconds\?\)",
    ):
        Document.from_dict({"tenant": "t", "doc_id": "d", "text": "x", "ts": millis})
    with pytest.raises(ContractError, match="turns.jsonl:1: 'ts' must be seconds since the epoch.*milliseconds"):
        turn_from_json({"session_id": "s", "turn": 0, "speaker": "Ana", "text": "x", "ts": millis}, "turns.jsonl:1")
    assert parse_time(millis) is None and parse_time(-1e15) is None and parse_time(MAY_8) == MAY_8
    assert Document.from_dict({"tenant": "t", "doc_id": "d", "text": "x", "ts": MAY_8}).ts == MAY_8
    assert turn_time({"ts": millis}) == ""  # what is already on a topic: no crash either

    async def scenario():
        ip = harness()
        try:
            await ip.publish("late", "bad time", speaker="Ana", session_id="s", turn=0, ts=millis)
            [letter] = ip.dead_letters()
            assert "'ts' must be seconds since the epoch" in letter["error"] and "milliseconds?" in letter["error"]
            # a plain document's own metadata "ts" is no turn's time: its facts get no valid_from from it
            await ip.publish("paris", TEXTS["paris"], metadata={"ts": MAY_8, "source": "notes"})
            paris = await fact_named(ip, "Ana", "Paris")
            assert paris.valid_from is None
            [passage] = await ip.memory.passages(ip.tenant, paris.passage_ids)
            assert passage["metadata"] == {"source": "notes"}
        finally:
            await ip.close()

    run(scenario())


def test_bad_ttls_in_metadata_are_refused_at_the_contract():
    for bad, named in (
        ("1d", "metadata.ttl_seconds must be a whole number"),
        ({"SOMETIMES": 5}, "metadata.ttl_seconds: unknown fact category"),
        ({"DECLARATIVE": -1}, "metadata.ttl_seconds.DECLARATIVE must be"),
    ):
        with pytest.raises(ContractError, match=named):
            Document.from_dict({"tenant": "t", "doc_id": "d", "text": "x", "metadata": {"ttl_seconds": bad}})
    assert Document.from_dict(
        {"tenant": "t", "doc_id": "d", "text": "x", "metadata": {"ttl_seconds": {"TOOL_FAILURE": 60}}}
    )


MARRIED = {
    "Ana married Ben.": [("Ana", "married to", "Ben", "DECLARATIVE")],
    "Ben married Ana.": [("Ben", "married to", "Ana", "DECLARATIVE")],
}


async def merged_pair(ip: InProcess) -> tuple:
    """(target, source) of the two "married to" facts, the source merged into the target."""
    [source] = [f for f in (await ip.facts()).values() if f.status == "merged"]
    return await ip.memory.fact(ip.tenant, source.merged_into), source


@pytest.mark.parametrize("order", ["target first", "source first"])
def test_a_merge_carries_the_sources_lapse_so_forever_wins_and_the_source_leaves_the_index(redis_url, order):
    """ "Ben married Ana" (the canonical fact of the two: the smaller id) is said with a 60 s TTL,
    "Ana married Ben" without: merged (by the resolver when the target came first, by the
    detector when it came second), the target never lapses, as if both passages supported one
    fact."""

    async def scenario():
        ip = InProcess(redis_url, CategoryExtractor(MARRIED), PrefixEmbedder(), tau=1)
        try:
            publish = [("ttl", "Ben married Ana.", {"ttl_seconds": 60}), ("forever", "Ana married Ben.", {})]
            for doc_id, text, metadata in publish if order == "target first" else publish[::-1]:
                await ip.publish(doc_id, text, metadata=metadata)
            target, source = await merged_pair(ip)
            assert (target.head, target.status, source.head) == ("Ben", "active", "Ana") and len(
                target.passage_ids
            ) == 2
            assert target.expires_at is None and "expires_at" not in await stored_fields(ip, target.id)
            assert await ip.memory.lapsed_facts(ip.tenant, time.time() + 10**9) == []
            assert (
                await sweep(ip, time.time() + 10**6) == 0
                and (await ip.memory.fact(ip.tenant, target.id)).status == "active"
            )
        finally:
            await ip.close()

    run(scenario())


def test_a_merge_keeps_the_later_lapse_of_source_and_target_and_drops_the_sources_index_entry(redis_url):
    async def scenario():
        ip = InProcess(redis_url, CategoryExtractor(MARRIED), PrefixEmbedder(), tau=1)
        try:
            await ip.publish("short", "Ben married Ana.", metadata={"ttl_seconds": 30})
            await ip.publish("long", "Ana married Ben.", metadata={"ttl_seconds": 600})
            target, source = await merged_pair(ip)
            assert source.expires_at > target.created_at + 500 and target.expires_at == source.expires_at
            assert await ip.memory.lapsed_facts(ip.tenant, time.time() + 10**9) == [(target.id, source.expires_at)]
            assert await sweep(ip, target.created_at + 100) == 0  # the target's own 30 s lapsed: not the merged support
            assert await sweep(ip, source.expires_at + 1) == 1 and len(events_of(ip, target.id, "expired")) == 1
        finally:
            await ip.close()

    run(scenario())


def test_an_expired_fact_brought_back_after_the_sweep_passed_its_new_lapse_is_swept_again(redis_url):
    """The interleaving: a new passage moves an expired fact's lapse to L2; the sweep reaches L2
    while the fact is still `expired` (nothing to expire: its index entry goes); then the
    detector brings it back. Active again, it must be in the index again, and be expired at L2."""

    async def scenario():
        ip = harness(redis_url, ttl_seconds="TOOL_FAILURE=60")
        try:
            await ip.publish("tool", TEXTS["tool"])
            tool = await fact_named(ip, "booking api", "ROOM_UNAVAILABLE")
            assert await sweep(ip, tool.expires_at + 1) == 1
            bump, raced = ip.memory.bump_graph_version, []

            async def sweep_past_the_new_lapse(
                tenant,
            ):  # the passage is extracted, the detector at work: the sweep runs now
                fact = await ip.memory.fact(tenant, tool.id)
                if not raced and fact.expires_at != tool.expires_at:
                    raced.append(fact)
                    assert fact.status == "expired" and await sweep(ip, fact.expires_at + 1) == 0
                return await bump(tenant)

            ip.memory.bump_graph_version = sweep_past_the_new_lapse
            await ip.publish("again", TEXTS["tool again"], metadata={"ttl_seconds": {"TOOL_FAILURE": 3600}})
            ip.memory.bump_graph_version = bump
            back = await ip.memory.fact(ip.tenant, tool.id)
            lapse = raced[0].expires_at
            assert (
                back.status == "active"
                and back.expires_at == lapse >= tool.expires_at + 3000
                and await fact_edge(ip, back) == 1.0
            )
            assert await ip.memory.lapsed_facts(ip.tenant, lapse + 1) == [(tool.id, lapse)]
            assert await sweep(ip, lapse + 1) == 1
            assert (await ip.memory.fact(ip.tenant, tool.id)).status == "expired" and await fact_edge(ip, back) == 0.0
            assert (
                len(events_of(ip, tool.id, "expired")) == 2
                and await ip.memory.lapsed_facts(ip.tenant, lapse + 10**6) == []
            )
        finally:
            await ip.close()

    run(scenario())


def test_a_fact_never_activated_expires_without_an_event(redis_url):
    """Before: a pending fact whose TTL lapsed emitted `expired`, though no event had ever told
    subscribers it had held. Now it leaves memory silently (its one event: `pending`, when it was
    held behind the τ gate); an active one still says `expired`."""

    async def scenario():
        ip = InProcess(
            redis_url, CategoryExtractor(SCRIPT), PrefixEmbedder(), tau=2, ttl_seconds="TOOL_FAILURE=60,DECLARATIVE=60"
        )
        try:
            await ip.publish("paris", TEXTS["paris"])  # one passage: its schema is a candidate, the fact pending
            pending = await fact_named(ip, "Ana", "Paris")
            await sweep(ip, time.time() + 120)
            return pending, await fact_named(ip, "Ana", "Paris"), ip.events()
        finally:
            await ip.close()

    pending, expired, events = run(scenario())
    assert pending.status == "pending" and expired.status == "expired"
    assert [e["event"] for e in events if e["fact_id"] == expired.id] == ["pending"]
