"""Nothing lost, nothing wrong: poison messages, fenced commits, outboxes that drain,
merges only of the same fact, re-activation, event ids per transition — the stages in this
process over the test stack's Redis (tests/inprocess.py), and a SIGTERM through real Kafka."""

import asyncio
import json
import os
import signal
import time
import uuid

import pytest

from ops.fake_llm import FakeOpenAI
from store.records import cause
from tests.conftest import write_docs
from tests.inprocess import DigitBlindEmbedder, InProcess, ScriptedExtractor
from tests.test_end_to_end import tenant_name
from topics import Chunk, encode
from workers.algorithms.normalize import entity_id, fact_id, relation_name
from workers.envelope import Emit, dead_letter_record, decision_id, is_outage, stamp_causes
from workers.query.engine import QueryEngine, QueryRequest


def run(coro):
    return asyncio.run(coro)


def fid(head, relation, tail):
    return fact_id(entity_id(head), relation_name(relation), entity_id(tail))


async def index(stages: InProcess, docs: dict[str, str]) -> None:
    for doc_id, text in docs.items():
        await stages.publish(doc_id, text)


# ---- poison --------------------------------------------------------------------------------
POISON = {
    "lone surrogate": b'{"v":1,"tenant":"t","doc_id":"d","text":"\\ud800 broken"}',
    "nested 100k deep": b"[" * 100_000 + b"]" * 100_000,
    "5000-digit integer": b'{"v":1,"tenant":"t","doc_id":"d","text":"x","version":' + b"9" * 5000 + b"}",
    "not UTF-8": b'{"v":1,"tenant":"t","doc_id":"d","text":"\xff\xfe"}',
    "not JSON": b"\x00\x01garbage",
}


@pytest.mark.parametrize("topic", ["documents", "chunks", "candidate-facts", "conflict-sets"])
def test_every_poison_pill_is_dead_lettered_and_the_next_message_processed(stack_env, topic):
    async def scenario():
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"],
            ScriptedExtractor({"Ada Quill lives in Ostra.": [("Ada Quill", "lives in", "Ostra")]}),
            tau=1,
        )
        try:
            for value in POISON.values():
                await stages.deliver(topic, b"k", value)
            await stages.publish("ok", "Ada Quill lives in Ostra.")
            return stages.dead_letters(), stages.events()
        finally:
            await stages.close()

    letters, events = run(scenario())
    assert len(letters) == len(POISON)
    assert all(letter["topic"].endswith(topic) and letter["error"] for letter in letters)
    assert [e["event"] for e in events] == ["activated"]  # the partition keeps flowing


def test_a_dead_letter_of_a_huge_undecodable_value_fits_the_topic():
    value = b"\xff" * (4 << 20)  # 4 MiB, every byte escaped as \xff in the letter
    limit = 4 * (1 << 20) + (1 << 20)  # the topic's message limit at the default text limit
    letter = dead_letter_record("ns.documents", b"k", value, "undecodable", 0, 7, 1, None, max_letter_bytes=limit)
    assert len(encode(letter)) <= limit
    assert letter.payload_truncated and letter.payload_bytes == len(value)
    assert letter.payload_sha256 == __import__("hashlib").sha256(value).hexdigest()


def test_outage_errors_are_told_from_bugs():
    from aiokafka.errors import KafkaConnectionError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redisvl.exceptions import RedisSearchError

    wrapped = RedisSearchError("Error while searching")
    wrapped.__cause__ = RedisConnectionError("Connection refused")
    assert is_outage(RedisConnectionError("refused")) and is_outage(KafkaConnectionError()) and is_outage(wrapped)
    assert not is_outage(KeyError("status")) and not is_outage(ValueError("bad"))


