"""Bounded queries and load that is queued or shed: out-of-range
retrieval parameters, NaN/Infinity and lone surrogates are 400s with a JSON body; requests past
the in-flight cap are 503 + Retry-After; every error body is JSON; PPR stops at its pass cap and
says so, and runs off the event loop; a saturated Redis pool queues commands.

The HTTP tests serve the query worker's real application (`workers.query.server.query_app`, its
routes and middlewares) from aiohttp's test server: no Kafka, and Redis only where a test says so."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from store.memory import Hit
from store.records import passage_json
from topics import ContractError
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.graph_cache import TenantGraph
from workers.settings import Settings

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: these tests never get that far


class GatedEmbedder:
    """The first `hold` calls wait until `release` is set; any later call is a test failure
    surfacing as HTTP 500 (a request that should never have reached the engine)."""

    dims = 384

    def __init__(self, hold: int = 0):
        self.hold = hold
        self.calls = 0
        self.release = asyncio.Event()

    async def embed(self, texts):
        self.calls += 1
        if self.calls <= self.hold:
            await self.release.wait()
        raise RuntimeError("the engine was reached")


def serve(settings: Settings, embedder, requests):
    """Run `requests(client)` against the query worker's HTTP app; returns what it returns."""
    from aiohttp.test_utils import TestClient, TestServer

    from workers.query.server import query_app

    async def main():
        async with TestClient(TestServer(query_app(settings, embedder))) as client:
            return await requests(client)

    return asyncio.run(main())


async def post(client, body: bytes):
    response = await client.post("/v1/query", data=body, headers={"Content-Type": "application/json"})
    return response.status, response.headers, await response.json(content_type=None)


BAD_BODIES = {
    b'{"query": "x", "params": {"damping": 0.999999}}': "parameter 'damping' is 0.999999; allowed range (0, 0.95]",
    b'{"query": "x", "params": {"tolerance": 1e-12}}': "parameter 'tolerance' is 1e-12; allowed range [1e-09, 0.01]",
    b'{"query": "x", "params": {"tau_q": NaN}}': "NaN is not a JSON number",
    b'{"query": "x", "params": {"alpha": Infinity}}': "Infinity is not a JSON number",
    b'{"query": "x", "params": {"alpha": -Infinity}}': "-Infinity is not a JSON number",
    b'{"query": "x", "params": {"temperature": 1e999}}': "number 1e999 is beyond the range of a double",
    b'{"query": "x", "params": {"alpha": 1'
    + b"0" * 400
    + b"}}": "parameter 'alpha' is out of range; allowed range [0, 1000]",
    b'{"query": "x", "top_k": 1' + b"0" * 5000 + b"}": "request body is not valid JSON",
    b'{"query": "x", "params": {"layer_k": 2.5}}': "parameter 'layer_k' must be int",
    b'{"query": "\\ud800 who runs the mill?"}': "'query' is not valid Unicode: lone surrogate U+D800 at character 0",
    b'{"query": "x", "tenant": "t\\udfff"}': "'tenant' is not valid Unicode: lone surrogate U+DFFF at character 1",
    b'{"query": "x", "\\ud83d": 1}': "a key in the body is not valid Unicode",
    b"[" * 100_000 + b"]" * 100_000: "nested too deeply",
    b'{"query": "caf\xe9"}': "request body is not UTF-8",
}


def test_bad_input_is_400_with_a_json_body_naming_what_is_wrong():
    async def requests(client):
        return {body: await post(client, body) for body in BAD_BODIES}

    embedder = GatedEmbedder()
    answers = serve(Settings(redis_url=NO_REDIS), embedder, requests)
    for body, expected in BAD_BODIES.items():
        status, _, answer = answers[body]
        assert status == 400 and expected in answer["error"], (body[:60], status, answer)
    assert embedder.calls == 0


