"""The extractor agent's read-ahead window (workers/app.py `_read_ahead`) over the stages in
process (tests/inprocess.py, InMemoryStore) and the fake LLM over real HTTP: up to N extraction
calls in flight, effects and acks in offset order, nothing acked on cancellation and everything
processed on redelivery. The Kafka worker's SIGTERM and kill with a window: tests/test_crash.py."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from ops.fake_llm import FakeOpenAI
from tests.inprocess import InProcess
from topics import Chunk, decode, encode
from topics.records import CandidateFact
from workers.algorithms.chunking import chunk_id_of
from workers.app import _read_ahead
from workers.models.extraction import LLMExtractor
from workers.models.llm import LLMClient, LLMConfig

TEXTS = [f"Person{i} Quill runs the Mill{i}." for i in range(10)]


def extraction(text: str) -> str:
    i = text.split()[0].removeprefix("Person")
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


@dataclass
class Message:
    key: bytes
    value: bytes
    partition: int
    offset: int


@dataclass
class Event:
    message: Message


class ManualStream:
    """Test double of faust's noack stream: yields the events, then waits until each is acked
    (a real stream never ends) or forever when `hold` is set; records the acks in order."""

    def __init__(self, events: list[Event], hold: bool = False):
        self.events_ = events
        self.hold = hold
        self.acked: list[int] = []
        self.all_acked = asyncio.Event()

    async def events(self):
        for event in self.events_:
            yield event
        if self.hold:
            await asyncio.Event().wait()
        await self.all_acked.wait()

    async def ack(self, event: Event) -> None:
        self.acked.append(event.message.offset)
        if len(self.acked) == len(self.events_):
            self.all_acked.set()


def chunk_events(tenant: str) -> list[Event]:
    chunks = [Chunk(tenant, chunk_id_of(text), f"doc{i}", 0, 1, text) for i, text in enumerate(TEXTS)]
    return [Event(Message(c.chunk_id.encode(), encode(c), 0, offset)) for offset, c in enumerate(chunks)]


def stages(server: FakeOpenAI, concurrency: int) -> InProcess:
    llm = LLMClient(LLMConfig(server.base_url, "sk-test", "read-ahead", concurrency=concurrency))
    return InProcess(None, LLMExtractor(llm), tau=1, llm_concurrency=concurrency)


def extracted_order(ip: InProcess) -> list[str]:
    return [decode(CandidateFact, item.value).passage_id for item in ip.sent if item.topic == "candidate-facts"]


def test_the_window_keeps_n_extractions_in_flight_and_commits_and_acks_in_offset_order():
    async def scenario(server):
        ip = stages(server, concurrency=4)
        assert ip.pipeline.read_ahead("chunks") == 4
        assert (
            ip.pipeline.read_ahead("candidate-facts") == ip.settings.partitions
        )  # no model calls: one message per partition
        events = chunk_events(ip.tenant)
        stream = ManualStream(events)
        most = count_concurrent_process(ip)
        await asyncio.wait_for(_read_ahead(stream, "chunks", ip.pipeline, ip.pipeline.read_ahead("chunks")), 60)
        assert most() == 1  # one partition: its messages processed one at a time
        return stream.acked, extracted_order(ip), [e.message.key.decode() for e in events]

    with FakeOpenAI(answers={t: extraction(t) for t in TEXTS}, latency_s=0.3) as server:
        acked, order, chunk_ids = asyncio.run(scenario(server))
        assert server.max_in_flight == 4  # one at a time before the window
        assert server.calls == len(TEXTS)  # the prefetched answer is the one handle uses: one call per chunk
    assert acked == list(range(len(TEXTS)))
    assert order == chunk_ids  # each chunk's effects and messages in offset order


def count_concurrent_process(ip: InProcess):
    """Wraps the pipeline's `process` to count the calls running at once; returns the maximum's getter."""
    process, running, most = ip.pipeline.process, [0], [0]

    async def counted(*args):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            await process(*args)
        finally:
            running[0] -= 1

    ip.pipeline.process = counted
    return lambda: most[0]


def test_partitions_are_processed_side_by_side_each_in_offset_order():
    """Two partitions: a lane each, so two messages are processed at once (as two processes
    would), while each partition's effects and acks keep its offset order."""

    async def scenario(server):
        ip = stages(server, concurrency=4)
        events = chunk_events(ip.tenant)
        for i, event in enumerate(events):
            event.message.partition, event.message.offset = i % 2, i // 2
        stream = ManualStream(events)
        stream.ack = acks_by_partition(stream)
        most = count_concurrent_process(ip)
        await asyncio.wait_for(_read_ahead(stream, "chunks", ip.pipeline, 4), 60)
        by_partition = {p: [e.message.key.decode() for e in events if e.message.partition == p] for p in (0, 1)}
        order = extracted_order(ip)
        return (
            most(),
            stream.by_partition,
            {p: [c for c in order if c in ids] for p, ids in by_partition.items()},
            by_partition,
        )

    with FakeOpenAI(answers={t: extraction(t) for t in TEXTS}, latency_s=0.2) as server:
        most, acked, effects, expected = asyncio.run(scenario(server))
    assert most == 2
    assert acked == {0: list(range(5)), 1: list(range(5))}
    assert effects == expected


def acks_by_partition(stream: ManualStream):
    stream.by_partition = {}

    async def ack(event: Event) -> None:
        stream.by_partition.setdefault(event.message.partition, []).append(event.message.offset)
        if sum(map(len, stream.by_partition.values())) == len(stream.events_):
            stream.all_acked.set()

    return ack


