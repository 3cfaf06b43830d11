"""MemGraphRAG's memory mechanisms, the stages in this process (tests/inprocess.py) with the
replay extractor: the streaming τ gate (also under interleaved deliveries over four partitions
and redeliveries), conflict resolution per kind, idempotent republishing, order independence,
the ablation switches, aliases, a promoted symmetric twin. Kafka itself is tested by
test_end_to_end (the CLI, dead letters, tenants) and the crash and chaos tests; what these tests
show is the stages' logic, which needs no broker.

The tests that deliver one message at a time run on both stores (`store`): the test stack's
Redis and the in-memory store, which needs no stack (`make test-unit`). The interleaved ones
stay on Redis: their interleavings follow its round trips."""

import asyncio
import contextlib
import json
import random
from collections import Counter, defaultdict

import pytest

from tests import inprocess
from tests.conftest import Cli
from tests.inprocess import Delivery, InProcess
from topics.records import Triple
from workers.algorithms.normalize import canonical_fact, content_hash, entity_id, fact_id
from workers.models.extraction import ReplayExtractor


def fact(head, head_type, relation, tail, tail_type, valid_from=None, valid_to=None):
    return {
        "head": head,
        "head_type": head_type,
        "relation": relation,
        "tail": tail,
        "tail_type": tail_type,
        "category": "DECLARATIVE",
        "valid_from": valid_from,
        "valid_to": valid_to,
    }


def fid(f) -> str:
    """The id memory gives a scripted fact: in its canonical voice ("built" is kept as "built by")."""
    t = canonical_fact(Triple(head=f["head"], relation=f["relation"], tail=f["tail"]))
    return fact_id(entity_id(t.head), t.relation, entity_id(t.tail))


def write_script(path, corpus: dict[str, tuple[str, list[dict]]]):
    """corpus: doc_id → (text, facts). One replay line per document (each is one chunk)."""
    with open(path, "w") as out:
        for text, facts in corpus.values():
            entities = {(f["head"], f["head_type"]) for f in facts} | {(f["tail"], f["tail_type"]) for f in facts}
            out.write(
                json.dumps(
                    {
                        "text_sha256": content_hash(text),
                        "entities": [{"name": n, "type": t} for n, t in sorted(entities)],
                        "facts": facts,
                    }
                )
                + "\n"
            )
    return path


real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.stack), "memory"])
def store(request) -> str | None:
    """Where the stages keep the memory: replay_stages' `redis_url`, the test stack's Redis or
    None for an InMemoryStore (that variant needs no stack)."""
    return request.getfixturevalue("stack_env")["MEMSTREAM_REDIS_URL"] if request.param == "redis" else None


@contextlib.asynccontextmanager
async def replay_stages(redis_url: str | None, script, embedder=None, **settings):
    """The stages with the replay extractor over `script` (a file written by write_script) for
    a fresh tenant, on Redis at `redis_url` or (None) an InMemoryStore; `settings` as a
    worker's MEMSTREAM_* variables."""
    stages = InProcess(redis_url, ReplayExtractor(script), embedder, **settings)
    try:
        yield stages
    finally:
        await stages.close()


async def publish(stages: InProcess, corpus, doc_ids) -> None:
    """`memstream publish DOC… --wait`: all the documents at once, in the given order, then wait
    until everything they caused is delivered."""
    for doc in doc_ids:
        await stages.publish(doc, corpus[doc][0], wait=False)
    await stages.drain()


def run(coro):
    return asyncio.run(coro)


def facts_by_id(memory: dict) -> dict:
    return {f["id"]: f for f in memory["facts"]}


def once_each(events: list[dict]) -> list[dict]:
    """The events with the duplicates a redelivery can cause dropped (as a consumer of
    indexed-facts does, by event id) — after checking that no id carries two contents."""
    by_id = {}
    for event in events:
        assert by_id.setdefault(event["event_id"], event) == event, f"event id {event['event_id']} with two contents"
    return list(by_id.values())


