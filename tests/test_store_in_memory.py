"""store.in_memory.InMemoryStore, the second implementation of the store's interface: the same
messages through the four stages must leave the same memory on it as on Redis's Memory.

Each scenario runs the stages in this process over one store (tests/inprocess.py's InProcess),
with a broker that delivers one message at a time, oldest first (its default order, the one that
does not depend on Redis round-trip times). On InMemoryStore alone the
scenarios need no stack (`make test-unit`) and check what the mechanism must do; with the
stack, each runs on Memory too, for the same tenant name, and the two runs must give the same
export (modulo system time), the same messages on every topic — fact events with their ids —
and the same query answers. Role by role (store.base's Outbox, Progress, Aliases, GraphWrites and
GraphReads), the same calls on each store (fixture redis_url) must give the same answers; the
other roles' are in the files of their features (tests/test_versions.py, test_erasure.py,
test_expiry.py, test_lexical.py, ...)."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import numpy as np
import pytest

from store import AlreadyDone, CauseNotInMemory, Committed, EdgeChange, Memory, Outgoing, StaleDecision
from store.facts import Fact
from store.in_memory import InMemoryStore
from tests.inprocess import DIMS, Delivery, DigitBlindEmbedder, InProcess
from tests.test_effectively_once import SynonymEmbedder
from tests.test_memory_agents import CONFLICTS, FOUNDING, PROMOTED_SWAP, fact, fid, write_script
from workers.algorithms.normalize import content_hash
from workers.models.extraction import ReplayExtractor

TIMES = ("created_at", "activated_at", "expired_at")


@dataclass(frozen=True)
class Scenario:
    """Documents published one after the other (doc id → (text, facts as test_memory_agents.fact
    gives them)), then queries."""

    corpus: dict[str, tuple[str, list[dict]]]
    order: tuple[str, ...]
    settings: dict = field(default_factory=dict)  # Settings fields, as a worker's MEMSTREAM_* variables
    embedder: type = DigitBlindEmbedder
    delivery: Delivery = Delivery()
    queries: tuple[dict, ...] = ()  # request bodies without the tenant


def scripted(texts: dict[str, str], facts: dict[str, list[tuple]]) -> dict:
    """A corpus from ScriptedExtractor-style facts: (head, relation, tail[, head type, tail type])."""
    return {
        doc: (
            text,
            [
                fact(f[0], f[3] if len(f) > 3 else "PERSON", f[1], f[2], f[4] if len(f) > 4 else "PLACE")
                for f in facts[doc]
            ],
        )
        for doc, text in texts.items()
    }


# the same scripts as tests/test_effectively_once.py's near-duplicate and twin tests
PEOPLE = scripted(
    {f"p{i}": f"Person{i} was born in London." for i in range(4)},
    {f"p{i}": [(f"Person{i}", "was born in", "London")] for i in range(4)},
)
SYNONYMS = scripted(
    {"a": "Ada Quill was born in Ostra.", "b": "Ada Quill is a native of Ostra."},
    {"a": [("Ada Quill", "born in", "Ostra")], "b": [("Ada Quill", "native of", "Ostra")]},
)
MARRIED = scripted(
    {"y": "Bram Reed married Ada Quill.", "x": "Ada Quill married Bram Reed."},
    {
        "x": [("Ada Quill", "married", "Bram Reed", "PERSON", "PERSON")],
        "y": [("Bram Reed", "married", "Ada Quill", "PERSON", "PERSON")],
    },
)
CONFLICT_ORDER = ("m1", "m2", "m3", "t1", "t2", "g0", "g1", "g2", "d1", "d2")

SCENARIOS = {
    "tau gate": Scenario(FOUNDING, ("falk", "pike")),
    "conflict kinds": Scenario(
        CONFLICTS,
        CONFLICT_ORDER,
        {"tau": 1},
        queries=(
            {"query": CONFLICTS["m3"][0]},
            {"query": CONFLICTS["g2"][0], "mode": "dense"},
            {"query": "Who built the Varn Lighthouse?", "top_k": 3},
        ),
    ),
    # with the similarity bridge: the Person entities are digit variants (cosine 1), bridged pairwise
    "near duplicates": Scenario(
        {**PEOPLE, **SYNONYMS},
        ("p0", "p1", "p2", "p3", "a", "b"),
        {"tau": 1, "sim_bridging": True},
        SynonymEmbedder,
        # cosine 1 to each Person passage; k above the passages: no tie is cut
        queries=({"query": "Person9 was born in London.", "top_k": 10, "params": {"layer_k": 10}},),
    ),
    "symmetric twins": Scenario({**PROMOTED_SWAP, **MARRIED}, ("b", "d", "a", "c", "y", "x")),
    # every message delivered twice, a copy once those queued before it are through (a consumer
    # that crashed before its ack), and the first fact event's publish failing after its commit
    "redelivered": Scenario(
        CONFLICTS, CONFLICT_ORDER, {"tau": 1}, delivery=Delivery(redeliver=1.0, fail_first_event=True)
    ),
}


async def run_scenario(redis_url: str | None, scenario: Scenario, tenant: str, script) -> tuple[dict, list, list, list]:
    """(export, messages sent, events, query answers (without their timings)) of the scenario on
    Redis's Memory at `redis_url`, or on an InMemoryStore when it is None."""
    stages = InProcess(
        redis_url,
        ReplayExtractor(script),
        scenario.embedder(),
        delivery=scenario.delivery,
        tenant=tenant,
        **scenario.settings,
    )
    try:
        for doc in scenario.order:
            await stages.publish(doc, scenario.corpus[doc][0])
        answers = []
        for body in scenario.queries:
            answer = await stages.query(body["query"], **{k: v for k, v in body.items() if k != "query"})
            answers.append({k: v for k, v in answer.items() if k != "timings_ms"})
        if scenario.delivery.fail_first_event:
            assert (
                stages.broker.failed_publishes == 1 and len(stages.broker.delivered) == 2 * stages.broker.redeliveries
            )  # the mode did fail and repeat
        return await stages.export(), stages.messages(), stages.events(), answers
    finally:
        await stages.close()