def test_bounds_are_checked_where_requests_are_built():
    with pytest.raises(ContractError, match=r"'damping' is 0.999999; allowed range \(0, 0.95\]"):
        QueryRequest.from_json({"query": "x", "params": {"damping": 0.999999}}, "default", 5)
    with pytest.raises(ContractError, match="lone surrogate"):
        QueryRequest.from_json({"query": "who\udc00"}, "default", 5)
    with pytest.raises(ContractError, match="NaN is not a JSON number"):
        QueryRequest.from_bytes(b'{"query": "x", "params": {"damping": NaN}}', "default", 5)
    at_the_bounds = QueryRequest.from_json({"query": "x", "params": {"damping": 0.95, "tolerance": 1e-9}}, "default", 5)
    assert (at_the_bounds.params.damping, at_the_bounds.params.tolerance) == (0.95, 1e-9)


def test_requests_past_the_inflight_cap_are_503_with_retry_after_and_probes_are_not_shed():
    embedder = GatedEmbedder(hold=2)

    async def requests(client):
        held = [asyncio.create_task(post(client, b'{"query": "held %d"}' % i)) for i in range(2)]
        while embedder.calls < 2:  # both admitted and inside the engine
            await asyncio.sleep(0.01)
        shed = await post(client, b'{"query": "one too many"}')
        health = await client.get("/healthz")
        embedder.release.set()
        await asyncio.gather(*held)
        return shed, health.status, await health.json(content_type=None)

    (status, headers, body), health_status, health = serve(
        Settings(redis_url=NO_REDIS, query_max_inflight=2), embedder, requests
    )
    assert status == 503 and headers["Retry-After"] == "1"
    assert "limit of 2 requests" in body["error"]
    assert embedder.calls == 2  # the shed request never reached the engine
    assert health_status == 503 and health["status"] == "unhealthy"  # answered (no Redis here), not shed
    assert health == {"status": "unhealthy", "redis": "unavailable"}  # no key needed: no hosts or ports in it


def test_every_error_body_is_json():
    async def requests(client):
        missing = await client.get("/v1/nothing-here")
        wrong_method = await client.get("/v1/query")
        failing = await post(client, b'{"query": "reaches the engine"}')
        return (
            (missing.status, await missing.json(content_type=None)),
            (wrong_method.status, await wrong_method.json(content_type=None)),
            failing,
        )

    (missing, wrong_method, failing) = serve(Settings(redis_url=NO_REDIS), GatedEmbedder(), requests)
    assert missing == (404, {"error": "Not Found: GET /v1/nothing-here"})
    assert wrong_method == (405, {"error": "Method Not Allowed: GET /v1/query"})
    status, _, body = failing  # an unexpected exception: still JSON
    assert status == 500 and body == {"error": "internal error: RuntimeError: the engine was reached"}


def test_a_redis_pool_that_stays_exhausted_is_a_503():
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redisvl.exceptions import RedisSearchError

    class Saturated:
        dims = 384

        async def embed(self, texts):  # what redisvl raises when the pool has no connection for it
            try:
                raise RedisConnectionError("No connection available.")
            except RedisConnectionError as exc:
                raise RedisSearchError(f"Error while searching: {exc}") from exc

    async def requests(client):
        return await post(client, b'{"query": "x"}')

    status, headers, body = serve(Settings(redis_url=NO_REDIS), Saturated(), requests)
    assert status == 503 and headers["Retry-After"] == "1" and "No connection available" in body["error"]


def hub_graph():
    from workers.algorithms.ppr import SparseGraph

    rng = np.random.default_rng(9)
    return SparseGraph.from_edges(
        (f"n{i}", f"n{int(rng.integers(0, 40))}", float(rng.uniform(0.5, 2))) for i in range(1, 400)
    )