# ---- fencing and outboxes ------------------------------------------------------------------
def test_of_two_deliveries_running_at_once_only_one_commits_and_publishes(stack_env):
    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor({}))
        published = []

        async def send(item):
            published.append(item.value)

        stages.pipeline.envelope.send = send
        old_owner_may_commit = asyncio.Event()

        def chunk(owner: str) -> Chunk:
            return Chunk(
                tenant=stages.tenant,
                chunk_id="c1",
                doc_id="d1",
                seq=0,
                n_chunks=1,
                text=f"decided by the {owner} owner",
            )

        async def old_owner(pipe):  # a revoked owner, slow in its handler
            await old_owner_may_commit.wait()
            pipe.set(stages.memory.keys(stages.tenant).base + ":probe", "old")
            return [Emit("chunks", "k", chunk("old"))]

        async def new_owner(pipe):
            pipe.set(stages.memory.keys(stages.tenant).base + ":probe", "new")
            return [Emit("chunks", "k", chunk("new"))]

        try:
            late = asyncio.create_task(stages.pipeline.envelope.once(stages.tenant, "ext:c1", old_owner))
            await asyncio.sleep(0.05)
            await stages.pipeline.envelope.once(stages.tenant, "ext:c1", new_owner)
            old_owner_may_commit.set()
            await late
            probe = await stages.memory.redis.get(stages.memory.keys(stages.tenant).base + ":probe")
            decided = [Emit("chunks", "k", chunk("new"))]  # as committed: naming its decision (its cause)
            sent = stamp_causes(decided, cause("ext:c1", decision_id("ext:c1", decided)))
            return published, probe, encode(sent[0].record)
        finally:
            await stages.close()

    published, probe, new_owners = run(scenario())
    assert published == [new_owners]  # the late owner finds the message done: it never sends its own outbox
    assert probe == b"new"  # and its writes were discarded


def test_an_outbox_whose_publishing_failed_is_sent_by_the_sweep_after_a_restart(stack_env):
    text = "Ada Quill lives in Ostra."

    async def scenario():
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor({text: [("Ada Quill", "lives in", "Ostra")]}), tau=1
        )
        real_send = stages.pipeline.envelope.send

        async def broken_for_chunks(item):
            if item.topic == "chunks":
                raise RuntimeError("broker refused the message")
            await real_send(item)

        try:
            stages.pipeline.envelope.send = broken_for_chunks
            await stages.publish("d1", text)
            lost = (await stages.memory.document_status(stages.tenant, "d1")).chunks_done
            stages.pipeline.envelope.send = real_send  # "the next start": publishing works again
            swept = await stages.pipeline.publish_unsent_outboxes(grace_s=0)
            await stages.drain()
            status = await stages.memory.document_status(stages.tenant, "d1")
            return lost, swept, status, stages.events()
        finally:
            await stages.close()

    lost, swept, status, events = run(scenario())
    assert lost == 0 and swept >= 1
    assert status.chunks_done == status.chunks == 1
    assert [e["event"] for e in events] == ["activated"]


# ---- merges only of the same fact ---------------------------------------------------------------
def test_facts_of_different_people_are_never_merged_whatever_their_cosine(stack_env):
    people = {f"p{i}": f"Person{i} was born in London." for i in range(4)}
    script = {text: [(f"Person{i}", "was born in", "London")] for i, text in enumerate(people.values())}

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), DigitBlindEmbedder(), tau=1)
        try:
            await index(stages, people)
            return await stages.facts(), stages.events()
        finally:
            await stages.close()

    facts, events = run(scenario())
    assert sorted(f.head for f in facts.values() if f.status == "active") == [
        "Person0",
        "Person1",
        "Person2",
        "Person3",
    ]
    assert not [e for e in events if e["event"] == "merged"]


class RomanBlindEmbedder(DigitBlindEmbedder):
    """Test double: also blind to Roman numerals, so "Bayezid I" and "Bayezid II" collide."""

    async def embed(self, texts):
        import re

        return await super().embed([re.sub(r"\b[IVX]+\b", "#", t) for t in texts])