# ---- τ gate ---------------------------------------------------------------------------------
FOUNDING = {
    "falk": (
        "Ines Falk founded Falk Ropes in the harbour district.",
        [fact("Ines Falk", "PERSON", "founded", "Falk Ropes", "COMPANY")],
    ),
    "pike": (
        "Oren Pike founded Pike Sails after the war.",
        [fact("Oren Pike", "PERSON", "founded", "Pike Sails", "COMPANY")],
    ),
}


def test_a_schema_seen_once_is_pending_until_a_second_passage_activates_both(store, tmp_path):
    async def scenario():
        async with replay_stages(store, write_script(tmp_path / "s.jsonl", FOUNDING)) as stages:
            await publish(stages, FOUNDING, ["falk"])
            before = await stages.export(), stages.events()
            await publish(stages, FOUNDING, ["pike"])
            return before, (await stages.export(), stages.events())

    (memory, events), (memory_after, events_after) = run(scenario())
    (schema,) = memory["schemas"]
    assert (schema["status"], schema["frequency"]) == ("candidate", 1)
    assert [f["status"] for f in memory["facts"]] == ["pending"]
    assert [(e["event"], e["fact_id"]) for e in events] == [
        ("pending", memory["facts"][0]["id"])
    ]  # held behind the τ gate, once

    memory = memory_after
    assert (memory["schemas"][0]["status"], memory["schemas"][0]["frequency"]) == ("stable", 2)
    assert {f["status"] for f in memory["facts"]} == {"active"}
    assert sorted(e["fact_id"] for e in events_after if e["event"] == "activated") == sorted(
        fid(f) for _, fs in FOUNDING.values() for f in fs
    )
    assert [e["event"] for e in events_after] == ["pending", "activated", "activated"]


def _gate_corpus(n: int) -> dict:
    """n founders and n products (two schemas that become stable) plus one singleton schema."""
    firsts = ["Ines", "Oren", "Tove", "Bram", "Lena", "Milo", "Saga", "Ravi", "Nora", "Ugo", "Edda", "Kai"]
    crafts = [
        "Ropes",
        "Sails",
        "Clocks",
        "Lanterns",
        "Barrels",
        "Maps",
        "Bells",
        "Looms",
        "Kites",
        "Oars",
        "Nets",
        "Glass",
    ]
    corpus = {}
    for i in range(n):
        person, company, product = f"{firsts[i]} Vell{i}", f"{crafts[i]} Guild{i}", f"{crafts[i].lower()} model {i}"
        corpus[f"g{i:02d}"] = (
            f"{person} founded {company}. {company} sells the {product}.",
            [
                fact(person, "PERSON", "founded", company, "COMPANY"),
                fact(company, "COMPANY", "sells", product, "PRODUCT"),
            ],
        )
    corpus["lone"] = (
        "Saga Holt painted The Grey Quay.",
        [fact("Saga Holt", "PERSON", "painted", "The Grey Quay", "ARTWORK")],
    )
    return corpus


# Two extractors on four partitions (the Kafka test this replaces) deliver chunks of different
# partitions at once and in no fixed order; here: four partitions, four messages in flight, in
# three seeded orders, the last also delivering a third of the messages twice.
GATE_DELIVERIES = [
    Delivery(partitions=4, consumers=4, seed=1),
    Delivery(partitions=4, consumers=4, seed=2),
    Delivery(partitions=4, consumers=4, seed=3, redeliver=0.33),
]


