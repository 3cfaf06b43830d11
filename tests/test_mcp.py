"""The MCP server (workers.query.mcp_server) through the official SDK's own client: over stdio
(`memstream mcp --tenant T` as a subprocess), over streamable HTTP at /mcp of the query
worker's address (query_app served on a port, next to /v1/query), and in process (the SDK's
in-process client, for what needs no stack: argument errors, an unreachable Kafka, `as_of`).

The memory is written by the in-process harness (tests/inprocess.py: the four stages over the
stack's Redis, with the workers' real embedder so the server's query vectors match), then read
by the MCP server; `remember` is read back from the documents topic with kafka-python."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from ops.stack.services import free_port
from tests import inprocess
from tests.conftest import ROOT
from tests.inprocess import InProcess, ScriptedExtractor
from topics import ContractError, Document, DocumentDeletion, decode
from workers.publisher import ClientPublisher
from workers.query.answers import Evidence, PassageRecord, QueryResult, StandingFacts
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.mcp_server import memory_server
from workers.query.modes import mode_names
from workers.settings import Settings

TRIP = "The Garcia family flies from Boston to Madrid on 14 June; the whole trip must cost at most 2400 euros."
VISA = (
    "We won't route the Garcias through Miami: two of the passengers have no US visa, so a US transit is not an option."
)
HOTEL = "Booking Hotel Prado failed: HTTP 409 ROOM_UNAVAILABLE for the nights of 14-18 June."
NOISE = "Lucia asked whether the paella in Valencia is better than in Madrid.  \n"  # trailing bytes kept as published
CORPUS = {"trip": TRIP, "visa": VISA, "hotel": HOTEL, "noise": NOISE}
SCRIPT = {
    TRIP: [("Garcia family", "flies to", "Madrid", "GROUP", "PLACE")],
    VISA: [("Garcia family", "rejected transit via", "Miami", "GROUP", "PLACE")],
    HOTEL: [("Hotel Prado", "returned", "ROOM_UNAVAILABLE", "HOTEL", "ERROR")],
    NOISE: [("Lucia", "asked about", "Valencia", "PERSON", "PLACE")],
}
QUESTION = "Can the Garcias have a transit through Miami?"
TOOLS = {"search_memory", "remember", "forget", "retract_fact", "fact_evidence", "get_passage", "standing_facts"}
real_embedder = inprocess.real_embedder  # the fixture, registered in this module


async def index_corpus(redis_url: str | None, embedder) -> tuple[InProcess, dict]:
    """CORPUS through the pipeline into a fresh tenant; returns the harness and
    {doc_id: {"passage": id, "fact": id}}."""
    stages = InProcess(redis_url, ScriptedExtractor(SCRIPT), embedder, tau=1)
    for doc_id, text in CORPUS.items():
        await stages.publish(doc_id, text)
    facts = await stages.facts()
    written = {}
    for doc_id, text in CORPUS.items():
        head, _, tail = SCRIPT[text][0][:3]  # (relations are stored lemmatised: "rejects" → "reject")
        fact = next(f for f in facts.values() if (f.head, f.tail) == (head, tail))
        assert fact.status == "active" and len(fact.passage_ids) == 1
        written[doc_id] = {"passage": fact.passage_ids[0], "fact": fact.id}
    return stages, written


async def check_tools(client: Client, tenant: str, written: dict) -> None:
    """What every transport must answer: the four tools, a search that finds the passage asked
    about, the drill-down with the exact published text, and bad requests as tool errors."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    assert tools["search_memory"].input_schema["required"] == ["query"]
    assert set(tools["search_memory"].input_schema["properties"]) == {"query", "mode", "top_k", "as_of"}
    assert tools["search_memory"].output_schema["properties"]["passages"]["type"] == "array"
    # the output schemas are the query side's typed answers' own (workers.query.answers)
    for tool, answer_type in [
        ("search_memory", QueryResult),
        ("fact_evidence", Evidence),
        ("get_passage", PassageRecord),
        ("standing_facts", StandingFacts),
    ]:
        assert set(tools[tool].output_schema["properties"]) == set(answer_type.model_json_schema()["properties"]), tool
    assert tools["fact_evidence"].annotations.read_only_hint and not tools["remember"].annotations.read_only_hint

    for mode in mode_names():
        found = await client.call_tool("search_memory", {"query": QUESTION, "mode": mode, "top_k": 2})
        assert not found.is_error, found.content
        answer = found.structured_content
        assert answer["tenant"] == tenant and answer["mode"] == mode
        assert QueryResult.model_validate(answer).mode == mode  # the structured content reads back as the type
        top = answer["passages"][0]
        assert (top["id"], top["doc_id"], top["text"]) == (written["visa"]["passage"], "visa", VISA), answer["passages"]
        assert (
            json.loads(found.content[0].text) == answer
        )  # the same answer as text, for clients that read only content

    evidence = await client.call_tool("fact_evidence", {"fact_id": written["visa"]["fact"]})
    assert not evidence.is_error, evidence.content
    fact = evidence.structured_content["fact"]
    assert (fact["id"], fact["head"], fact["relation"], fact["tail"]) == (
        written["visa"]["fact"],
        "Garcia family",
        "reject transit via",
        "Miami",
    )
    assert [(p["id"], p["text"]) for p in evidence.structured_content["passages"]] == [
        (written["visa"]["passage"], VISA)
    ]

    passage = await client.call_tool("get_passage", {"passage_id": written["noise"]["passage"]})
    assert (
        not passage.is_error
        and passage.structured_content["text"] == NOISE
        and passage.structured_content["doc_id"] == "noise"
    )

    async def error(tool: str, arguments: dict) -> str:
        result = await client.call_tool(tool, arguments)
        assert result.is_error, result.structured_content
        return result.content[0].text

    # the messages of POST /v1/query's 400s and the drill-down routes' 404s
    assert (
        await error("search_memory", {"query": "  "})
        == "Error executing tool search_memory: 'query' must be a non-empty string"
    )
    assert (
        await error("search_memory", {"query": QUESTION, "mode": "telepathy"})
        == f"Error executing tool search_memory: 'mode' must be one of {', '.join(mode_names())}"
    )
    assert (
        await error("search_memory", {"query": QUESTION, "top_k": 0})
        == "Error executing tool search_memory: 'top_k' must be an integer from 1 to 100"
    )
    assert (
        await error("get_passage", {"passage_id": "nope"})
        == f"Error executing tool get_passage: no passage 'nope' in tenant '{tenant}'"
    )
    assert (
        await error("fact_evidence", {"fact_id": "nope"})
        == f"Error executing tool fact_evidence: no fact 'nope' in tenant '{tenant}'"
    )
    assert "query" in await error("search_memory", {})  # the SDK's own argument validation: the missing argument named
    # the server still answers after the errors
    assert not (await client.call_tool("get_passage", {"passage_id": written["trip"]["passage"]})).is_error