def test_bayezid_i_and_bayezid_ii_stay_apart(stack_env):
    docs = {"b1": "Sultan Bayezid I of Ottoman Empire.", "b2": "Sultan Bayezid II of Ottoman Empire."}
    script = {
        docs["b1"]: [("Sultan Bayezid I", "ruled", "Ottoman Empire", "PERSON", "STATE")],
        docs["b2"]: [("Sultan Bayezid II", "ruled", "Ottoman Empire", "PERSON", "STATE")],
    }

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), RomanBlindEmbedder(), tau=1)
        try:
            await index(stages, docs)
            return await stages.facts()
        finally:
            await stages.close()

    facts = run(scenario())
    assert {f.head: f.status for f in facts.values()} == {"Sultan Bayezid I": "active", "Sultan Bayezid II": "active"}


class SynonymEmbedder(DigitBlindEmbedder):
    """Test double: "native of" reads as "born in" (a paraphrase the model would place within δ)."""

    async def embed(self, texts):
        return await super().embed([t.replace("native of", "born in") for t in texts])


def test_the_same_fact_in_other_words_is_still_merged(stack_env):
    docs = {"a": "Ada Quill was born in Ostra.", "b": "Ada Quill is a native of Ostra."}
    script = {docs["a"]: [("Ada Quill", "born in", "Ostra")], docs["b"]: [("Ada Quill", "native of", "Ostra")]}

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), SynonymEmbedder(), tau=1)
        try:
            await index(stages, docs)
            return await stages.facts(), stages.events()
        finally:
            await stages.close()

    facts, events = run(scenario())
    born, native = fid("Ada Quill", "born in", "Ostra"), fid("Ada Quill", "native of", "Ostra")
    assert facts[born].status == "active" and facts[native].status == "merged" and facts[native].merged_into == born
    assert len(facts[born].passage_ids) == 2
    assert [e["event"] for e in events] == ["activated", "merged"]


# ---- lifecycle: re-activation and event ids ---------------------------------------------------
def test_a_re_activated_fact_seeds_queries_again(stack_env):
    docs = {
        "a1": "Ada Quill lives in Ostra.",
        "b1": "Ada Quill lives in Selka now.",
        "a2": "Ada Quill still lives in Ostra.",
    }
    script = {
        docs["a1"]: [("Ada Quill", "lives in", "Ostra")],
        docs["b1"]: [("Ada Quill", "lives in", "Selka")],
        docs["a2"]: [("Ada Quill", "lives in", "Ostra")],
    }
    ostra = fid("Ada Quill", "lives in", "Ostra")

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), tau=1)
        try:
            await index(stages, {"a1": docs["a1"], "b1": docs["b1"]})
            invalidated = (await stages.memory.fact(stages.tenant, ostra)).status
            await stages.publish("a2", docs["a2"])  # Ostra gains support and wins the group again
            await asyncio.sleep(0.01)
            fact = await stages.memory.fact(stages.tenant, ostra)
            engine = QueryEngine(stages.memory, stages.pipeline.embedder)
            answer = await engine.answer(
                QueryRequest.from_json({"query": fact.text, "tenant": stages.tenant}, stages.tenant, 5)
            )
            return invalidated, fact, answer
        finally:
            await stages.close()

    invalidated, fact, answer = run(scenario())
    assert invalidated == "invalid" and fact.status == "active" and fact.expired_at is None
    assert ostra in [f.id for f in answer.facts]


def test_event_ids_of_a_flip_flop_differ(stack_env):
    """A relation flips single → multi → single: Ada's second home is invalidated, activated,
    invalidated again — three transitions, three ids (the old ids hashed the group's state,
    which repeats)."""
    singles = ["Bram", "Cleo", "Dara", "Eno", "Fay", "Gus", "Hal"]
    docs = {
        "ada-1": ("Ada", "Ostra"),
        "ada-2": ("Ada", "Selka"),
        "ivo-1": ("Ivo", "Merrow"),
        "ivo-2": ("Ivo", "Calder"),
    }
    docs.update({f"{name}-1": (name, f"{name}ton") for name in singles})
    texts = {doc_id: f"{head} lives in {tail} ({doc_id})." for doc_id, (head, tail) in docs.items()}
    script = {texts[d]: [(head, "lives in", tail)] for d, (head, tail) in docs.items()}
    ostra = fid("Ada", "lives in", "Ostra")

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), tau=1)
        try:
            await index(stages, texts)
            return stages.events()
        finally:
            await stages.close()

    events = run(scenario())
    ostra_events = [(e["event"], e["event_id"]) for e in events if e["fact_id"] == ostra]
    assert [name for name, _ in ostra_events] == ["activated", "invalidated", "activated", "invalidated"]
    assert len({eid for _, eid in ostra_events}) == 4
    assert len({e["event_id"] for e in events}) == len(events)