def test_ppr_stops_at_its_pass_cap_and_reports_it():
    from workers.algorithms.ppr_solver import MAX_PASSES

    graph = hub_graph()
    reset = np.zeros(len(graph))
    reset[[3, 30, 300]] = [0.5, 0.3, 0.2]
    capped = graph.solve(reset, damping=0.999999, tol=1e-12)  # ~20,000 passes to converge
    assert capped.passes == MAX_PASSES and not capped.converged and capped.error_bound > 1e-12
    assert np.isfinite(capped.scores).all() and (capped.scores >= 0).all()
    with pytest.raises(ArithmeticError, match=f"in {MAX_PASSES} steps"):
        graph.pagerank(reset, damping=0.999999, tol=1e-12)
    within = graph.solve(reset, damping=0.95, tol=1e-9)  # the query worker's corner
    assert within.converged and within.passes < MAX_PASSES and within.error_bound <= 1e-9


def test_the_query_engine_runs_ppr_off_the_event_loop_and_reports_the_walk(monkeypatch):
    from workers.algorithms.ppr_solver import LeafEliminated, Transition

    graph = TenantGraph("t")
    for a, b, kind in [
        ("e:a", "e:b", "fact"),
        ("e:b", "e:c", "fact"),
        ("e:a", "p:p1", "passage"),
        ("e:c", "p:p2", "passage"),
    ]:
        graph.apply(a, b, 1.0, kind)
    fact = Hit(
        "f1",
        0.9,
        {
            "head": "A",
            "relation": "r",
            "tail": "B",
            "head_id": "a",
            "tail_id": "b",
            "status": "active",
            "category": "DECLARATIVE",
            "expired_at": None,
        },
    )

    class Memory:
        async def knn(self, tenant, layer, vector, k, fields, where=None):
            return {"facts": [fact], "passages": [Hit("p1", 0.8, {"doc_id": "d1"})]}.get(layer, [])

        async def lexical(self, tenant, query, k):
            return []

        async def passages_near_read(self, tenant, vector, k):
            return None  # reads no rows with its searches: the first stage reads them after

        async def lexical_read(self, tenant, query, k):
            return None

        async def graph_version(self, tenant):
            return 1

        async def passages(self, tenant, ids):
            return [passage_json(i, i, f"d-{i}", 0, 1, None, None) for i in ids]  # as the stores give them

        async def entity_names(self, tenant, ids):
            return {}

        async def claim_embedder(self, tenant, embedder, create):
            return embedder  # the tenant was built with the engine's embedder

    class Graphs:
        async def current(self, tenant):
            return graph

    class Embedder:
        dims = 4

        async def embed(self, texts):
            return np.ones((len(texts), 4), dtype=np.float32)

    solved_on = []

    def recording(solve):
        def solve_recorded(self, *args, **kwargs):
            solved_on.append(threading.get_ident())
            return solve(self, *args, **kwargs)

        return solve_recorded

    for iteration in (Transition, LeafEliminated):  # over the whole matrix, or with the passages eliminated
        monkeypatch.setattr(iteration, "solve", recording(iteration.solve))

    async def main():
        engine = QueryEngine(Memory(), Embedder(), Graphs())
        return (await engine.answer(QueryRequest("who?", "t", 2))).to_json(), threading.get_ident()

    result, loop_thread = asyncio.run(main())
    assert solved_on and loop_thread not in solved_on
    assert result["ppr"]["converged"] and result["ppr"]["passes"] > 0
    assert [p["id"] for p in result["passages"]] == ["p1", "p2"]


def test_a_saturated_redis_pool_queues_commands_instead_of_failing(stack_env):
    from store import Memory

    async def main():
        memory = Memory.from_url(stack_env["MEMSTREAM_REDIS_URL"])
        try:  # more commands at once than redis-py's default pool holds (100)
            return await asyncio.gather(*(memory.redis.ping() for _ in range(300)))
        finally:
            await memory.close()

    assert all(asyncio.run(main()))