def test_a_cancelled_window_acks_nothing_unprocessed_and_a_redelivery_processes_all():
    """The agent is cancelled (SIGTERM, rebalance) while its window holds N chunks whose calls
    are in flight: nothing is acked, the prefetch tasks are cancelled, and the same events
    delivered again are processed once each, in order."""

    async def scenario(server):
        ip = stages(server, concurrency=4)
        events = chunk_events(ip.tenant)
        first = ManualStream(events, hold=True)
        agent = asyncio.ensure_future(_read_ahead(first, "chunks", ip.pipeline, 4))
        while server.in_flight < 4:
            await asyncio.sleep(0.02)
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        acked_before, sent_before = list(first.acked), extracted_order(ip)
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        server.latency_s = 0.05
        again = ManualStream(events)
        await asyncio.wait_for(_read_ahead(again, "chunks", ip.pipeline, 4), 60)
        return (
            acked_before,
            sent_before,
            leftover,
            again.acked,
            extracted_order(ip),
            [e.message.key.decode() for e in events],
        )

    with FakeOpenAI(answers={t: extraction(t) for t in TEXTS}, latency_s=2.0) as server:
        acked_before, sent_before, leftover, acked, order, chunk_ids = asyncio.run(scenario(server))
    assert acked_before == [] and sent_before == []  # nothing processed, nothing acked: all of it is delivered again
    assert [
        t for t in leftover if "_prefetch" in repr(t) or "consume" in repr(t)
    ] == []  # no prefetch or consumer left running
    assert acked == list(range(len(TEXTS))) and order == chunk_ids


def test_a_message_that_does_not_decode_is_left_to_process_which_dead_letters_it():
    async def scenario(server):
        ip = stages(server, concurrency=4)
        events = chunk_events(ip.tenant)[:3]
        events.insert(1, Event(Message(b"bad", b"{not json", 0, 99)))
        stream = ManualStream(events)
        await asyncio.wait_for(_read_ahead(stream, "chunks", ip.pipeline, 4), 60)
        return stream.acked, ip.dead_letters(), extracted_order(ip)

    with FakeOpenAI(answers={t: extraction(t) for t in TEXTS}, latency_s=0.05) as server:
        acked, letters, order = asyncio.run(scenario(server))
    assert acked == [0, 99, 1, 2] and len(letters) == 1 and len(order) == 3


def test_an_outbox_of_several_messages_is_sent_in_one_send_many_in_its_order():
    """The worker's send_many (workers/app.py) enqueues an outbox in order and awaits the
    broker's acknowledgements together; the envelope hands it whole outboxes."""
    from tests.inprocess import ScriptedExtractor

    text = "Ana Lund lives in Oslo, works in Bergen and was born in Tromso."
    ip = InProcess(
        None,
        ScriptedExtractor(
            {
                text: [
                    ("Ana Lund", "lives in", "Oslo"),
                    ("Ana Lund", "works in", "Bergen"),
                    ("Ana Lund", "born in", "Tromso"),
                ]
            }
        ),
        tau=1,
    )
    batches = []

    async def send_many(items):
        batches.append([item.topic for item in items])
        for item in items:
            await ip.broker.send(item)

    ip.pipeline.envelope.send_many = send_many
    asyncio.run(ip.publish("ana", text))
    assert ["candidate-facts"] * 3 in batches  # the chunk's three candidates, as one batch
    assert all(len(batch) > 1 for batch in batches)  # a single message goes through `send`
    assert [decode(CandidateFact, item.value).fact_index for item in ip.sent if item.topic == "candidate-facts"] == [
        0,
        1,
        2,
    ]


def test_the_resolvers_prefetch_asks_what_handle_then_finds_in_the_llm_cache(tmp_path):
    """An adjudication read ahead: its resolution request goes out from memory as it is, and
    processing the message then takes the answer from the LLM cache (no second call)."""
    from tests.test_llm import _llm
    from tests.test_memory_agents import CONFLICTS, _ids, write_script
    from workers.algorithms.chunking import chunk_id_of
    from workers.models.extraction import ReplayExtractor

    decisions = [
        {
            "fact_id": _ids(doc),
            "action": action,
            "evidence": "Mira Okafor was born in Oslo, her passport says",
            "evidence_passage_id": chunk_id_of(CONFLICTS["m2"][0]),
            "valid_from": None,
            "valid_to": None,
            "scope": None,
        }
        for doc, action in (("m2", "keep"), ("m1", "invalidate"))
    ]

    async def scenario(server):
        probe = InProcess(None, None, tau=1)
        ip = InProcess(
            None,
            ReplayExtractor(str(write_script(tmp_path / "s.jsonl", CONFLICTS))),
            tau=1,
            memory=probe.memory,
            tenant=probe.tenant,
            resolver_llm=_llm(server, probe.memory, "prefetch-res"),
        )
        calls = []  # (calls after prefetch - before, calls after process - after prefetch) per adjudication
        process = ip.pipeline.process

        async def prefetched(topic, key, value, *rest):
            if topic == "conflict-sets":
                before = server.calls
                await ip.pipeline.prefetch(topic, key, value)
                after = server.calls
                await process(topic, key, value, *rest)
                calls.append((after - before, server.calls - after))
            else:
                await process(topic, key, value, *rest)

        ip.pipeline.process = prefetched
        await ip.publish("m2", CONFLICTS["m2"][0])
        await ip.publish("m1", CONFLICTS["m1"][0])
        return calls, await ip.facts()

    with FakeOpenAI(answers={_ids("m1"): json.dumps({"decisions": decisions})}) as server:
        calls, facts = asyncio.run(scenario(server))
        assert server.calls == 1
    assert (1, 0) in calls  # the one resolution: asked by prefetch, answered from the cache in process
    assert facts[_ids("m1")].status == "invalid" and facts[_ids("m2")].status == "active"
