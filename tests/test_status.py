"""`memstream status` (ops/status.py) without Kafka: a tenant's documents and facts as the
store holds them, an unknown tenant named, and the report rendered one line per stage. The
Kafka half runs against real workers in tests/test_end_to_end.py."""

from __future__ import annotations

import asyncio

import pytest

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


def test_status_ends_with_one_line_when_kafka_stops_answering_midway(tmp_path, monkeypatch, capsys):
    """A broker that stops answering after `memstream status` reached it (SIGSTOP here: a host
    gone, a network partition): reading the group's committed offsets retried without end, and
    the terminal hung. Now each read waits 15 s, and the command ends with one line naming Kafka
    and exit 1 — as it does when no broker answers at all, which printed a traceback."""
    import os
    import signal
    import threading
    import time

    from ops.cli import main
    from ops.stack.kafka_admin import ensure_topics
    from ops.stack.services import Stack
    from tests.chaos import free_kafka_port
    from workers.settings import Settings

    monkeypatch.setenv("MEMSTREAM_KAFKA_HEAP", "-Xmx384m")
    port = free_kafka_port(1)
    stack = Stack(Settings(home=tmp_path / "kafka", kafka_port=port))
    stack.service_up("kafka", lambda m: None)
    try:
        monkeypatch.setenv("MEMSTREAM_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
        monkeypatch.setenv("MEMSTREAM_KAFKA_PORT", str(port))
        ensure_topics(Settings.from_env(), partitions=1)
        broker = stack.kafka.pid()
        assert broker is not None
        ended: list[int] = []
        command = threading.Thread(target=lambda: ended.append(main(["status", "--sample", "6"])), daemon=True)
        command.start()
        time.sleep(3)  # connected, the first offsets read: the broker stops during the sample
        os.killpg(broker, signal.SIGSTOP)
        try:
            command.join(60)
            assert not command.is_alive(), "memstream status still waiting on a silent broker after 60 s"
        finally:
            os.killpg(broker, signal.SIGCONT)
        assert ended == [1]
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and said[0].startswith(f"memstream: Kafka at 127.0.0.1:{port} did not answer"), said
    finally:
        stack.service_down("kafka")


def test_a_kafka_refusal_is_not_called_a_broker_that_did_not_answer():
    """A kafka-python error reaching the CLI is one line either way; only a retriable one (a
    timeout, a lost connection) asks whether Kafka runs — an authorization failure answered."""
    from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError

    from ops.cli import _service_away
    from workers.settings import Settings

    settings = Settings(kafka_bootstrap="127.0.0.1:9")
    assert _service_away(KafkaTimeoutError("Unable to bootstrap"), settings) == (
        "Kafka at 127.0.0.1:9 did not answer (KafkaTimeoutError: KafkaTimeoutError: Unable to bootstrap); "
        "is it running? (`memstream stack up`, MEMSTREAM_KAFKA_BOOTSTRAP)"
    )
    refused = _service_away(TopicAuthorizationFailedError("memstream.documents"), settings)
    assert refused is not None and refused.startswith("Kafka at 127.0.0.1:9 refused the command (TopicAuthorization")
    assert _service_away(ValueError("a bug"), settings) is None


@pytest.mark.stack
def test_export_of_a_tenant_that_holds_no_memory_warns_as_query_and_status_do(stack_env, capsys):
    """`memstream export --tenant nosuch` printed an empty export and said nothing (an audit);
    a misspelt tenant now gets the warning `query` and `status` give."""
    import json
    import uuid

    from ops import cli

    tenant = f"nobody-{uuid.uuid4().hex[:8]}"
    assert cli.main(["export", "--tenant", tenant]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["facts"] == []
    assert f"warning: tenant {tenant!r} holds no memory (nothing was ever indexed for it)" in err


def test_status_refuses_a_sample_that_is_not_a_number_of_seconds(capsys):
    """Before: `--sample inf` ended in time.sleep's OverflowError traceback (only a negative one
    was refused), and a sample of days was taken. Now argparse refuses it, exit 2."""
    import pytest

    from ops.cli import main

    for bad in ("inf", "nan", "-1", "3601", "two"):
        with pytest.raises(SystemExit) as exit:
            main(["status", "--sample", bad])
        assert exit.value.code == 2
        assert f"argument --sample: must be a number of seconds from 0 to 3600, not '{bad}'" in capsys.readouterr().err


def test_tail_refuses_a_limit_or_idle_timeout_that_would_not_end_it(monkeypatch, capsys):
    """Before: `tail --limit -1` exited 0 printing nothing and `--idle-timeout nan` never
    stopped. Now argparse refuses them, exit 2, before Kafka is reached."""
    import pytest

    from ops.cli import main
    from ops.stack.services import free_port

    monkeypatch.setenv("MEMSTREAM_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")  # (the old code's connect fails)
    for flag, bad, said in (
        ("--limit", "-1", "must be a whole number >= 1"),
        ("--limit", "0", "must be a whole number >= 1"),
        ("--idle-timeout", "nan", "must be a number of seconds above 0"),
        ("--idle-timeout", "-2", "must be a number of seconds above 0"),
    ):
        with pytest.raises(SystemExit) as exit:
            main(["tail", flag, bad])
        assert exit.value.code == 2 and f"argument {flag}: {said}, not '{bad}'" in capsys.readouterr().err