IN_MEMORY = None  # run_scenario's redis_url for an InMemoryStore


def without_times(export: dict) -> dict:
    """The export modulo system time: each time field says only whether it is set."""
    return {
        **export,
        "facts": [{k: (v is not None if k in TIMES else v) for k, v in f.items()} for f in export["facts"]],
    }


def tie_order(found):
    """Query answers with the items of equal score in one order: Memory.knn gives equally near
    records in no defined order (store.in_memory.InMemoryStore.knn)."""
    if isinstance(found, dict):
        return {k: tie_order(v) for k, v in found.items()}
    if isinstance(found, list) and found and all(isinstance(x, dict) and "score" in x for x in found):
        return sorted((tie_order(x) for x in found), key=lambda x: (-x["score"], json.dumps(x, sort_keys=True)))
    return [tie_order(x) for x in found] if isinstance(found, list) else found


def same_answers(found, expected) -> bool:
    """Equal, but for scores off by one unit of their sixth decimal: the two stores sum a
    cosine's float products in different orders (VecSim's SIMD lanes, numpy's), ~1e-7 apart,
    and a score rounded to six decimals on the boundary goes either way."""
    if isinstance(found, dict) and isinstance(expected, dict):
        return found.keys() == expected.keys() and all(
            abs(found[k] - expected[k]) <= 1.5e-6
            if k == "score" and isinstance(found[k], float) and isinstance(expected[k], float)
            else same_answers(found[k], expected[k])
            for k in found
        )
    if isinstance(found, list) and isinstance(expected, list):
        return len(found) == len(expected) and all(same_answers(a, b) for a, b in zip(found, expected))
    return found == expected


def facts_of(export: dict) -> dict:
    return {f["id"]: f for f in export["facts"]}


def passage(corpus, doc):
    return content_hash(corpus[doc][0])[:32]