def test_stdio_memstream_mcp_serves_one_tenant_and_remembers_onto_the_documents_topic(stack_env, real_embedder):
    from kafka import KafkaConsumer, TopicPartition

    from ops.stack.kafka_admin import ensure_topics

    ns = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(stack_env, topic_namespace=ns, partitions=1)
    ensure_topics(settings)

    async def main():
        stages, written = await index_corpus(stack_env["MEMSTREAM_REDIS_URL"], real_embedder)
        try:
            env = {**stack_env, "MEMSTREAM_TOPIC_NAMESPACE": ns, "MEMSTREAM_TAU": "1", "MEMSTREAM_LOG_LEVEL": "warning"}
            params = StdioServerParameters(
                command=sys.executable, args=["-m", "ops.cli", "mcp", "--tenant", stages.tenant], env=env, cwd=str(ROOT)
            )
            async with Client(params, read_timeout_seconds=120) as client:
                await check_tools(client, stages.tenant, written)
                turn = await client.call_tool(
                    "remember",
                    {
                        "text": "Ana: no red-eye flights, the kids need sleep.\n",
                        "session_id": "trip-7",
                        "turn": 3,
                        "speaker": "Ana",
                        "ts": "2025-05-08T13:56:00Z",
                        "metadata": {"channel": "chat"},
                    },
                )
                note = await client.call_tool("remember", {"text": "Prefers aisle seats."})
                bad = await client.call_tool("remember", {"text": "no speaker", "session_id": "trip-7", "turn": 4})
                forgot = await client.call_tool("forget", {"doc_id": "trip-7:3"})
                erased = await client.call_tool("forget", {"doc_id": "trip-7:3", "purge": True})
                blank = await client.call_tool("forget", {"doc_id": " "})
                retracted = await client.call_tool(
                    "retract_fact", {"fact_id": written["visa"]["fact"], "reason": "visa granted"}
                )
                unknown = await client.call_tool("retract_fact", {"fact_id": "f-none"})
            return stages.tenant, turn, note, bad, forgot, erased, blank, retracted, unknown, written
        finally:
            await stages.close()

    tenant, turn, note, bad, forgot, erased, blank, retracted, unknown, written = asyncio.run(main())
    assert not retracted.is_error and retracted.structured_content["request"].startswith(
        f"retract:{written['visa']['fact']}:"
    )
    assert unknown.is_error and f"no fact 'f-none' in tenant '{tenant}'" in unknown.content[0].text
    sets = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:  # the retraction waits on conflict-sets for the resolver, keyed by the fact's head
        where = TopicPartition(f"{ns}.conflict-sets", 0)
        sets.assign([where])
        sets.seek_to_beginning()
        queued = [json.loads(r.value) for batch in sets.poll(timeout_ms=5000).values() for r in batch]
    finally:
        sets.close()
    assert [(q["kind"], q["fact_id"], q["reason"]) for q in queued] == [
        ("retract", written["visa"]["fact"], "visa granted")
    ]
    assert (
        forgot.structured_content
        == erased.structured_content
        == {"doc_id": "trip-7:3", "tenant": tenant, "topic": f"{ns}.documents", "queued": True}
    )
    assert blank.is_error and "doc_id must not be empty" in blank.content[0].text
    assert not turn.is_error, turn.content
    assert turn.structured_content == {
        "doc_id": "trip-7:3",
        "tenant": tenant,
        "topic": f"{ns}.documents",
        "queued": True,
    }
    assert not note.is_error and note.structured_content["doc_id"].startswith("memory-")
    assert (
        bad.is_error
        and bad.content[0].text == "Error executing tool remember: remember: a turn needs a non-empty string 'speaker'"
    )

    # everything on the topic (remember returns once the broker has acked): up to its end offset
    partition = TopicPartition(f"{ns}.documents", 0)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning()
        end, records = consumer.end_offsets([partition])[partition], []
        while consumer.position(partition) < end:
            for batch in consumer.poll(timeout_ms=1000).values():
                records += [(r.key.decode(), None if r.value is None else decode(Document, r.value)) for r in batch]
    finally:
        consumer.close()
    # keys: tenant/doc id (topics.document_key); the bad turn was never sent; forget: a tombstone;
    # forget with purge: the erasure, then a tombstone
    assert [key for key, _ in records] == [f"{tenant}/trip-7:3", f"{tenant}/{note.structured_content['doc_id']}"] + [
        f"{tenant}/trip-7:3"
    ] * 3
    assert (
        records[2][1] is None
        and records[3][1] == DocumentDeletion(tenant, "trip-7:3", purge=True)
        and records[4][1] is None
    )
    doc = records[0][1]
    assert (doc.tenant, doc.text, doc.session_id, doc.turn, doc.speaker) == (
        tenant,
        "Ana: no red-eye flights, the kids need sleep.\n",
        "trip-7",
        3,
        "Ana",
    )
    assert doc.ts == 1746712560.0 and doc.metadata == {"channel": "chat", "turn_id": "3"}
    assert records[1][1].text == "Prefers aisle seats." and records[1][1].session_id is None