# ---- a graceful stop through real Kafka ----------------------------------------------------------
@pytest.mark.parametrize("window", [1, 4])
def test_a_sigterm_during_the_llm_call_loses_no_chunk(make_workers, tmp_path, window):
    """One worker, an LLM that takes 6 s, four documents, SIGTERM while the first call is in
    flight (how compose, systemd and Kubernetes stop a process) — with a read-ahead window of 4,
    while all four calls are (MEMSTREAM_LLM_CONCURRENCY); a new worker indexes all four."""
    texts = {f"d{i}": f"Person{i} Quill runs the Mill{i}." for i in range(4)}

    def extraction(i):
        return json.dumps(
            {
                "entities": [
                    {"name": f"Person{i} Quill", "type": "PERSON"},
                    {"name": f"Mill{i}", "type": "ORGANIZATION"},
                ],
                "facts": [
                    {
                        "head": f"Person{i} Quill",
                        "head_type": "PERSON",
                        "relation": "runs",
                        "tail": f"Mill{i}",
                        "tail_type": "ORGANIZATION",
                        "category": "DECLARATIVE",
                        "valid_from": None,
                        "valid_to": None,
                    }
                ],
            }
        )

    with FakeOpenAI(answers={text: extraction(key[1:]) for key, text in texts.items()}, latency_s=6.0) as server:
        workers = make_workers(
            extractor="llm",
            llm_base_url=server.base_url,
            llm_model=f"term-{uuid.uuid4().hex[:6]}",
            tau=1,
            partitions=1,
            llm_concurrency=window,
        )
        first = workers.start()
        tenant = tenant_name("sigterm")
        workers.cli.run("publish", *write_docs(tmp_path / "d", texts), "--tenant", tenant)
        deadline = time.monotonic() + 120
        while server.in_flight < window and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.in_flight == window, f"{server.in_flight} LLM calls in flight, not {window}"
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
        workers.start()
        workers.cli.run("publish", *write_docs(tmp_path / "d", texts), "--tenant", tenant, "--wait", "--timeout", "180")
        activated = {e["fact_id"] for e in workers.cli.tail(tenant) if e["event"] == "activated"}
    assert activated == {fid(f"Person{i} Quill", "runs", f"Mill{i}") for i in range(4)}


def test_each_transition_stages_status_times_and_edge_and_returns_its_event(stack_env):
    from store.facts import Fact, Lifecycle
    from store.graph_log import adjacency_field
    from store.nodes import entity_node
    from topics.records import Triple

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor({}))
        memory, tenant, lifecycle = stages.memory, stages.tenant, Lifecycle(stages.memory)
        fact = Fact.extracted("f1", Triple("Ada", "lives in", "Ostra"), "ada", "ostra", "s1")
        seen = []

        async def step(transition, *args, **kwargs):
            pipe = memory.pipeline(tenant)
            if transition is None:
                memory.stage_new_fact(pipe, tenant, fact, [1.0] * 384)
                await pipe.execute()
                return
            event = transition(pipe, tenant, fact, 1, *args, **kwargs)
            await pipe.execute()
            stored = await memory.fact(tenant, "f1")
            edge = await memory.redis.hget(
                memory.keys(tenant).adjacency(entity_node("ada")), adjacency_field("fact", entity_node("ostra"))
            )
            seen.append((event.event, stored.status, stored.expired_at is not None, edge is not None))

        try:
            await step(None)
            await step(lifecycle.activate)
            await step(lifecycle.invalidate, {}, "excluded")
            await step(lifecycle.activate, {}, "regained support")
            await step(lifecycle.qualify, {"time": {"from": "1998", "to": "2001"}}, "temporal")
            await step(lifecycle.expire, "ttl over")
            await step(lifecycle.activate)
            await step(lifecycle.retract, "document withdrawn")
            final = await memory.fact(tenant, "f1")
            return seen, final
        finally:
            await stages.close()

    seen, final = run(scenario())
    assert seen == [
        ("activated", "active", False, True),
        ("invalidated", "invalid", True, False),
        ("activated", "active", False, True),
        ("qualified", "active", False, True),
        ("expired", "expired", True, False),
        ("activated", "active", False, True),
        ("retracted", "retracted", True, False),
    ]
    assert (final.valid_at, final.invalid_at, final.head, final.text) == ("1998", "2001", "Ada", "Ada lives in Ostra")