# ---- the whole pipeline on InMemoryStore alone: what each mechanism must do --------------------
def test_the_tau_gate_holds_a_schema_seen_once_and_activates_both_on_the_second_passage(tmp_path):
    scenario = SCENARIOS["tau gate"]
    script = write_script(tmp_path / "s.jsonl", scenario.corpus)
    first = asyncio.run(run_scenario(IN_MEMORY, Scenario(FOUNDING, ("falk",)), "im-gate", script))
    second = asyncio.run(run_scenario(IN_MEMORY, scenario, "im-gate", script))
    assert [(s["status"], s["frequency"]) for s in first[0]["schemas"]] == [("candidate", 1)]
    assert [f["status"] for f in first[0]["facts"]] == ["pending"]
    assert [(e["event"], e["fact_id"]) for e in first[2]] == [("pending", first[0]["facts"][0]["id"])]
    assert [(s["status"], s["frequency"]) for s in second[0]["schemas"]] == [("stable", 2)]
    assert {f["status"] for f in second[0]["facts"]} == {"active"}
    assert sorted(e["fact_id"] for e in second[2] if e["event"] == "activated") == sorted(
        fid(f) for _, fs in FOUNDING.values() for f in fs
    )


def test_each_conflict_kind_ends_in_its_state(tmp_path):
    export, _, events, answers = asyncio.run(
        run_scenario(
            IN_MEMORY, SCENARIOS["conflict kinds"], "im-conflicts", write_script(tmp_path / "s.jsonl", CONFLICTS)
        )
    )
    facts, of = facts_of(export), {doc: fid(CONFLICTS[doc][1][0]) for doc in CONFLICTS}
    assert facts[of["m2"]]["status"] == "active" and facts[of["m1"]]["status"] == "invalid"  # mutual exclusion
    assert [facts[of[d]]["qualifiers"]["time"] for d in ("t1", "t2")] == [
        {"from": "1990", "to": "1999"},
        {"from": "2000", "to": "2010"},
    ]
    assert facts[of["g1"]]["qualifiers"]["scope"] == {"narrower_than": [of["g2"]], "broader_than": []}  # granularity
    assert facts[of["d1"]]["status"] == "active" and len(facts[of["d1"]]["passages"]) == 2  # duplicate
    assert [e["event"] for e in events if e["fact_id"] == of["d1"]] == ["activated", "merged"]
    assert len({e["event_id"] for e in events}) == len(events)
    assert answers[0]["mode"] == "ppr" and passage(CONFLICTS, "m3") in [p["id"] for p in answers[0]["passages"]]
    assert (answers[1]["passages"][0]["id"], answers[1]["passages"][0]["score"]) == (
        passage(CONFLICTS, "g2"),
        1.0,
    )  # its own text


def test_near_duplicates_merge_only_the_same_entities(tmp_path):
    scenario = SCENARIOS["near duplicates"]
    export, _, events, _ = asyncio.run(
        run_scenario(IN_MEMORY, scenario, "im-near", write_script(tmp_path / "s.jsonl", scenario.corpus))
    )
    facts = facts_of(export)
    assert sorted(f["head"] for f in facts.values() if f["status"] == "active") == [
        "Ada Quill",
        "Person0",
        "Person1",
        "Person2",
        "Person3",
    ]
    native, born = fid(SYNONYMS["b"][1][0]), fid(SYNONYMS["a"][1][0])
    assert (facts[native]["status"], facts[native]["merged_into"]) == ("merged", born)
    assert [e["event"] for e in events if e["event"] == "merged"] == ["merged"]
    similar = {(e["source"], e["target"]) for e in export["edges"] if e["kind"] == "similar"}
    assert similar == {(f"e:person{i}", f"e:person{j}") for i in range(4) for j in range(i + 1, 4)}