def test_a_request_whose_body_stalls_takes_no_slot_and_gets_408(monkeypatch):
    """A client sends a POST's headers and stalls its body (a slow or hostile client): a request
    whose handler reads the body (a retraction, /mcp) took an in-flight slot first and held it
    for good — aiohttp has no body timeout — so max_inflight such clients shed every later request
    with 503 (a query's body, read for its tenant before the cap, held its connection for good).
    Now every body is read whole before a slot is taken, at most BODY_READ_TIMEOUT_S (0.5 s
    here), then 408."""
    from workers.query import http

    monkeypatch.setattr(http, "BODY_READ_TIMEOUT_S", 0.5, raising=False)  # (none on the old code)

    async def requests(client):
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        writer.write(  # a retraction: its tenant is in the URL, its body read by the handler
            b"POST /v1/facts/f1/retract?tenant=t HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"reason": '
        )
        await writer.drain()
        await asyncio.sleep(0.1)  # the stalled request is in the server
        served = await post(client, b'{"query": "after the stalled one"}')
        stalled = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        return served, stalled

    (status, _, body), stalled = serve(Settings(redis_url=NO_REDIS, query_max_inflight=1), GatedEmbedder(), requests)
    assert status == 500 and "engine was reached" in body["error"], (status, body)  # admitted, not shed
    assert stalled.startswith(b"HTTP/1.1 408"), stalled[:200]
    assert b"did not arrive within 0 s" in stalled