def test_tau_gate_activates_exactly_once_across_interleaved_partitions_and_redeliveries(stack_env, tmp_path):
    corpus = _gate_corpus(12)
    script = write_script(tmp_path / "s.jsonl", corpus)

    async def scenario(delivery):
        async with replay_stages(stack_env["MEMSTREAM_REDIS_URL"], script, delivery=delivery) as stages:
            await publish(stages, corpus, sorted(corpus))
            return await stages.export(), stages.events(), stages.broker.redeliveries

    for delivery in GATE_DELIVERIES:
        memory, events, redeliveries = run(scenario(delivery))
        status = {s["relation"]: (s["status"], s["frequency"]) for s in memory["schemas"]}
        assert status == {"found": ("stable", 12), "sell": ("stable", 12), "painted by": ("candidate", 1)}, (
            delivery
        )  # paint: a making verb, passive
        facts = facts_by_id(memory)
        lone = fid(corpus["lone"][1][0])
        assert facts[lone]["status"] == "pending"
        assert {f["status"] for i, f in facts.items() if i != lone} == {"active"} and len(facts) == 25

        if not delivery.redeliver:
            assert len({e["event_id"] for e in events}) == len(events)
        else:  # the deliveries really were repeated
            assert redeliveries > 0
        activated = Counter(e["fact_id"] for e in once_each(events) if e["event"] == "activated")
        assert set(activated) == set(facts) - {lone}
        assert set(activated.values()) == {1}, f"a fact was activated twice ({delivery})"


# ---- conflicts --------------------------------------------------------------------------------
CONFLICTS = {
    "m1": ("Mira Okafor was born in Bergen.", [fact("Mira Okafor", "PERSON", "born in", "Bergen", "CITY")]),
    "m2": (
        "Mira Okafor was born in Oslo, her passport says.",
        [fact("Mira Okafor", "PERSON", "born in", "Oslo", "CITY")],
    ),
    "m3": (
        "Parish records confirm Mira Okafor was born in Oslo.",
        [fact("Mira Okafor", "PERSON", "born in", "Oslo", "CITY")],
    ),
    "t1": (
        "Tomas Reed led Dunmore Cider from 1990 to 1999.",
        [fact("Tomas Reed", "PERSON", "led", "Dunmore Cider", "COMPANY", "1990", "1999")],
    ),
    "t2": (
        "Tomas Reed led Pellow Farms from 2000 to 2010.",
        [fact("Tomas Reed", "PERSON", "led", "Pellow Farms", "COMPANY", "2000", "2010")],
    ),
    "g0": ("Kestrel Point is located in Norland.", [fact("Kestrel Point", "PLACE", "located in", "Norland", "REGION")]),
    "g1": ("Anna Berg lives in Kestrel Point.", [fact("Anna Berg", "PERSON", "lives in", "Kestrel Point", "PLACE")]),
    "g2": ("Anna Berg lives in Norland, by the coast.", [fact("Anna Berg", "PERSON", "lives in", "Norland", "REGION")]),
    "d1": (
        "Ilse Marrow built the Varn Lighthouse.",
        [fact("Ilse Marrow", "PERSON", "built", "Varn Lighthouse", "LANDMARK")],
    ),
    "d2": (
        "The Varn Lighthouse was built by Ilse Marrow in spring.",
        [fact("Ilse Marrow", "PERSON", "built", "Varn Lighthouse", "LANDMARK")],
    ),
}


def _ids(doc):
    return fid(CONFLICTS[doc][1][0])