def test_streamable_http_at_mcp_on_the_query_workers_address(stack_env, real_embedder):
    from tests.test_query_worker import call
    from workers.query.server import query_app, serve

    async def main():
        stages, written = await index_corpus(stack_env["MEMSTREAM_REDIS_URL"], real_embedder)
        port = free_port()
        settings = Settings.from_env(stack_env, tenant=stages.tenant, http_port=port, tau=1)
        stop = asyncio.Event()
        server = asyncio.create_task(serve(query_app(settings, real_embedder), "127.0.0.1", port, stop))
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):  # until it listens
                try:
                    await asyncio.to_thread(call, base, "/healthz")
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            async with Client(f"{base}/mcp") as client:
                await check_tools(client, stages.tenant, written)
                # a text of max_text_bytes reaches the tool (its bad time refused there, nothing
                # published), not a 413 at aiohttp's default body limit of 1 MiB
                near_limit = await client.call_tool(
                    "remember", {"text": "x" * (settings.max_text_bytes - 100), "ts": "last Tuesday-ish"}
                )
                assert near_limit.is_error and "'ts' must be seconds" in near_limit.content[0].text
            async with Client(f"{base}/mcp/", mode="legacy") as client:  # the initialize handshake of pre-2026 clients
                legacy = await client.call_tool("search_memory", {"query": QUESTION, "top_k": 1})
            # the HTTP API still answers on the same address
            status, answer = await asyncio.to_thread(call, base, "/v1/query", {"query": QUESTION, "top_k": 1})
            return stages.tenant, written, legacy, status, answer
        finally:
            stop.set()
            await server  # the MCP session manager and the Redis pool close with the application
            await stages.close()

    tenant, written, legacy, status, answer = asyncio.run(main())
    assert not legacy.is_error and legacy.structured_content["passages"][0]["text"] == VISA
    assert status == 200 and answer["tenant"] == tenant and answer["passages"][0]["id"] == written["visa"]["passage"]


