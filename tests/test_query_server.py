"""The query worker as a plain aiohttp server needing only Redis: `memstream worker
--role query` answers `POST /v1/query` and /healthz with no Kafka broker reachable and stops
cleanly on SIGTERM; in process, `workers.query.server.query_app` over real Redis answers the
drill-down routes, /healthz and /metrics. (Bad input, load shedding and error bodies:
tests/test_query_bounds.py; the API of an `all` worker over HTTP: tests/test_query_worker.py.)"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import numpy as np
import pytest

from ops.stack.services import free_port
from store import Memory
from store.facts import Fact
from tests.test_query_worker import call
from topics import Chunk
from topics.records import Triple
from workers.algorithms.normalize import entity_id, fact_id, schema_id
from workers.settings import Settings

DIMS = 384
PASSAGES = {
    "mill": (
        "Oskar Lind",
        "runs",
        "Tarn Mill",
        "Oskar Lind runs the Tarn Mill. The Tarn Mill grinds rye for Port Selka.",
    ),
    "bakery": (
        "Freya Holm",
        "owns",
        "Selka Bakery",
        "Freya Holm owns the Selka Bakery. The bakery buys rye from the Tarn Mill.",
    ),
    "ferry": ("Juno Vale", "sails", "Selka Ferry", "Captain Juno Vale sails the Selka Ferry from Port Selka to Ostra."),
}


def unit_vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIMS)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def write_memory(redis_url: str, tenant: str, seed: int = 7, passages: dict = PASSAGES) -> dict:
    """stage_memory on the Redis at `redis_url`."""
    memory = Memory.from_url(redis_url)
    try:
        return await stage_memory(memory, tenant, seed, passages)
    finally:
        await memory.close()


async def stage_memory(memory, tenant: str, seed: int = 7, passages: dict = PASSAGES) -> dict:
    """One passage per `passages` entry with its two entities and one active fact, written through
    the store (either: store.base.MemoryStore) as the extractor and detector write them, with
    random unit vectors. Returns {doc_id: {"passage": id, "fact": id, "vector": passage vector}}."""
    written = {}
    await memory.ensure_indexes(tenant)
    pipe = memory.pipeline(tenant)
    for (doc_id, (head, relation, tail, text)), vectors in zip(
        passages.items(), unit_vectors(4 * len(passages), seed).reshape(-1, 4, DIMS)
    ):
        chunk = Chunk(tenant, f"passage-{doc_id}", doc_id, 0, 1, text)
        ids = [entity_id(head), entity_id(tail)]
        memory.stage_passage(pipe, tenant, chunk, ids, vectors[0])
        for name, eid, vector in zip((head, tail), ids, vectors[1:3]):
            memory.stage_entity(pipe, tenant, eid, name, "ENTITY", vector, chunk.chunk_id)
        fid = fact_id(ids[0], relation, ids[1])
        fact = Fact.extracted(
            fid,
            Triple(head, relation, tail, "ENTITY", "ENTITY"),
            ids[0],
            ids[1],
            schema_id("ENTITY", relation, "ENTITY"),
        )
        memory.stage_new_fact(pipe, tenant, fact, vectors[3])
        memory.stage_fact_update(pipe, tenant, fid, {"status": "active"})
        memory.stage_fact_passage(pipe, tenant, fid, chunk.chunk_id)
        written[doc_id] = {"passage": chunk.chunk_id, "fact": fid, "vector": vectors[0]}
    await pipe.execute()
    return written


def test_the_query_role_serves_with_only_redis_reachable(make_workers, stack_env):
    tenant = f"nokafka-{uuid.uuid4().hex[:8]}"
    written = asyncio.run(write_memory(stack_env["MEMSTREAM_REDIS_URL"], tenant))
    workers = make_workers()
    nothing_listens = f"127.0.0.1:{free_port()}"
    # start() waits for /healthz; a worker that needed Kafka would give up after 5 s and exit
    proc = workers.start(role="query", MEMSTREAM_KAFKA_BOOTSTRAP=nothing_listens, MEMSTREAM_OUTAGE_DEADLINE="5")
    base = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}"

    assert call(base, "/healthz") == (200, {"status": "ok"})
    status, answer = call(base, "/v1/query", {"query": "Who runs the Tarn Mill?", "tenant": tenant, "top_k": 2})
    assert status == 200 and answer["tenant"] == tenant and answer["query"] == "Who runs the Tarn Mill?"
    by_id = {w["passage"]: doc_id for doc_id, w in written.items()}
    assert len(answer["passages"]) == 2
    for passage in answer["passages"]:
        assert passage["doc_id"] == by_id[passage["id"]] and passage["text"] == PASSAGES[passage["doc_id"]][3]
    status, passage = call(base, f"/v1/passages/{written['ferry']['passage']}?tenant={tenant}")
    assert status == 200 and passage["text"] == PASSAGES["ferry"][3]
    assert call(base, f"/v1/passages/nope?tenant={tenant}") == (
        404,
        {"error": f"no passage 'nope' in tenant '{tenant}'"},
    )

    proc.terminate()  # SIGTERM: a clean stop
    assert proc.wait(timeout=30) == 0
    assert "Traceback" not in workers.logs(), workers.logs()[-3000:]


class ExactEmbedder:
    """Every text embeds to one given vector: the passage stored with it is the nearest."""

    dims = DIMS

    def __init__(self, vector: np.ndarray):
        self.vector = vector

    async def embed(self, texts):
        return np.tile(self.vector, (len(texts), 1))


def test_the_query_app_answers_every_route_over_real_redis(stack_env):
    from aiohttp.test_utils import TestClient, TestServer
    from kafka import KafkaConsumer, TopicPartition

    from ops.stack.kafka_admin import ensure_topics
    from workers.query.server import query_app

    tenant = f"routes-{uuid.uuid4().hex[:8]}"
    written = asyncio.run(write_memory(stack_env["MEMSTREAM_REDIS_URL"], tenant))
    mill = written["mill"]
    settings = Settings(
        redis_url=stack_env["MEMSTREAM_REDIS_URL"],
        tenant=tenant,
        kafka_bootstrap=stack_env["MEMSTREAM_KAFKA_BOOTSTRAP"],
        topic_namespace=f"t{uuid.uuid4().hex[:10]}",
        partitions=1,
    )
    ensure_topics(settings)

    async def get(client, path):
        response = await client.get(path)
        return response.status, response.headers["Content-Type"], await response.read()

    async def main():
        async with TestClient(TestServer(query_app(settings, ExactEmbedder(mill["vector"])))) as client:
            query = await client.post("/v1/query", data=json.dumps({"query": "the mill", "mode": "dense", "top_k": 1}))
            paths = [
                f"/v1/facts/{mill['fact']}",
                f"/v1/facts/{mill['fact']}/evidence",
                f"/v1/passages/{mill['passage']}",
                "/v1/facts/nope",
                "/v1/facts/nope/evidence",
                "/v1/passages/nope?tenant=bad%20tenant",
                "/healthz",
                "/metrics",
            ]
            retracts = []
            for path, body in (
                (f"/v1/facts/{mill['fact']}/retract", b'{"reason": "the mill closed"}'),
                ("/v1/facts/nope/retract", b""),
                (f"/v1/facts/{mill['fact']}/retract", b'["closed"]'),
                (f"/v1/facts/{mill['fact']}/retract?tenant=", b""),
            ):
                response = await client.post(path, data=body)
                retracts.append((response.status, await response.json()))
            return (query.status, await query.json()), [await get(client, path) for path in paths], retracts

    (status, answer), (fact, evidence, passage, no_fact, no_evidence, bad_tenant, health, metrics), retracts = (
        asyncio.run(main())
    )
    queued, unknown, bad_body, blank_tenant = retracts
    assert (
        queued[0] == 202
        and queued[1]["fact_id"] == mill["fact"]
        and queued[1]["request"].startswith(f"retract:{mill['fact']}:")
    )
    assert unknown == (404, {"error": f"no fact 'nope' in tenant '{tenant}'"})
    assert bad_body == (400, {"error": 'the body, when given, is {"reason": "<text>"}'})
    assert blank_tenant[0] == 400 and "invalid tenant ''" in blank_tenant[1]["error"]
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    try:  # the retraction waits on conflict-sets for the resolver
        consumer.assign([TopicPartition(settings.topics.conflict_sets, 0)])
        consumer.seek_to_beginning()
        sent = [json.loads(r.value) for batch in consumer.poll(timeout_ms=5000).values() for r in batch]
    finally:
        consumer.close()
    assert [(m["kind"], m["fact_id"], m["reason"]) for m in sent] == [("retract", mill["fact"], "the mill closed")]
    assert (
        status == 200 and answer["mode"] == "dense" and answer["tenant"] == tenant
    )  # ?tenant= defaults to MEMSTREAM_TENANT
    assert [(p["id"], p["doc_id"]) for p in answer["passages"]] == [(mill["passage"], "mill")]
    for found in (fact, evidence, passage, health):
        assert found[:2] == (200, "application/json; charset=utf-8")
        assert (
            found[2] == json.dumps(json.loads(found[2]), separators=(",", ":")).encode()
        )  # compact, as the faust views sent
    assert json.loads(fact[2])["id"] == mill["fact"] and json.loads(fact[2])["status"] == "active"
    assert json.loads(fact[2])["passage_ids"] == [mill["passage"]]
    assert json.loads(evidence[2])["fact"] == json.loads(fact[2])
    assert [p["text"] for p in json.loads(evidence[2])["passages"]] == [PASSAGES["mill"][3]]
    assert json.loads(passage[2]) == {
        "id": mill["passage"],
        "text": PASSAGES["mill"][3],
        "doc_id": "mill",
        "seq": 0,
        "doc_version": 1,
        "metadata": {},
        "context": "",
        "retired": False,
        "doc_ids": ["mill"],
    }
    assert (no_fact[0], json.loads(no_fact[2])) == (404, {"error": f"no fact 'nope' in tenant '{tenant}'"})
    assert (no_evidence[0], json.loads(no_evidence[2])) == (404, {"error": f"no fact 'nope' in tenant '{tenant}'"})
    assert bad_tenant[0] == 400 and "invalid tenant" in json.loads(bad_tenant[2])["error"]
    assert json.loads(health[2]) == {"status": "ok"}
    assert metrics[0] == 200 and metrics[1].startswith("text/plain") and b"# HELP" in metrics[2]


def worker_beside(held, env: dict, roles: str):
    """`memstream worker --role ROLES` run to its end in `env` while `held` (a listening socket
    taking a port the worker is given) stays open; the socket closed after."""
    import subprocess
    import sys

    try:
        return subprocess.run(
            [sys.executable, "-m", "ops.cli", "worker", "--role", roles],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        held.close()


def test_an_indexing_worker_with_query_fails_at_once_on_a_taken_http_port(stack_env, tmp_path):
    """The port is bound before the worker joins its consumer group: a taken one is a clear
    error and an exit, not a crash after the agents started consuming (which would rebalance
    the group and redeliver what they held)."""
    import socket

    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    ns = f"t{uuid.uuid4().hex[:10]}"
    env = {
        **stack_env,
        "MEMSTREAM_HTTP_PORT": str(port),
        "MEMSTREAM_TOPIC_NAMESPACE": ns,
        "MEMSTREAM_APP_ID": ns,
        "MEMSTREAM_HOME": str(tmp_path),
        "MEMSTREAM_LOG_LEVEL": "info",
    }
    proc = worker_beside(held, env, "chunker,query")
    assert proc.returncode != 0
    assert f"the query API cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert (
        "[^Worker]" not in proc.stderr and "memstream.chunker" not in proc.stderr
    )  # faust never started: no agent, no group


@pytest.mark.parametrize("taken", ["api", "metrics"])
def test_a_query_worker_fails_in_one_line_on_a_taken_http_port(tmp_path, taken):
    """Before: `memstream worker --role query` (the query API alone, no faust) on a taken port
    ended in aiohttp's OSError traceback; it says so in the one line the indexing worker's
    query role does, exit 1, before Redis is opened (none runs here). A taken
    MEMSTREAM_METRICS_PORT ended in prometheus_client's traceback: one line too."""
    import os
    import socket

    held = socket.create_server(("127.0.0.1", 0))
    port = held.getsockname()[1]
    nowhere = f"127.0.0.1:{free_port()}"
    ports = {"api": port, "metrics": free_port()} if taken == "api" else {"api": free_port(), "metrics": port}
    env = {
        **os.environ,
        "MEMSTREAM_HTTP_HOST": "127.0.0.1",
        "MEMSTREAM_HTTP_PORT": str(ports["api"]),
        "MEMSTREAM_METRICS_PORT": str(ports["metrics"]),
        "MEMSTREAM_REDIS_URL": f"redis://{nowhere}/0",
        "MEMSTREAM_KAFKA_BOOTSTRAP": nowhere,
        "MEMSTREAM_HOME": str(tmp_path),
        "MEMSTREAM_LOG_LEVEL": "warning",  # not the INFO line saying no keys are configured
    }
    proc = worker_beside(held, env, "query")
    assert proc.returncode == 1
    what = "the query API" if taken == "api" else "/metrics"
    assert proc.stderr.startswith(f"memstream: {what} cannot listen on 127.0.0.1:{port}: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


# ---- standing facts: GET /v1/facts?category= (workers.query.drilldown.standing_facts) ---------------
STANDING_SCRIPT = {
    "We won't transit through Miami.": [("Ana", "rejected", "Miami", "REJECTED_OPTION")],
    "The total must not exceed 3000 USD.": [("Ana", "must not exceed", "3000 USD", "HARD_CONSTRAINT")],
    "Booking failed: ROOM_UNAVAILABLE.": [("Hotel Prado", "failed with", "ROOM_UNAVAILABLE", "TOOL_FAILURE")],
    "Ana likes tapas.": [("Ana", "likes", "tapas", "DECLARATIVE")],
}


async def standing_memory(redis_url: str | None):
    """STANDING_SCRIPT as turns s1:0..3 of one session, through the stages (τ = 1)."""
    from tests.inprocess import InProcess
    from tests.test_expiry import CategoryExtractor, PrefixEmbedder

    stages = InProcess(redis_url, CategoryExtractor(STANDING_SCRIPT), PrefixEmbedder(), tau=1)
    for n, text in enumerate(STANDING_SCRIPT):
        await stages.publish(f"s1:{n}", text, session_id="s1", turn=n, speaker="Ana")
    return stages


def _rows(found: dict) -> list[tuple]:
    return [(f["category"], f["head"], f["relation"], f["tail"], f["status"], f["doc_ids"]) for f in found["facts"]]


STANDING_ROWS = [
    ("TOOL_FAILURE", "Hotel Prado", "fail with", "ROOM_UNAVAILABLE", "active", ["s1:2"]),
    ("REJECTED_OPTION", "Ana", "reject", "Miami", "active", ["s1:0"]),
    ("HARD_CONSTRAINT", "Ana", "must not exceed", "3000 USD", "active", ["s1:1"]),
]


def test_both_stores_list_the_standing_facts_most_specific_first(stack_env):
    from workers.query import drilldown

    async def read(redis_url):
        stages = await standing_memory(redis_url)
        try:
            memory, tenant = stages.memory, stages.tenant
            default = (await drilldown.standing_facts(memory, tenant)).to_json()
            one = (await drilldown.standing_facts(memory, tenant, ("HARD_CONSTRAINT", "TOOL_FAILURE"), 1)).to_json()
            plain = (await drilldown.standing_facts(memory, tenant, ("DECLARATIVE",))).to_json()
            lapsed, later = default["facts"][0]["id"], default["facts"][1]["id"]
            pipe = memory.pipeline(tenant)
            memory.stage_fact_update(pipe, tenant, lapsed, {"expires_at": 1.0})  # its TTL over, not yet swept
            memory.stage_fact_update(pipe, tenant, later, {"expires_at": time.time() + 1e6})  # lapses, but not yet
            await pipe.execute()
            after = (await drilldown.standing_facts(memory, tenant)).to_json()
            return default, one, plain, after, (await drilldown.standing_facts(memory, "nobody-here")).to_json()
        finally:
            await stages.close()

    for redis_url in (None, stack_env["MEMSTREAM_REDIS_URL"]):
        default, one, plain, after, nobody = asyncio.run(read(redis_url))
        assert default["categories"] == ["HARD_CONSTRAINT", "REJECTED_OPTION", "TOOL_FAILURE"] and default["total"] == 3
        assert _rows(default) == STANDING_ROWS, redis_url
        assert (
            one["total"] == 2
            and len(one["facts"]) == 1
            and one["facts"][0]["category"] in ("HARD_CONSTRAINT", "TOOL_FAILURE")
        )
        assert [(f["tail"], f["doc_ids"]) for f in plain["facts"]] == [("tapas", ["s1:3"])]
        assert _rows(after) == STANDING_ROWS[1:] and after["total"] == 2  # listed and counted: what holds
        assert (nobody["total"], nobody["facts"]) == (0, [])


# more constraints than a page holds, said first; the failures and the refusal said after them
CROWDED_SCRIPT = {
    **{f"Budget rule {n}.": [(f"Trip {n}", "must not exceed", f"{n}000 USD", "HARD_CONSTRAINT")] for n in range(1, 7)},
    "Booking failed: ROOM_UNAVAILABLE.": [("Hotel Prado", "failed with", "ROOM_UNAVAILABLE", "TOOL_FAILURE")],
    "Payment failed: CARD_DECLINED.": [("Card", "failed with", "CARD_DECLINED", "TOOL_FAILURE")],
    "We won't transit through Miami.": [("Ana", "rejected", "Miami", "REJECTED_OPTION")],
}


def test_a_page_of_standing_facts_fills_with_the_most_specific_categories_first(redis_url):
    """More standing facts than `limit`: the page is filled category by category in
    CATEGORY_PRECEDENCE order (tool failures, then refusals, then constraints), oldest first
    within one — not whichever `limit` facts the index returns first."""
    from tests.inprocess import InProcess
    from tests.test_expiry import CategoryExtractor, PrefixEmbedder
    from workers.query import drilldown

    async def main():
        stages = InProcess(redis_url, CategoryExtractor(CROWDED_SCRIPT), PrefixEmbedder(), tau=1)
        try:
            for n, text in enumerate(CROWDED_SCRIPT):
                await stages.publish(f"s1:{n}", text, session_id="s1", turn=n, speaker="Ana")
            return [
                (await drilldown.standing_facts(stages.memory, stages.tenant, limit=limit)).to_json()
                for limit in (2, 4, 50)
            ]
        finally:
            await stages.close()

    two, four, every = asyncio.run(main())
    assert [(f["category"], f["tail"]) for f in four["facts"]] == [
        ("TOOL_FAILURE", "ROOM_UNAVAILABLE"),
        ("TOOL_FAILURE", "CARD_DECLINED"),
        ("REJECTED_OPTION", "Miami"),
        ("HARD_CONSTRAINT", "1000 USD"),
    ]
    assert two["facts"] == four["facts"][:2] and four["facts"] == every["facts"][:4]
    assert [f["tail"] for f in every["facts"][3:]] == [
        f"{n}000 USD" for n in range(1, 7)
    ]  # oldest first within a category
    assert two["total"] == four["total"] == every["total"] == 9


def test_get_v1_facts_lists_them_and_refuses_a_bad_category_or_limit(stack_env):
    import subprocess

    from aiohttp.test_utils import TestClient, TestServer

    from tests.conftest import MEMSTREAM, ROOT
    from workers.query.server import query_app

    async def main():
        stages = await standing_memory(stack_env["MEMSTREAM_REDIS_URL"])
        settings = Settings(redis_url=stack_env["MEMSTREAM_REDIS_URL"], tenant=stages.tenant)
        try:
            async with TestClient(TestServer(query_app(settings, stages.embedder))) as client:
                paths = [
                    "/v1/facts",
                    "/v1/facts?category=REJECTED_OPTION,TOOL_FAILURE&limit=1",
                    "/v1/facts?category=DECLARATIVE",
                    "/v1/facts?category=HARD_CONSTRAINT,NOPE",
                    "/v1/facts?limit=0",
                    "/v1/facts?limit=501",
                    "/v1/facts?limit=ten",
                    "/v1/facts?tenant=bad%20tenant",
                    "/v1/facts?category=REJECTED_OPTION&category=TOOL_FAILURE,DECLARATIVE",
                    "/v1/facts?category=TOOL_FAILURE&category=NOPE",
                    "/v1/facts?limit=1&limit=2",
                    "/v1/facts?tenant=nobody-indexed-here",
                ]
                # not plain ASCII digits: "²".isdigit() is True but int("²") raises
                odd_limits = ["%C2%B2", "%205", "-1", "1e3", "5%20", "%EF%BC%95"]
                answers = [(r.status, await r.json()) for r in [await client.get(p) for p in paths]]
                odd = [
                    (r.status, await r.json()) for r in [await client.get(f"/v1/facts?limit={n}") for n in odd_limits]
                ]
                empty = await client.get("/v1/facts?limit=")
                return stages.tenant, answers, odd, (empty.status, await empty.json())
        finally:
            await stages.close()

    tenant, answers, odd, empty = asyncio.run(main())
    every, limited, plain, unknown, zero, over, words, bad_tenant, repeated, repeated_unknown, two_limits, nobody = (
        answers
    )
    # a tenant nothing was indexed for (misspelt, or none given: the default) is said, as the query route says it
    assert (
        nobody[0] == 200
        and nobody[1]["facts"] == []
        and nobody[1]["warning"]
        == (
            "tenant 'nobody-indexed-here' holds no memory: nothing was ever indexed for it (`memstream tenants` lists those that hold some)"
        )
    )
    assert every[1]["warning"] is None
    assert empty[0] == 200 and empty[1] == every[1]  # an empty limit: the default
    assert repeated[0] == 200 and [f["category"] for f in repeated[1]["facts"]] == [
        "TOOL_FAILURE",
        "REJECTED_OPTION",
        "DECLARATIVE",
    ]
    assert repeated[1]["categories"] == ["REJECTED_OPTION", "TOOL_FAILURE", "DECLARATIVE"] and repeated[1]["total"] == 3
    assert repeated_unknown[0] == 400 and "'NOPE'" in repeated_unknown[1]["error"]
    assert two_limits == (400, {"error": "'limit' given 2 times: give it once"})
    assert every[0] == 200 and every[1]["tenant"] == tenant and _rows(every[1]) == STANDING_ROWS
    assert limited[0] == 200 and limited[1]["total"] == 2 and len(limited[1]["facts"]) == 1
    assert plain[0] == 200 and [f["tail"] for f in plain[1]["facts"]] == ["tapas"]
    assert unknown == (
        400,
        {"error": "unknown fact category 'NOPE': expected DECLARATIVE, HARD_CONSTRAINT, REJECTED_OPTION, TOOL_FAILURE"},
    )
    for refused in (zero, over, words, *odd):
        assert refused == (400, {"error": "'limit' must be an integer from 1 to 500"})
    assert bad_tenant[0] == 400 and "invalid tenant" in bad_tenant[1]["error"]

    # `memstream facts`: the same answer from the command line
    def memstream(*args):
        return subprocess.run(
            MEMSTREAM + ["facts", *args], env=stack_env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    listed = memstream("--tenant", tenant)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == every[1]
    refused = memstream("--tenant", tenant, "--category", "NOPE")
    assert refused.returncode == 2 and refused.stderr.strip() == f"memstream: {unknown[1]['error']}"
    superscript = memstream("--tenant", tenant, "--limit", "²")
    assert (
        superscript.returncode == 2
        and superscript.stderr.strip() == "memstream: 'limit' must be an integer from 1 to 500"
    )


def test_a_started_query_api_has_frozen_what_its_start_made(stack_env):
    """Once the query API has started, the objects alive at its start (modules, the model, the
    engine) are out of the cyclic collector's generations (gc.freeze): a full collection no
    longer walks them — 94 ms of every query in flight on the 2-core machine with the server's
    imports, 294 ms with the local model loaded. A container made before the start is no longer
    among the objects the collector tracks; one made after it is."""
    import gc

    from aiohttp.test_utils import TestClient, TestServer

    from tests.inprocess import HashEmbedder
    from workers.query.server import query_app

    made_before = [object()]

    async def main():
        settings = Settings(redis_url=stack_env["MEMSTREAM_REDIS_URL"])
        async with TestClient(TestServer(query_app(settings, HashEmbedder()))) as client:
            made_after = [object()]
            tracked = {id(o) for o in gc.get_objects()}
            health = (await client.get("/healthz")).status
            return gc.get_freeze_count(), id(made_before) in tracked, id(made_after) in tracked, health

    try:
        frozen, before_tracked, after_tracked, health = asyncio.run(main())
    finally:
        gc.unfreeze()  # the suite's process: its objects back in the generations
    assert health == 200
    assert frozen > 10_000 and not before_tracked and after_tracked


def test_the_query_api_listens_on_every_address_its_host_names_ipv6_too():
    """MEMSTREAM_HTTP_HOST=::1 (an allowed loopback) ended in "cannot listen on ::1": the API's
    socket was bound with socket.create_server, IPv4 only (a review); and "" bound 0.0.0.0 alone.
    listen() binds each address the host names, on one port, as aiohttp's own site did."""
    import socket

    from workers.query.server import listen

    try:
        probe = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    probe.close()
    for host, families in [
        ("::1", {socket.AF_INET6}),
        ("127.0.0.1", {socket.AF_INET}),
        ("", {socket.AF_INET, socket.AF_INET6}),
    ]:
        socks = listen(Settings(http_host=host, http_port=0))
        try:
            assert {sock.family for sock in socks} == families, host
            assert len({sock.getsockname()[1] for sock in socks}) == 1, host  # one port on every address
            for sock in socks:
                loopback = "::1" if sock.family == socket.AF_INET6 else "127.0.0.1"
                socket.create_connection((loopback, sock.getsockname()[1]), timeout=5).close()
        finally:
            for sock in socks:
                sock.close()