def test_each_conflict_kind_ends_in_its_memory_state_and_events(store, tmp_path):
    async def scenario():
        async with replay_stages(store, write_script(tmp_path / "s.jsonl", CONFLICTS), tau=1) as stages:
            for doc in ["m1", "m2", "m3", "t1", "t2", "g0", "g1", "g2", "d1", "d2"]:
                await publish(stages, CONFLICTS, [doc])
            return await stages.export(), stages.events()

    memory, tail = run(scenario())
    facts = facts_by_id(memory)
    events = defaultdict(list)
    for e in tail:
        events[e["fact_id"]].append(e)

    # no fact is ever deleted
    assert set(facts) == {_ids(d) for d in CONFLICTS}

    # mutual exclusion: the better-supported tail wins, the other is invalidated (kept, with a reason)
    oslo, bergen = facts[_ids("m2")], facts[_ids("m1")]
    assert oslo["status"] == "active" and len(oslo["passages"]) == 2
    assert bergen["status"] == "invalid" and bergen["expired_at"] and "excluded by" in bergen["reason"]
    last = events[_ids("m1")][-1]
    assert last["event"] == "invalidated" and last["reason"].startswith("mutual_exclusion")
    assert set(last["evidence_passage_ids"]) & set(oslo["passages"]) and set(bergen["passages"]) <= set(
        last["evidence_passage_ids"]
    )

    # temporal: both stay, each qualified with its span
    for doc, span in (("t1", ("1990", "1999")), ("t2", ("2000", "2010"))):
        f = facts[_ids(doc)]
        assert f["status"] == "active" and f["qualifiers"]["time"] == {"from": span[0], "to": span[1]}
        assert (f["valid_at"], f["invalid_at"]) == span
        assert any(e["event"] == "qualified" and e["reason"].startswith("temporal") for e in events[_ids(doc)])

    # granularity: the containment path Kestrel Point → Norland qualifies the scope
    city, region = facts[_ids("g1")], facts[_ids("g2")]
    assert city["status"] == region["status"] == "active"
    assert city["qualifiers"]["scope"] == {"narrower_than": [_ids("g2")], "broader_than": []}
    assert region["qualifiers"]["scope"] == {"narrower_than": [], "broader_than": [_ids("g1")]}
    assert any(e["event"] == "qualified" and "granularity" in e["reason"] for e in events[_ids("g2")])

    # duplicate: one fact, the union of provenance, one merged event
    lighthouse = facts[_ids("d1")]
    assert lighthouse["status"] == "active" and len(lighthouse["passages"]) == 2
    assert [e["event"] for e in events[_ids("d1")]] == ["activated", "merged"]


def _order_corpus():
    corpus = dict(_gate_corpus(6))
    corpus.update({k: v for k, v in CONFLICTS.items()})
    return corpus


def _comparable(memory: dict) -> dict:
    """Memory modulo system time, graph version and the wording of reasons."""
    skip = {"created_at", "activated_at", "expired_at", "reason"}
    return {
        "schemas": memory["schemas"],
        "facts": [{k: v for k, v in f.items() if k not in skip} for f in memory["facts"]],
        "entities": memory["entities"],
        "edges": memory["edges"],
    }


def test_publishing_twice_changes_nothing_and_order_does_not_matter(stack_env, tmp_path, real_embedder):
    """With the real embedder and the similarity bridge on, as a worker runs: the memories
    compared include the similarity edges, whose order independence is part of the promise."""
    corpus = _order_corpus()
    script = write_script(tmp_path / "s.jsonl", corpus)
    docs = sorted(corpus)
    mixed = docs[:]
    random.Random(7).shuffle(mixed)

    async def scenario():
        async with replay_stages(stack_env["MEMSTREAM_REDIS_URL"], script, real_embedder, sim_bridging=True) as ordered:
            for doc in docs:  # one at a time: the most sequential order
                await publish(ordered, corpus, [doc])
            first = await ordered.export()
            await publish(ordered, corpus, docs)  # everything again
            again = await ordered.export()
        # all at once, shuffled, across partitions with several messages in flight; then the
        # same with a third of the deliveries repeated
        others = []
        for delivery in (
            Delivery(partitions=2, consumers=4, seed=7),
            Delivery(partitions=2, consumers=4, seed=8, redeliver=0.33),
        ):
            async with replay_stages(
                stack_env["MEMSTREAM_REDIS_URL"], script, real_embedder, sim_bridging=True, delivery=delivery
            ) as shuffled:
                await publish(shuffled, corpus, mixed)
                others.append(await shuffled.export())
        return first, again, others

    first, again, others = run(scenario())
    assert again == first
    for second in others:
        assert _comparable(second) == _comparable(first)
    assert {f["status"] for f in first["facts"]} == {"active", "invalid", "pending"}


