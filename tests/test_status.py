"""`memstream status` (ops/status.py) without Kafka: a tenant's documents and facts as the
store holds them, an unknown tenant named, and the report rendered one line per stage. The
Kafka half runs against real workers in tests/test_end_to_end.py."""

from __future__ import annotations

import asyncio

from ops.status import render, tenant_status
from tests.inprocess import InProcess
from workers.models.extraction import RulesExtractor


def test_a_tenants_documents_and_facts_by_status():
    async def scenario():
        stages = InProcess(None, RulesExtractor(), tau=2)
        try:
            await stages.publish("ilse", "Ilse Marr lives in Kallmar.")
            await stages.publish("nora", "Nora Velt works for Orsk Mills.")
            await stages.delete("nora")
            return (
                await tenant_status(stages.memory, stages.tenant),
                await tenant_status(stages.memory, "nobody"),
                stages.tenant,
            )
        finally:
            await stages.close()

    held, unknown, tenant = asyncio.run(scenario())
    assert held == {
        "tenant": tenant,
        "documents": 1,
        "documents_indexed": 1,
        "documents_deleted": 1,
        "facts": {"pending": 1, "retracted": 1},
        "pending_facts": 1,
    }
    assert (
        unknown["documents"] == 0
        and unknown["warning"] == "tenant 'nobody' holds no memory (nothing was ever indexed for it)"
    )


def test_the_report_reads_one_line_per_stage():
    stage = {
        "topic": "m.documents",
        "lag": 3,
        "per_second": 1.5,
        "partitions": [{"partition": 0, "end": 9, "committed": 6, "lag": 3}],
    }
    report = {
        "kafka": {"group": "m", "stages": {"chunker": stage}, "dead_letters": 2},
        "tenant": {
            "tenant": "t",
            "documents": 2,
            "documents_indexed": 1,
            "documents_deleted": 0,
            "facts": {"active": 4},
            "pending_facts": 0,
        },
    }
    lines = render(report).splitlines()
    assert lines[0] == "consumer group m" and lines[2].split() == ["chunker", "m.documents", "3", "1.5", "0:3"]
    assert (
        lines[3] == "dead letters: 2" and lines[4] == "tenant t: 1 of 2 documents indexed, 0 deleted; facts: 4 active"
    )


def test_the_report_says_when_memory_is_behind_its_log():
    """Redis holds the effects of a partition up to its applied offset: behind Kafka's committed
    one (Redis restored from a backup, or emptied) the report says memory is behind its log."""
    from ops.status import memory_behind_log
    from store.in_memory import InMemoryStore

    def stage(topic: str) -> dict:
        rows = [{"partition": p, "end": 12, "committed": 10, "lag": 2} for p in (0, 1, 2)]
        return {"topic": topic, "lag": 6, "per_second": 0.0, "partitions": rows}

    async def scenario():
        memory = InMemoryStore(dims=8)
        await memory.record_applied("m", "m.documents", 0, 9)  # every handled message held
        await memory.record_applied("m", "m.documents", 1, 4)  # a backup from before offset 5
        await memory.record_applied("m", "m.documents", 1, 3)  # an old owner's late record lowers nothing
        kafka = {"group": "m", "stages": {"chunker": stage("m.documents")}, "dead_letters": 0}
        return kafka, await memory_behind_log(memory, kafka)

    kafka, behind = asyncio.run(scenario())
    assert [(b["partition"], b["applied"], b["committed"]) for b in behind] == [(1, 4, 10), (2, None, 10)]
    assert [r["applied"] for r in kafka["stages"]["chunker"]["partitions"]] == [9, 4, None]
    text = render({"kafka": kafka, "memory_behind_log": behind})
    assert "memory is behind its log" in text
    assert "m.documents[1] holds up to 4 of 10" in text and "m.documents[2] holds up to none of 10" in text
    assert "behind its log" not in render({"kafka": kafka, "memory_behind_log": []})