def test_symmetric_twins_end_as_one_active_fact(tmp_path):
    scenario = SCENARIOS["symmetric twins"]
    export, *_ = asyncio.run(
        run_scenario(IN_MEMORY, scenario, "im-twins", write_script(tmp_path / "s.jsonl", scenario.corpus))
    )
    facts = facts_of(export)
    a, b = fid(PROMOTED_SWAP["a"][1][0]), fid(PROMOTED_SWAP["b"][1][0])
    assert (facts[a]["status"], facts[a]["merged_into"]) == ("merged", b)
    assert facts[b]["passages"] == sorted([passage(PROMOTED_SWAP, "a"), passage(PROMOTED_SWAP, "b")])
    x, y = fid(MARRIED["x"][1][0]), fid(MARRIED["y"][1][0])
    assert sorted([facts[x]["status"], facts[y]["status"]]) == ["active", "merged"]


def test_redelivered_messages_change_nothing(tmp_path):
    script = write_script(tmp_path / "s.jsonl", CONFLICTS)
    once = asyncio.run(run_scenario(IN_MEMORY, SCENARIOS["conflict kinds"], "im-again", script))
    twice = asyncio.run(run_scenario(IN_MEMORY, SCENARIOS["redelivered"], "im-again", script))
    assert without_times(twice[0]) == without_times(once[0])
    assert (
        twice[1] == once[1]
    )  # every copy found its message done; the failed publish was retried from the committed outbox


# ---- role by role, on both stores (fixture redis_url): the same calls give the same answers -------
async def on_store(redis_url: str | None, calls) -> list:
    """What each call of `calls(memory, tenant)` gave, on a fresh tenant of Redis's Memory at
    `redis_url`, or of an InMemoryStore when it is None."""
    memory = InMemoryStore(DIMS) if redis_url is None else Memory.from_url(redis_url)
    try:
        return await calls(memory, f"im-role-{uuid.uuid4().hex[:10]}")
    finally:
        await memory.close()


async def outbox_calls(memory, tenant: str) -> list:
    """The effectively-once primitives (store.base.Outbox) called directly; what each call gave."""
    seen = []
    new = Fact("f1", "Ada", "lives in", "Ostra", "PERSON", "PLACE", "ada", "ostra", "s1")
    out = [Outgoing("indexed-facts", "f1", b'{"x": 1}')]
    seen.append(await memory.pending_outbox(tenant, "m1"))
    pipe = memory.pipeline(tenant)
    memory.stage_new_fact(pipe, tenant, new, [1.0] * DIMS)
    memory.stage_outbox(pipe, tenant, "m1", out)
    seen.append(await memory.commit_once(pipe, tenant, "m1"))
    pipe = memory.pipeline(tenant)  # a second delivery of m1: finds the first one's outbox, its own writes discarded
    memory.stage_fact_update(pipe, tenant, "f1", {"status": "active"})
    memory.stage_outbox(pipe, tenant, "m1", [])
    seen.append(await memory.commit_once(pipe, tenant, "m1"))
    seen.append((await memory.fact(tenant, "f1")).status)
    pipe = memory.pipeline(tenant)  # a decision that read f1 as active: it is new
    memory.expect_status(pipe, tenant, "f1", "active")
    memory.stage_fact_update(pipe, tenant, "f1", {"status": "invalid"})
    memory.stage_outbox(pipe, tenant, "m2", [])
    try:
        await memory.commit_once(pipe, tenant, "m2")
    except StaleDecision:
        seen.append("stale")
    seen.append((await memory.fact(tenant, "f1")).status)
    await memory.finish(tenant, "m1")
    for call in (memory.pending_outbox(tenant, "m1"), memory.commit_once(memory.pipeline(tenant), tenant, "m1")):
        try:
            seen.append(await call)
        except AlreadyDone:
            seen.append("done")
    # causes: a message is decided only while memory holds the decision that sent it (m3's "d3";
    # m1's, committed with no id, counts whatever id it is named with)
    pipe = memory.pipeline(tenant)
    memory.stage_outbox(pipe, tenant, "m3", out, "d3")
    await memory.commit_once(pipe, tenant, "m3")
    for turn in ("committed", "finished"):
        for cause in ("m3@d3", "m3@d9", "m4@d4", "m1@d1"):
            try:
                seen.append((turn, cause, await memory.pending_outbox(tenant, "child", cause)))
            except CauseNotInMemory:
                seen.append((turn, cause, "not in memory"))
        await memory.finish(tenant, "m3", "d3")
    seen.append(await memory.pending_outbox(tenant, "m1-child", "m1@d1"))
    return seen