# ---- ablation switches --------------------------------------------------------------------
SWITCHES = {
    "a1": ("Vera Lind was born in Tromso.", [fact("Vera Lind", "PERSON", "born in", "Tromso", "CITY")]),
    "a2": (
        "Vera Lind was born in Tromso, the records say.",
        [fact("Vera Lind", "PERSON", "born in", "Tromso", "CITY")],
    ),
    "a3": ("Vera Lind was born in Narvik.", [fact("Vera Lind", "PERSON", "born in", "Narvik", "CITY")]),
    "a4": ("Vera Lind wrote The Salt Road.", [fact("Vera Lind", "PERSON", "wrote", "The Salt Road", "BOOK")]),
    "a5": ("Vera Lindt sailed to Narvik.", [fact("Vera Lindt", "PERSON", "sailed to", "Narvik", "CITY")]),
}


def test_each_ablation_switch_changes_behaviour(stack_env, tmp_path, real_embedder):
    """With the real embedder: the similarity bridge's case is a real cosine ('Vera Lind' ~
    'Vera Lindt')."""
    script = write_script(tmp_path / "s.jsonl", SWITCHES)

    async def scenario():
        results = {}
        for switch in ("defaults", "schema_filter", "conflicts", "sim_bridging", "type_bridging"):
            settings = {"sim_bridging": True, **({} if switch == "defaults" else {switch: False})}
            async with replay_stages(stack_env["MEMSTREAM_REDIS_URL"], script, real_embedder, **settings) as stages:
                await publish(stages, SWITCHES, sorted(SWITCHES))
                results[switch] = await stages.export()
        return results

    results = run(scenario())
    facts = {switch: facts_by_id(memory) for switch, memory in results.items()}
    kinds = {switch: Counter(e["kind"] for e in memory["edges"]) for switch, memory in results.items()}
    wrote, narvik = fid(SWITCHES["a4"][1][0]), fid(SWITCHES["a3"][1][0])
    # a schema seen once: pending with the gate, active without
    assert facts["defaults"][wrote]["status"] == "pending" and facts["schema_filter"][wrote]["status"] == "active"
    # a single-valued relation with two tails: the weaker is invalidated only with conflict handling
    assert facts["defaults"][narvik]["status"] == "invalid" and facts["conflicts"][narvik]["status"] == "active"
    # 'Vera Lind' ~ 'Vera Lindt' (cosine 0.88 >= 0.8)
    assert kinds["defaults"]["similar"] >= 1 and kinds["sim_bridging"]["similar"] == 0
    assert kinds["defaults"]["type"] >= 1 and kinds["type_bridging"]["type"] == 0


ALIASED = {
    "nyc": ("Lena Park moved to NYC in spring.", [fact("Lena Park", "PERSON", "moved to", "NYC", "CITY")]),
    "full": ("Omar Diaz moved to New York City.", [fact("Omar Diaz", "PERSON", "moved to", "New York City", "CITY")]),
}


def test_aliases_map_names_to_one_canonical_entity(stack_env, tmp_path):
    """The aliases go in through `memstream alias` (it needs only Redis), the documents through
    the stages in this process."""
    cli = Cli(stack_env)

    async def scenario():
        async with replay_stages(
            stack_env["MEMSTREAM_REDIS_URL"], write_script(tmp_path / "s.jsonl", ALIASED), tau=1
        ) as stages:
            listed = cli.run("alias", "add", "NYC", "New York City", "--tenant", stages.tenant).stdout
            bad = cli.run("alias", "add", "New York City", "NYC", "--tenant", stages.tenant, check=False)
            await publish(stages, ALIASED, sorted(ALIASED))
            return listed, bad, await stages.export()

    listed, bad, memory = run(scenario())
    assert "nyc -> new_york_city" in listed
    assert bad.returncode == 2 and "already an alias" in bad.stderr
    assert {f["tail_id"] for f in memory["facts"]} == {"new_york_city"}
    assert "nyc" not in {e["id"] for e in memory["entities"]}
    assert {f["relation"] for f in memory["facts"]} == {"move to"}


