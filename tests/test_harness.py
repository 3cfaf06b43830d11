"""The in-process harness (tests/inprocess.py) does what the tests built on it claim: several
partitions' messages really are in flight at once and in seeded orders, a redelivery really
delivers a message again, a failed publish really fails, a store the test gives is the one used,
and export/events/query read the memory as the CLI does."""

import asyncio

import pytest

from store.in_memory import InMemoryStore
from tests.inprocess import DIMS, Delivery, InProcess, ScriptedExtractor

NAMES = [
    ("Ada Quill", "Ostra"),
    ("Bram Dahl", "Vik"),
    ("Cora Lund", "Narvik"),
    ("Dag Moe", "Tromso"),
    ("Edda Holt", "Bergen"),
    ("Finn Berg", "Alta"),
    ("Gro Vell", "Molde"),
    ("Hana Park", "Skien"),
]
TEXTS = {f"d{i}": f"{person} lives in {town}." for i, (person, town) in enumerate(NAMES)}
SCRIPT = {f"{person} lives in {town}.": [(person, "lives in", town)] for person, town in NAMES}


class CountingExtractor(ScriptedExtractor):
    """Records how many extractions run at once (each yields to the loop once)."""

    def __init__(self, script):
        super().__init__(script)
        self.running = self.most = 0
        self.order: list[str] = []

    async def extract(self, text, context=""):
        self.running += 1
        self.most = max(self.most, self.running)
        self.order.append(text)
        await asyncio.sleep(0.01)
        self.running -= 1
        return await super().extract(text, context)


def index(redis_url: str | None, delivery: Delivery):
    """Every document at once, then drain; on Redis at `redis_url` or (None) an InMemoryStore."""

    async def scenario():
        extractor = CountingExtractor(SCRIPT)
        stages = InProcess(redis_url, extractor, delivery=delivery, tau=1)
        try:
            for doc_id, text in TEXTS.items():
                await stages.publish(doc_id, text, wait=False)
            await stages.drain()
            return extractor, stages, await stages.export(), stages.events()
        finally:
            await stages.close()

    return asyncio.run(scenario())


def test_default_delivery_is_sequential_and_in_order(stack_env):
    extractor, stages, memory, events = index(stack_env["MEMSTREAM_REDIS_URL"], Delivery())
    assert extractor.most == 1 and extractor.order == list(TEXTS.values())
    assert stages.broker.redeliveries == 0 and stages.broker.waiting == 0
    assert {f["status"] for f in memory["facts"]} == {"active"} and len(memory["facts"]) == len(TEXTS)
    assert sorted(e["fact_id"] for e in events) == sorted(f["id"] for f in memory["facts"])


def test_partitions_interleave_in_seeded_orders_and_redeliveries_repeat(stack_env):
    # one consumer: the seed alone decides the order
    first, _, memory, _ = index(stack_env["MEMSTREAM_REDIS_URL"], Delivery(partitions=4, seed=1))
    again, _, _, _ = index(stack_env["MEMSTREAM_REDIS_URL"], Delivery(partitions=4, seed=1))
    other, _, _, _ = index(stack_env["MEMSTREAM_REDIS_URL"], Delivery(partitions=4, seed=2))
    assert first.order == again.order != other.order
    assert list(TEXTS.values()) not in (first.order, other.order)
    # several consumers: messages of different partitions in flight at once
    concurrent, _, _, _ = index(stack_env["MEMSTREAM_REDIS_URL"], Delivery(partitions=4, consumers=4, seed=1))
    assert concurrent.most > 1, "no two messages were ever in flight at once"

    _, stages, repeated, events = index(
        stack_env["MEMSTREAM_REDIS_URL"], Delivery(partitions=4, consumers=4, seed=3, redeliver=1.0)
    )
    assert len(stages.broker.delivered) == 2 * stages.broker.redeliveries  # every message twice
    strip = lambda m: [{k: v for k, v in f.items() if k not in ("created_at", "activated_at")} for f in m["facts"]]  # noqa: E731
    assert strip(repeated) == strip(memory)
    assert len({e["event_id"] for e in events}) == len(TEXTS)


def test_on_the_in_memory_store_every_message_twice_and_a_failed_event_publish_change_nothing():
    _, once, memory, events = index(None, Delivery())
    assert isinstance(once.memory, InMemoryStore)
    _, stages, repeated, repeated_events = index(None, Delivery(redeliver=1.0, fail_first_event=True))
    assert len(stages.broker.delivered) == 2 * stages.broker.redeliveries and stages.broker.failed_publishes == 1
    strip = lambda m: [{k: v for k, v in f.items() if k not in ("created_at", "activated_at")} for f in m["facts"]]  # noqa: E731
    assert strip(repeated) == strip(memory)
    # each event once, the failed one published from the committed outbox
    assert sorted((e["event"], e["fact_id"]) for e in repeated_events) == sorted(
        (e["event"], e["fact_id"]) for e in events
    )
    assert len({e["event_id"] for e in repeated_events}) == len(repeated_events) == len(TEXTS)


def test_a_given_store_is_used_and_must_have_the_settings_tau():
    memory = InMemoryStore(DIMS, tau=1)
    assert InProcess(None, ScriptedExtractor(SCRIPT), memory=memory, tau=1).memory is memory
    with pytest.raises(ValueError, match="τ"):
        InProcess(None, ScriptedExtractor(SCRIPT), memory=memory)  # the settings' τ is 2


def test_query_runs_the_query_engine_over_the_memory(stack_env):
    async def scenario():
        stages = InProcess(stack_env["MEMSTREAM_REDIS_URL"], ScriptedExtractor(SCRIPT), tau=1)
        try:
            await stages.publish("d0", TEXTS["d0"])
            return await stages.query(TEXTS["d0"], top_k=1, mode="dense")
        finally:
            await stages.close()

    answer = asyncio.run(scenario())
    # the digit-blind embedder gives the query the passage's own vector
    assert answer["mode"] == "dense" and [p["doc_id"] for p in answer["passages"]] == ["d0"]