# ---- in process: no stack ---------------------------------------------------------------------


def test_remember_refuses_bad_input_and_names_an_unreachable_kafka():
    unreachable = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}")

    async def main():
        stages = InProcess(None, ScriptedExtractor({}))
        server = memory_server(
            stages.tenant,
            QueryEngine(stages.memory, stages.embedder),
            unreachable,
            ClientPublisher(unreachable, timeout_s=1),
        )
        try:
            async with Client(server) as client:
                calls = [
                    {"text": "   "},
                    {"text": "bad time", "ts": "last Tuesday-ish"},
                    {"text": "nul \x00 inside"},
                    {"text": "a turn", "session_id": "s", "turn": -1, "speaker": "Ana"},
                    {"text": "in milliseconds", "ts": 1683554160000},
                    {"text": "bad ttl", "metadata": {"ttl_seconds": -5}},
                    {"text": "fine", "doc_id": "note-1"},
                ]
                return [await client.call_tool("remember", arguments) for arguments in calls]
        finally:
            await stages.close()

    empty, bad_time, nul, negative_turn, millis, bad_ttl, unreachable_kafka = results = asyncio.run(main())
    messages = [r.content[0].text.removeprefix("Error executing tool remember: ") for r in results]
    assert all(r.is_error for r in results)
    assert messages[0] == "remember: field 'text' is empty"
    assert messages[1] == "remember: 'ts' must be seconds since the epoch or an ISO time, got 'last Tuesday-ish'"
    assert messages[2].startswith("remember.text:") and "U+0000" in messages[2]
    assert messages[3] == "remember: 'turn' must be a non-negative integer"
    assert (
        messages[4]
        == "remember: 'ts' must be seconds since the epoch within years 1-9999 (got 1.68355e+12: milliseconds?)"
    )
    assert messages[5].startswith("remember: metadata.ttl_seconds must be a whole number of seconds >= 0")
    assert messages[6].startswith(
        f"could not queue document 'note-1': Kafka at {unreachable.kafka_bootstrap} did not take it"
    )