OUTBOX = [
    None,
    None,
    Committed([Outgoing("indexed-facts", "f1", b'{"x": 1}')]),
    "new",
    "stale",
    "new",
    "done",
    "done",
    *[
        (turn, cause, None if held else "not in memory")
        for turn in ("committed", "finished")
        for cause, held in (("m3@d3", True), ("m3@d9", False), ("m4@d4", False), ("m1@d1", True))
    ],
    None,
]


def test_outbox_fences_commits_on_the_done_mark_the_outbox_the_statuses_read_and_the_cause(redis_url):
    assert asyncio.run(on_store(redis_url, outbox_calls)) == OUTBOX


def test_outbox_sweep_finds_committed_unsent_outboxes_once_per_lock():
    async def scenario():
        memory = InMemoryStore(DIMS)
        for mark in ("m2", "m1", "m3"):
            pipe = memory.pipeline("im-sweep")
            memory.stage_outbox(pipe, "im-sweep", mark, [Outgoing("indexed-facts", mark, b"{}")])
            await memory.commit_once(pipe, "im-sweep", mark)
        await memory.finish("im-sweep", "m1")
        return await memory.unsent_outboxes(float("inf")), await memory.unsent_outboxes(float("inf"))

    first, second = asyncio.run(scenario())
    assert [(t, m) for t, m, _ in first] == [("im-sweep", "m2"), ("im-sweep", "m3")]  # commit order
    assert second == []  # another sweeper holds the tenant's lock


async def progress_calls(memory, tenant: str) -> list:
    """Chunk progress (store.base.Progress): two facts, one spawned work item."""
    seen = []
    pipe = memory.pipeline(tenant)
    memory.stage_spawn(pipe, tenant, "c1", ["w1"])
    memory.stage_fact_done(pipe, tenant, "c1", 0, 2)
    memory.stage_fact_done(pipe, tenant, "c1", 1, 2)
    await pipe.execute()
    seen.append((await memory.chunk_done(tenant, "c1"), await memory.outstanding_work(tenant, "c1")))
    pipe = memory.pipeline(tenant)
    memory.stage_work_done(pipe, tenant, "c1", "w1", 2)
    await pipe.execute()
    seen.append((await memory.chunk_done(tenant, "c1"), await memory.chunks_done_count(tenant)))
    return seen


def test_progress_counts_a_chunk_done_once_its_facts_and_its_spawned_work_are(redis_url):
    assert asyncio.run(on_store(redis_url, progress_calls)) == [(False, ["w1"]), (True, 1)]


async def aliases_calls(memory, tenant: str) -> list:
    """Entity aliases (store.base.Aliases): one added, its reverse refused."""
    seen = []
    await memory.add_alias(tenant, "nyc", "new_york_city")
    try:
        await memory.add_alias(tenant, "new_york_city", "nyc")
    except ValueError as exc:
        seen.append(str(exc))
    seen.append((await memory.resolve_aliases(tenant, ["nyc", "ostra"]), await memory.alias_map(tenant)))
    return seen


async def canonical_names_calls(memory, tenant: str) -> list:
    """A query's mention lookup (store.base.Aliases.canonical_names): resolve_aliases and the
    canonical ids' entity_names in one call — an alias, an entity, an id of nothing."""
    await memory.add_alias(tenant, "nyc", "new_york_city")
    pipe = memory.pipeline(tenant)
    memory.stage_entity(pipe, tenant, "new_york_city", "New York City", "PLACE", np.ones(DIMS, np.float32), "c1")
    await pipe.execute()
    ids = ["nyc", "ostra", "new_york_city"]
    return [
        await memory.canonical_names(tenant, ids),
        (await memory.resolve_aliases(tenant, ids), await memory.entity_names(tenant, ["new_york_city", "ostra"])),
        await memory.canonical_names(tenant, []),
    ]