@pytest.mark.parametrize(
    "relation,first,second",
    [
        ("married", ("Ada Quill", "married", "Bram Reed"), ("Bram Reed", "married", "Ada Quill")),
        ("near duplicate", ("Ada Quill", "born in", "Ostra"), ("Ada Quill", "native of", "Ostra")),
    ],
)
def test_twins_end_in_the_same_memory_whichever_arrives_first(stack_env, relation, first, second):
    texts = {"x": f"{' '.join(first)}.", "y": f"{' '.join(second)}."}
    script = {
        texts["x"]: [(*first, "PERSON", "PERSON" if relation == "married" else "PLACE")],
        texts["y"]: [(*second, "PERSON", "PERSON" if relation == "married" else "PLACE")],
    }

    async def memory_after(order):
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(script), SynonymEmbedder(), tau=1)
        try:
            await index(stages, {d: texts[d] for d in order})
            keys = {o.key for o in stages.sent if o.topic == "candidate-facts"}
            memory = {
                f.id: (f.status, f.merged_into, tuple(sorted(p[:8] for p in f.passage_ids)))
                for f in (await stages.facts()).values()
            }
            return memory, keys, stages.events()
        finally:
            await stages.close()

    (one, keys_one, events_one), (other, keys_other, events_other) = run(memory_after("xy")), run(memory_after("yx"))
    assert one == other
    for events, memory in ((events_one, one), (events_other, other)):  # subscribers end where memory ends
        last = {e["fact_id"]: e["fact"]["status"] for e in events}
        assert last == {fid: status for fid, (status, _, _) in memory.items() if fid in last}
        assert [status for status, _, _ in memory.values() if status == "active"] == [
            last[fid] for fid in last if last[fid] == "active"
        ]
    assert sorted(status for status, _, _ in one.values()) == ["active", "merged"]
    if relation == "married":  # both detected on one partition, never at once on two
        assert len(keys_one) == 1 and keys_one == keys_other


def test_the_same_document_in_two_tenants_gets_distinct_event_ids(stack_env):
    text = "Ada Quill lives in Ostra."

    async def events_of_a_tenant():
        stages = InProcess(
            stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor({text: [("Ada Quill", "lives in", "Ostra")]}), tau=1
        )
        try:
            await stages.publish("d1", text)
            return {e["event_id"] for e in stages.events()}
        finally:
            await stages.close()

    one, other = run(events_of_a_tenant()), run(events_of_a_tenant())
    assert one and other and not one & other  # one topic carries every tenant's events


def test_a_dead_letter_whose_error_holds_a_lone_surrogate_still_encodes():
    letter = dead_letter_record("ns.chunks", b"k", b"{}", 'raw output: "\ud83d', 0, 1, 1, "t", max_letter_bytes=1 << 20)
    assert b"raw output" in encode(letter)