async def _trip_server():
    """A harness holding the TRIP turn, and the MCP server of its tenant (Kafka never reached)."""
    stages = InProcess(None, ScriptedExtractor({TRIP: SCRIPT[TRIP]}), tau=1)
    await stages.publish("trip", TRIP)
    engine = QueryEngine(stages.memory, stages.embedder)
    return stages, memory_server(stages.tenant, engine, stages.settings, ClientPublisher(stages.settings))


def test_search_memory_passes_as_of_to_the_query_request():
    """`as_of` reaches QueryRequest (and its validation: a bad time is the HTTP 400's message)."""

    async def main():
        stages, server = await _trip_server()
        try:
            async with Client(server) as client:
                later = await client.call_tool("search_memory", {"query": TRIP, "as_of": "2999-01-01T00:00:00Z"})
                bad = await client.call_tool("search_memory", {"query": TRIP, "as_of": "the day after tomorrow"})
            return stages.tenant, later, bad
        finally:
            await stages.close()

    tenant, later, bad = asyncio.run(main())
    assert not later.is_error and later.structured_content["passages"][0]["text"] == TRIP
    with pytest.raises(ContractError) as refused:
        QueryRequest.from_json({"query": TRIP, "as_of": "the day after tomorrow"}, tenant, 5)
    assert bad.is_error and bad.content[0].text == f"Error executing tool search_memory: {refused.value}"


def test_every_tool_refuses_an_argument_it_does_not_declare():
    """A misspelt argument is a tool error naming it (the SDK's argument models dropped it: a
    search with "asof" answered from today), as POST /v1/query refuses an unknown field."""

    async def main():
        stages, server = await _trip_server()
        try:
            async with Client(server) as client:
                tools = [tool.name for tool in (await client.list_tools()).tools]
                refused = {name: await client.call_tool(name, {"no_such_argument": 1}) for name in tools}
                misspelt = await client.call_tool("search_memory", {"query": TRIP, "asof": "2020-01-01T00:00:00Z"})
                fine = await client.call_tool("search_memory", {"query": TRIP, "as_of": "2999-01-01T00:00:00Z"})
            return refused, misspelt, fine
        finally:
            await stages.close()

    refused, misspelt, fine = asyncio.run(main())
    assert len(refused) == 7
    for name, result in refused.items():
        assert (
            result.is_error
            and f"unknown field(s) in the arguments of {name}: 'no_such_argument'" in result.content[0].text
        )
    assert misspelt.is_error and "'asof' (did you mean 'as_of'?)" in misspelt.content[0].text
    assert not fine.is_error and fine.structured_content["passages"][0]["text"] == TRIP