def test_mcp_serves_post_only_so_idle_gets_hold_no_slot_and_head_gets_no_body():
    """GET /mcp (Accept */* as curl sends, or text/event-stream) opened the MCP SDK's standalone
    SSE stream, which in stateless mode never ends: each held an in-flight slot while its client
    stayed, so max_inflight idle GETs shed every /v1/* request with 503; and HEAD /mcp got a 405
    with a body after its headers, read as the next response of the connection. Now /mcp and
    /mcp/ serve POST only: anything else is a JSON 405 with Allow, answered at once."""

    async def raw(client, request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        writer.write(request)
        await writer.drain()
        received = b""
        try:  # until the server closes (Connection: close), or what came within the bound
            async with asyncio.timeout(5):
                while chunk := await reader.read(65536):
                    received += chunk
        except TimeoutError:
            received += b"<not closed within 5 s>"
        writer.close()
        return received

    async def requests(client):
        host = f"{client.server.host}:{client.server.port}"  # the MCP SDK refuses another Host (DNS rebinding)
        gets = [
            await raw(
                client, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n".encode()
            )
            for path in ("/mcp", "/mcp/")
            for accept in ("*/*", "text/event-stream")
        ]
        after = await post(client, b'{"query": "after the GETs"}')
        # HEAD, then a GET on the same connection: the second answer must follow the first's headers
        head = await raw(
            client,
            f"HEAD /mcp HTTP/1.1\r\nHost: {host}\r\n\r\nGET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(),
        )
        delete = await client.delete("/mcp")
        return gets, after, head, (delete.status, delete.headers.get("Allow"), await delete.json(content_type=None))

    gets, (status, _, body), head, delete = serve(
        Settings(redis_url=NO_REDIS, query_max_inflight=1), GatedEmbedder(), requests
    )
    for answer in gets:
        assert answer.startswith(b"HTTP/1.1 405"), answer[:200]
        assert b"\r\nAllow: POST\r\n" in answer and b'"error":"Method Not Allowed: GET /mcp' in answer, answer
    assert status == 500 and "engine was reached" in body["error"], (status, body)  # admitted, not shed
    first, _, rest = head.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 405") and rest.startswith(b"HTTP/1.1 "), head  # no body between them
    assert delete == (405, "POST", {"error": "Method Not Allowed: DELETE /mcp"})


def test_every_listing_refuses_a_limit_of_too_many_digits_or_given_twice_with_the_same_400():
    """?limit= of 4,301 digits reached int(), which refuses strings that long (ValueError: a
    500) on /v1/facts, /v1/recent-facts and /v1/entities/{id}/facts; and /v1/recent-facts and
    an entity's facts took the first of two limits where /v1/facts refused them. Both are
    refused before the store is read (no Redis here)."""
    listings = ("/v1/facts", "/v1/recent-facts", "/v1/entities/oskar_lind/facts")

    async def requests(client):
        answers = {}
        for path in listings:
            for query in ("9" * 4301, "0" * 4300 + "501", "1&limit=999999"):
                response = await client.get(f"{path}?limit={query}")
                answers[path, query[:8]] = (response.status, await response.json(content_type=None))
        return answers

    answers = serve(Settings(redis_url=NO_REDIS), GatedEmbedder(), requests)
    out_of_range = (400, {"error": "'limit' must be an integer from 1 to 500"})
    for path in listings:
        assert answers[path, "9" * 8] == answers[path, "0" * 8] == out_of_range, path
        assert answers[path, "1&limit="] == (400, {"error": "'limit' given 2 times: give it once"}), path
    from workers.query.drilldown import parse_limit

    assert parse_limit("0" * 4300 + "5") == 5 and parse_limit("500") == 500  # leading zeros read as ever


def test_a_retraction_reason_the_resolver_would_refuse_is_a_400_naming_reason(monkeypatch):
    """POST /v1/facts/{id}/retract checked only that `reason` was a string: "a\\u0000b" was
    queued (202) and the resolver dead-lettered the ConflictSet (its decode refuses a control
    character there), so the retraction never happened; "\\ud800" was a 500. Now the reason is
    checked by the record's own rule (publisher.check_reason) before the fact is looked up."""
    from topics import ConflictSet, decode, encode
    from workers.publisher import ClientPublisher, check_reason, retraction

    sent = []
    monkeypatch.setattr(ClientPublisher, "send", lambda self, messages, progress=None: sent.extend(messages))
    bodies = {
        b'{"reason": "a\\u0000b"}': "'reason': control character U+0000 at index 1",
        b'{"reason": "\\ud800"}': "'reason': lone surrogate U+D800 at index 0",
        b'{"reason": "bell \\u0007"}': "'reason': control character U+0007 at index 5",
        b'{"reason": "' + b"x" * 2001 + b'"}': "'reason' is 2,001 characters; at most 2,000",
    }

    async def requests(client):
        answers = []
        for body in bodies:
            response = await client.post("/v1/facts/f1/retract?tenant=t", data=body)
            answers.append((response.status, await response.json(content_type=None)))
        return answers

    answers = serve(Settings(redis_url=NO_REDIS), GatedEmbedder(), requests)
    for (status, answer), expected in zip(answers, bodies.values()):
        assert status == 400 and answer["error"].startswith(expected), (status, answer)
    assert sent == []
    # the rule is the record's: what it refuses the resolver's decode refuses, what it takes decodes
    from store.facts import Fact
    from topics.records import Triple

    fact = Fact.extracted("f1", Triple("A", "r", "B", "ENTITY", "ENTITY"), "a", "b", "s")
    assert check_reason("line one\n\tline two") == "line one\n\tline two"
    record = retraction("t", fact, "line one\n\tline two", "r1").record
    assert decode(ConflictSet, encode(record)).reason == "line one\n\tline two"
    with pytest.raises(ContractError, match="U\\+0000"):
        decode(ConflictSet, encode(retraction("t", fact, "a\x00b", "r1").record))


def test_unknown_fields_are_named_a_few_at_a_time_with_how_many_more():
    """A body of 300,000 unknown names (5 MB, under the body limit) took seconds of the event
    loop, a close match for each, and answered an 11 MB error; `params` names and an MCP tool's
    arguments went the same way. Now the first five are named (a hint each) with how many more."""
    import json

    from workers.query.request import unknown_fields

    body = json.dumps({"query": "x", **{f"top_k{i:05d}": 1 for i in range(20_000)}}).encode()

    async def requests(client):
        return await post(client, body)

    status, _, answer = serve(Settings(redis_url=NO_REDIS), GatedEmbedder(), requests)
    assert status == 400 and len(answer["error"]) < 1000, (status, len(answer["error"]))
    assert answer["error"].startswith(
        "unknown field(s) in the request body: 'top_k00000' (did you mean 'top_k'?), 'top_k00001' (did you mean 'top_k'?), "
    ) and answer["error"].endswith(" and 19,995 more; known: query, tenant, top_k, mode, answer, params, budget, as_of")
    with pytest.raises(ContractError) as few:
        unknown_fields({"asof": 1, "x" * 1_000_000: 2}, ("as_of",), "the arguments of search_memory")
    assert str(few.value) == (
        "unknown field(s) in the arguments of search_memory: 'asof' (did you mean 'as_of'?), "
        f"{'x' * 80!r}… (1,000,000 characters); known: as_of"
    )


def test_an_error_quotes_at_most_80_characters_of_the_input_it_names():
    """A 6 MB tenant, `params` name or `budget` name came back whole in the 400 body. Now an
    error quotes at most 80 characters of it (topics.contract.quoted) and says how long it was."""
    import json

    huge = "z" * 1_000_000
    bodies = {
        "tenant": {"query": "x", "tenant": huge},
        "params": {"query": "x", "params": {huge: 1}},
        "budget": {"query": "x", "mode": "reconstruct", "budget": {huge: 1}},
    }
    cut = f"{'z' * 80!r}… (1,000,000 characters)"

    async def requests(client):
        return {name: await post(client, json.dumps(body).encode()) for name, body in bodies.items()}

    answers = serve(Settings(redis_url=NO_REDIS), GatedEmbedder(), requests)
    for name, (status, _, answer) in answers.items():
        assert status == 400 and len(answer["error"]) < 1000 and cut in answer["error"], (name, answer["error"][:300])
    assert answers["tenant"][2]["error"].startswith(f"invalid tenant {cut}: 1-64 characters")
    assert answers["params"][2]["error"].startswith(f"unknown retrieval parameter(s) [{cut}]; known: [")
    assert answers["budget"][2]["error"].startswith(f"unknown budget field(s) [{cut}]; known: [")


def test_memstream_retract_refuses_a_reason_the_resolver_would_refuse_before_reaching_anything(monkeypatch, capsys):
    """`memstream retract --reason` with a NUL in it was queued and then dead-lettered by the
    resolver's decode, as POST /v1/facts/{id}/retract's was: refused now, exit 2, naming
    'reason', before Redis or Kafka is asked (neither answers here)."""
    from ops import cli

    monkeypatch.setenv("MEMSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("MEMSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert cli.main(["retract", "f-1", "--tenant", "acme", "--reason", "sold\x00it"]) == 2
    assert "'reason'" in capsys.readouterr().err


def test_a_listings_unknown_categories_and_statuses_are_quoted_a_few_at_a_time():
    """?category= and ?status= (and the MCP tool standing_facts) named every unknown name whole:
    100,000 of them, or one of a megabyte, came back in the error (a review). They are quoted as
    the query's unknown fields are (topics.contract.quoted_names)."""
    from topics import ContractError
    from workers.query import drilldown

    many = ",".join(f"bad{i}" for i in range(100_000))
    for check in (lambda text: drilldown.fact_filter(text, None), drilldown.status_filter):
        for given, said in [
            (many, "'bad0', 'bad1', 'bad2', 'bad3', 'bad4' and 99,995 more"),
            ("y" * 1_000_000, "… (1,000,000 characters)"),
        ]:
            with pytest.raises(ContractError) as raised:
                check(given)
            assert said in str(raised.value) and len(str(raised.value)) < 1000