def test_a_mention_lookup_reads_canonical_ids_and_their_names_at_once(redis_url):
    canonical = {"nyc": "new_york_city", "ostra": "ostra", "new_york_city": "new_york_city"}
    names = {"new_york_city": {"name": "New York City", "type": "PLACE"}}
    assert asyncio.run(on_store(redis_url, canonical_names_calls)) == [(canonical, names), (canonical, names), ({}, {})]


def test_aliases_resolve_and_refuse_a_cycle(redis_url):
    assert asyncio.run(on_store(redis_url, aliases_calls)) == [
        "'nyc' is already an alias of 'new_york_city'",
        ({"nyc": "new_york_city", "ostra": "ostra"}, {"nyc": "new_york_city"}),
    ]


async def graph_calls(memory, tenant: str) -> list:
    """The graph written and its log read (store.base.GraphWrites, GraphReads): change ids are
    the store's own, the changes and what None means are not."""
    seen = []
    seen.append(
        (
            await memory.graph_log_exists(tenant),
            await memory.changes_since(tenant, "0-0"),
            await memory.changes_since(tenant, "7-0"),
        )
    )
    pipe = memory.pipeline(tenant)
    memory.stage_fact_edge(pipe, tenant, 1, "e:ada", "e:ostra", "f1")
    memory.stage_fact_edge(pipe, tenant, 1, "e:ostra", "e:ada", "f2")
    memory.stage_edge(pipe, tenant, 2, "e:ada", "p:c1", 1.0, "passage")
    memory.stage_fact_unlink(pipe, tenant, 3, "e:ada", "e:ostra", "f1")
    await pipe.execute()
    head, changes = await memory.graph_log_head(tenant), await memory.changes_since(tenant, "0-0")
    seen.append(([change for _, change in changes], head == changes[-1][0], await memory.changes_since(tenant, head)))
    seen.append((await memory.changes_since(tenant, changes[1][0], 1))[0][1])
    seen.append(
        (
            await memory.adjacency_nodes(tenant),
            [edges async for edges in memory.adjacency(tenant, ["e:ada", "e:ostra", "p:c1"])],
        )
    )
    return seen


def test_graph_log_gives_each_change_once_and_the_edges_their_weights(redis_url):
    assert asyncio.run(on_store(redis_url, graph_calls)) == [
        (False, [], None),
        (
            [
                EdgeChange("e:ada", "e:ostra", 1.0, "fact"),
                EdgeChange("e:ostra", "e:ada", 2.0, "fact"),
                EdgeChange("e:ada", "p:c1", 1.0, "passage"),
                EdgeChange("e:ada", "e:ostra", 1.0, "fact"),
            ],
            True,
            [],
        ),
        EdgeChange("e:ada", "p:c1", 1.0, "passage"),
        (
            ["e:ada", "e:ostra", "p:c1"],
            [[EdgeChange("e:ada", "e:ostra", 1.0, "fact"), EdgeChange("e:ada", "p:c1", 1.0, "passage")]],
        ),
    ]


# ---- the whole pipeline on both stores: the same memory, messages and answers ------------------
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_redis_and_in_memory_give_the_same_memory_messages_and_answers(stack_env, tmp_path, name):
    scenario = SCENARIOS[name]
    script = write_script(tmp_path / "s.jsonl", scenario.corpus)
    tenant = f"im-{name.replace(' ', '-')}-{uuid.uuid4().hex[:10]}"  # one tenant name for both: event ids hash it

    on_redis = asyncio.run(run_scenario(stack_env["MEMSTREAM_REDIS_URL"], scenario, tenant, script))
    in_process = asyncio.run(run_scenario(IN_MEMORY, scenario, tenant, script))
    assert without_times(in_process[0]) == without_times(on_redis[0])
    assert in_process[1] == on_redis[1]  # every topic, fact events with their ids
    assert same_answers(tie_order(in_process[3]), tie_order(on_redis[3])), (
        tie_order(in_process[3]),
        tie_order(on_redis[3]),
    )  # passages, entities, facts, seeds, scores
    assert on_redis[0]["facts"] and on_redis[2]