PROMOTED_SWAP = {
    "b": ("Ola Berg married Vera Lind.", [fact("Ola Berg", "ENTITY", "married", "Vera Lind", "PERSON")]),
    "d": ("Kai Moe married Edda Lund.", [fact("Kai Moe", "ENTITY", "married", "Edda Lund", "PERSON")]),
    "a": ("Vera Lind married Ola Berg in June.", [fact("Vera Lind", "PERSON", "married", "Ola Berg", "ENTITY")]),
    "c": ("Saga Holt married Bram Dahl.", [fact("Saga Holt", "PERSON", "married", "Bram Dahl", "ENTITY")]),
}


def test_a_promoted_fact_merges_into_its_symmetric_twin_with_its_own_passages(store, tmp_path):
    async def scenario():
        async with replay_stages(store, write_script(tmp_path / "s.jsonl", PROMOTED_SWAP)) as stages:
            for doc in ["b", "d", "a", "c"]:  # b, d: their schema is stable; a waits pending until c promotes it
                await publish(stages, PROMOTED_SWAP, [doc])
            return await stages.export()

    facts = facts_by_id(run(scenario()))
    a, b = fid(PROMOTED_SWAP["a"][1][0]), fid(PROMOTED_SWAP["b"][1][0])
    passage = {doc: content_hash(text)[:32] for doc, (text, _) in PROMOTED_SWAP.items()}
    assert facts[a]["status"] == "merged" and facts[a]["merged_into"] == b
    assert facts[b]["status"] == "active" and set(facts[b]["passages"]) == {passage["a"], passage["b"]}


OREN = "Oren Vale is a cartographer. Oren Vale lives in Tessaly."
MOVE = "Oren Vale moved to Lindqvist in 2021. Oren Vale lives in Lindqvist."


def test_an_edit_elsewhere_in_a_document_never_decides_a_conflict(redis_url):
    """Two documents say where Oren Vale lives, once each: the later statement holds. Fixing a
    typo in the older one (another sentence), or its whitespace, republishes it as version 2
    and 3: no fact's status may change (the tie went to the newer document version, which made
    the typo fix decide). A genuinely new claim is the later statement and holds."""
    from tests.inprocess import InProcess
    from workers.models.extraction import RulesExtractor

    async def main():
        stages = InProcess(redis_url, RulesExtractor(), tau=1)

        async def lives() -> dict[str, str]:
            return {f.tail: f.status for f in (await stages.facts()).values() if f.relation == "live in"}

        try:
            await stages.publish("oren-vale", OREN, version=1)
            await stages.publish("move-news", MOVE, version=1)
            seen = [await lives()]
            await stages.publish("oren-vale", OREN.replace("cartographer", "sailmaker"), version=2)
            seen.append(await lives())
            await stages.publish(
                "oren-vale", OREN.replace("cartographer", "sailmaker").replace(". ", ".\n\n"), version=3
            )
            seen.append(await lives())
            invalid = next(f for f in (await stages.facts()).values() if f.tail == "Tessaly")
            await stages.publish("oren-vale", "Oren Vale is a sailmaker. Oren Vale lives in Narn.", version=4)
            return seen, invalid.reason, await lives()
        finally:
            await stages.close()

    seen, reason, moved = asyncio.run(main())
    assert seen == [{"Tessaly": "invalid", "Lindqvist": "active"}] * 3
    assert reason.startswith("excluded by ") and "1 vs 1 supporting passages, first said later by a document" in reason
    assert moved["Narn"] == "active" and moved["Lindqvist"] == "invalid"