def test_memstream_mcp_builds_its_engine_from_the_settings_as_the_query_worker_does():
    """`memstream mcp` (stdio_parts) honours MEMSTREAM_ROUTER, MEMSTREAM_RECONSTRUCT_* and the
    graph cache's size, as query_app does: one construction, QueryEngine.from_settings."""
    from workers.algorithms.reconstruction import Budget
    from workers.query.mcp_server import stdio_parts

    settings = Settings.from_env(
        {
            "MEMSTREAM_ROUTER": "llm",
            "MEMSTREAM_LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
            "MEMSTREAM_LLM_MODEL": "router-model",
            "MEMSTREAM_RECONSTRUCT_STEPS": "2",
            "MEMSTREAM_RECONSTRUCT_PASSAGES": "3",
            "MEMSTREAM_GRAPH_CACHE_EDGES": "1234",
        },
        redis_url=f"redis://127.0.0.1:{free_port()}",
    )  # nothing is read: no Redis needed

    async def main():
        async with stdio_parts(settings, "acme") as (server, engine):
            async with Client(server) as client:
                tools = {t.name for t in (await client.list_tools()).tools}
            return tools, engine.reconstructor.router.name, engine.reconstructor.budget, engine.graphs.max_edges

    tools, router, budget, max_edges = asyncio.run(main())
    assert tools == TOOLS
    assert (router, budget, max_edges) == ("llm", Budget(2, 3, settings.reconstruct_tokens), 1234)


def test_standing_facts_lists_what_get_v1_facts_lists_and_refuses_an_unknown_category():
    from tests.test_query_server import STANDING_ROWS, _rows, standing_memory
    from workers.query import drilldown

    async def main():
        stages = await standing_memory(None)
        server = memory_server(
            stages.tenant,
            QueryEngine(stages.memory, stages.embedder),
            stages.settings,
            ClientPublisher(stages.settings),
        )
        try:
            async with Client(server) as client:
                tool = next(t for t in (await client.list_tools()).tools if t.name == "standing_facts")
                every = await client.call_tool("standing_facts", {})
                failures = await client.call_tool("standing_facts", {"categories": ["TOOL_FAILURE"], "limit": 1})
                unknown = await client.call_tool("standing_facts", {"categories": ["HARD_CONSTRAINT", "NOPE"]})
                over = await client.call_tool("standing_facts", {"limit": 501})
            return (
                tool,
                every,
                failures,
                unknown,
                over,
                (await drilldown.standing_facts(stages.memory, stages.tenant)).to_json(),
            )
        finally:
            await stages.close()

    tool, every, failures, unknown, over, read = asyncio.run(main())
    assert tool.annotations.read_only_hint and set(tool.input_schema["properties"]) == {"categories", "limit"}
    assert not every.is_error and every.structured_content == read and _rows(every.structured_content) == STANDING_ROWS
    assert not failures.is_error and [f["tail"] for f in failures.structured_content["facts"]] == ["ROOM_UNAVAILABLE"]
    assert unknown.is_error and unknown.content[0].text == (
        "Error executing tool standing_facts: unknown fact category 'NOPE': "
        "expected DECLARATIVE, HARD_CONSTRAINT, REJECTED_OPTION, TOOL_FAILURE"
    )
    assert (
        over.is_error
        and over.content[0].text == "Error executing tool standing_facts: 'limit' must be an integer from 1 to 500"
    )