def test_a_decision_whose_facts_changed_before_its_commit_is_made_again(stack_env):
    """Two stages deciding about one fact at once (the detector activating it, the resolver
    adjudicating its group): the later commit sees the fact changed and decides again."""
    from store.facts import Fact, Lifecycle
    from topics.records import Triple

    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor({}))
        memory, tenant, lifecycle = stages.memory, stages.tenant, Lifecycle(stages.memory)
        pipe = memory.pipeline(tenant)
        memory.stage_new_fact(
            pipe, tenant, Fact.extracted("f1", Triple("Ada", "lives in", "Ostra"), "ada", "ostra", "s1"), [1.0] * 384
        )
        await pipe.execute()
        seen = []

        async def decide(pipe):
            fact = await memory.fact(tenant, "f1")
            seen.append(fact.status)
            if len(seen) == 1:  # another stage activates it between our read and our commit
                other = memory.pipeline(tenant)
                lifecycle.activate(other, tenant, await memory.fact(tenant, "f1"), 1)
                await other.execute()
            if fact.status != "active":
                return [Emit.of(lifecycle.activate(pipe, tenant, fact, 2))]
            return []

        try:
            await stages.pipeline.envelope.once(tenant, "det:p1:0", decide)
            return seen, stages.events()
        finally:
            await stages.close()

    seen, events = run(scenario())
    assert seen == ["new", "active"]  # decided again on what the other stage committed
    assert events == []  # and did not activate the fact a second time


def test_a_worker_started_while_the_broker_is_down_waits_for_it(tmp_path):
    """Up to the outage deadline, then a clear exit (the broker never came back here)."""
    import subprocess
    import sys

    from ops.stack.services import free_port

    env = {
        **os.environ,
        "MEMSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "MEMSTREAM_OUTAGE_DEADLINE": "6",
        "MEMSTREAM_HOME": str(tmp_path),
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "worker", "--role", "detector"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    waited = time.monotonic() - started
    # the deadline holds: no single connection attempt outlasts it (kafka-python's own bootstrap
    # wait is 30 s); the upper bound is loose, for a busy machine
    assert proc.returncode != 0 and 6 <= waited < 25, waited
    assert "waiting for Kafka at 127.0.0.1:" in proc.stderr and "gave up waiting for Kafka" in proc.stderr


def test_chunks_fetched_before_a_rebalance_are_not_lost_when_a_second_extractor_joins(make_workers, tmp_path):
    """The first extractor holds all partitions and has fetched every chunk, nothing committed
    yet; a second extractor joins. faust drops the chunks fetched in the old generation, and
    aiokafka did not seek a partition without a committed offset back: the chunks of the
    partitions the first extractor kept were never delivered again (seen in the chaos test)."""
    texts = {f"r{i:02d}": f"Person{i:02d} Quill runs the Mill{i:02d}." for i in range(16)}

    def extraction(i):
        return json.dumps(
            {
                "entities": [],
                "facts": [
                    {
                        "head": f"Person{i} Quill",
                        "head_type": "PERSON",
                        "relation": "runs",
                        "tail": f"Mill{i}",
                        "tail_type": "ORGANIZATION",
                        "category": "DECLARATIVE",
                        "valid_from": None,
                        "valid_to": None,
                    }
                ],
            }
        )

    with FakeOpenAI(answers={text: extraction(key[1:]) for key, text in texts.items()}, latency_s=0.2) as server:
        server.script.append(
            {"delay": 30}
        )  # the first call outlasts the second extractor's start: nothing else is processed or committed
        workers = make_workers(
            extractor="llm",
            llm_base_url=server.base_url,
            llm_model=f"rebal-{uuid.uuid4().hex[:6]}",
            tau=1,
            partitions=4,
        )
        workers.start(role="chunker,detector,resolver,query")
        workers.start(role="extractor")
        tenant = tenant_name("rebalance")
        workers.cli.run("publish", *write_docs(tmp_path / "d", texts), "--tenant", tenant)
        deadline = time.monotonic() + 120
        while server.calls == 0 and time.monotonic() < deadline:  # the first extractor has fetched and started
            time.sleep(0.2)
        workers.start(role="extractor")  # joins while the first holds fetched, uncommitted chunks
        workers.cli.run("publish", *write_docs(tmp_path / "d", texts), "--tenant", tenant, "--wait", "--timeout", "150")
        activated = {e["fact_id"] for e in workers.cli.tail(tenant) if e["event"] == "activated"}
    assert activated == {fid(f"Person{i:02d} Quill", "runs", f"Mill{i:02d}") for i in range(16)}
