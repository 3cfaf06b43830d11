"""`memstream fact / facts / passage`: the drill-downs (workers.query.drilldown) return typed
records, and the CLI writes their JSON (`to_json`, as GET /v1/facts... answers) or a passage's
text. Over the in-memory store: Memory.from_url hands the command the harness's store."""

from __future__ import annotations

import asyncio
import json

import pytest

import store
from ops.cli import main
from tests.inprocess import InProcess, ScriptedExtractor

TEXT = "Ada refuses ferries."


class _Unclosed:
    """The harness's store as the command's Memory: the command closes it, the harness keeps it."""

    def __init__(self, memory):
        self._memory = memory

    def __getattr__(self, name):
        return getattr(self._memory, name)

    async def close(self) -> None:
        pass


@pytest.fixture
def indexed(monkeypatch):
    stages = InProcess(None, ScriptedExtractor({TEXT: [("Ada", "refuses", "ferries")]}), tau=1)

    async def index() -> tuple[str, str]:
        await stages.publish("d1", TEXT)
        [fact] = (await stages.facts()).values()
        return fact.id, fact.passage_ids[0]

    fact_id, passage_id = asyncio.run(index())
    monkeypatch.setattr(store.Memory, "from_url", staticmethod(lambda url, **kw: _Unclosed(stages.memory)))
    return stages.tenant, fact_id, passage_id


def _run(capsysbinary, *argv: str) -> bytes:
    assert main(list(argv)) == 0
    return capsysbinary.readouterr().out


def test_the_drilldown_commands_write_each_record(indexed, capsysbinary):
    tenant, fact_id, passage_id = indexed
    fact = json.loads(_run(capsysbinary, "fact", fact_id, "--tenant", tenant))
    assert (fact["id"], fact["head"], fact["tail"]) == (fact_id, "Ada", "ferries")
    evidence = json.loads(_run(capsysbinary, "fact", fact_id, "--evidence", "--tenant", tenant))
    assert evidence["fact"]["id"] == fact_id and [p["text"] for p in evidence["passages"]] == [TEXT]
    listed = json.loads(_run(capsysbinary, "facts", "--category", "DECLARATIVE", "--tenant", tenant))
    assert listed["total"] == 1 and listed["facts"][0]["doc_ids"] == ["d1"]
    passage = json.loads(_run(capsysbinary, "passage", passage_id, "--tenant", tenant))
    assert (passage["text"], passage["doc_ids"]) == (TEXT, ["d1"])
    assert _run(capsysbinary, "passage", passage_id, "--text", "--tenant", tenant) == TEXT.encode()


def test_facts_takes_category_repeated_as_docs_usage_says(indexed, capsysbinary):
    """Before: `facts --category A --category B` listed B alone, silently; the flag repeated adds
    up, as ?category=A&category=B does."""
    tenant = indexed[0]
    listed = json.loads(
        _run(capsysbinary, "facts", "--category", "DECLARATIVE", "--category", "TOOL_FAILURE", "--tenant", tenant)
    )
    assert set(listed["categories"]) == {"DECLARATIVE", "TOOL_FAILURE"} and listed["total"] == 1
    listed = json.loads(_run(capsysbinary, "facts", "--category", "TOOL_FAILURE,DECLARATIVE", "--tenant", tenant))
    assert set(listed["categories"]) == {"DECLARATIVE", "TOOL_FAILURE"} and listed["total"] == 1


def test_a_redis_away_is_named_by_its_address_never_with_its_password(monkeypatch, capsys):
    """`memstream fact` with Redis away printed MEMSTREAM_REDIS_URL whole, password and all, and
    a command meeting a unix socket's Redis away named no address ("Redis at  did not answer"):
    both name the address (Settings.redis_address) now."""
    monkeypatch.setenv("MEMSTREAM_REDIS_URL", "redis://:hunter2secret@127.0.0.1:1/0")
    assert main(["fact", "f-1", "--tenant", "acme"]) == 1
    err = capsys.readouterr().err
    assert "hunter2secret" not in err and "Redis at 127.0.0.1:1" in err
    monkeypatch.setenv("MEMSTREAM_REDIS_URL", "unix:///nonexistent/memstream-redis.sock")
    assert main(["tenants"]) == 1
    assert "Redis at /nonexistent/memstream-redis.sock did not answer" in capsys.readouterr().err