def test_the_asgi_bridge_sends_no_body_after_a_head_s_headers():
    """An ASGI app answers HEAD as it answers GET (Starlette's do): the bridge wrote the body
    after the headers, read by the client as the start of the connection's next response."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from workers.query.asgi import asgi_handler

    async def app(scope, receive, send):
        body = b'{"error": "no such stream"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 405, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def main():
        served = web.Application()
        served.router.add_route("*", "/asgi", asgi_handler(app))
        async with TestClient(TestServer(served)) as client:
            reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
            writer.write(
                b"HEAD /asgi HTTP/1.1\r\nHost: t\r\n\r\nGET /asgi HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            received = b""
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    received += chunk
            writer.close()
            return received

    received = asyncio.run(main())
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405") and b"content-length: 27" in head.lower()
    assert rest.startswith(b"HTTP/1.1 405"), received  # the GET's answer right after the HEAD's headers
    assert rest.endswith(b'{"error": "no such stream"}')


def test_retract_fact_refuses_a_reason_the_resolver_would_refuse_as_the_http_route_does():
    """retract_fact passed `reason` on unchecked: "a\\u0000b" was queued and the resolver
    dead-lettered it. Now it is the tool error of POST /v1/facts/{id}/retract's 400 (publisher.check_reason)."""
    from workers.publisher import check_reason

    unreachable = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}")

    async def main():
        stages = InProcess(None, ScriptedExtractor({TRIP: SCRIPT[TRIP]}), tau=1)
        await stages.publish("trip", TRIP)
        engine = QueryEngine(stages.memory, stages.embedder)
        server = memory_server(stages.tenant, engine, unreachable, ClientPublisher(unreachable, timeout_s=1))
        try:
            async with Client(server) as client:
                found = await client.call_tool("search_memory", {"query": TRIP, "top_k": 1})
                fact_id = found.structured_content["facts"][0]["id"]  # a fact it holds: only the reason is wrong
                return await client.call_tool("retract_fact", {"fact_id": fact_id, "reason": "a\x00b"})
        finally:
            await stages.close()

    refused = asyncio.run(main())
    with pytest.raises(ContractError) as expected:
        check_reason("a\x00b")
    assert str(expected.value).startswith("'reason': control character U+0000 at index 1")
    assert refused.is_error and refused.content[0].text == f"Error executing tool retract_fact: {expected.value}"


def test_search_memory_checks_top_k_as_post_v1_query_does():
    """The SDK's argument model took `top_k: true` as 1 and "5" as 5, which POST /v1/query
    refuses: now the value as sent meets QueryRequest's check, the same message as the 400."""

    async def main():
        stages, server = await _trip_server()
        try:
            async with Client(server) as client:
                tool = next(t for t in (await client.list_tools()).tools if t.name == "search_memory")
                answers = [
                    await client.call_tool("search_memory", {"query": TRIP, "top_k": top_k})
                    for top_k in (True, "5", 2.0, 0, 1)
                ]
            return stages.tenant, tool, answers
        finally:
            await stages.close()

    tenant, tool, (boolean, text, real, zero, one) = asyncio.run(main())
    assert tool.input_schema["properties"]["top_k"]["type"] == "integer"  # still offered as an integer
    for top_k, refused in ((True, boolean), ("5", text), (2.0, real), (0, zero)):
        with pytest.raises(ContractError) as http_400:
            QueryRequest.from_json({"query": TRIP, "top_k": top_k}, tenant, 5)
        assert refused.is_error and refused.content[0].text == f"Error executing tool search_memory: {http_400.value}"
    assert not one.is_error and len(one.structured_content["passages"]) == 1


def test_standing_facts_checks_limit_as_get_v1_facts_does():
    """The SDK's argument model took `limit: true` as 1 (a review, after top_k's fix): the value
    as sent meets drilldown.parse_limit, the GET listings' check."""

    async def main():
        stages, server = await _trip_server()
        try:
            async with Client(server) as client:
                return [await client.call_tool("standing_facts", {"limit": limit}) for limit in (True, 0, 2.5, 1)]
        finally:
            await stages.close()

    *refused, one = asyncio.run(main())
    for answer in refused:
        assert answer.is_error and "'limit' must be an integer from 1 to 500" in answer.content[0].text
    assert not one.is_error


def test_memstream_mcp_closed_at_once_exits_quietly(tmp_path):
    """Before: `: | memstream mcp` (a client that closes at once) printed "Exception in thread
    embedder-load … can't register atexit after shutdown": the model's background load raced
    the interpreter's shutdown. The server waits for the load before it exits."""
    import os
    import subprocess

    nowhere = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "MEMSTREAM_REDIS_URL": f"redis://{nowhere}/0",
        "MEMSTREAM_KAFKA_BOOTSTRAP": nowhere,
        "MEMSTREAM_HOME": str(tmp_path),
        "MEMSTREAM_EMBEDDER": "local",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "mcp", "--tenant", "acme"],
        input="",
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0 and proc.stdout == ""
    assert "Exception in thread" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
