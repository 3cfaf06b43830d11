"""The query worker over HTTP on real Kafka + Redis: PPR answers with their seeds, new documents
seen without a restart through graph deltas (no second load, no rebuild), two replicas agreeing,
the drill-down endpoints, answer generation through an OpenAI-compatible server, and errors.

Two worker processes serve the module (each loads torch and the embedding model), each test on
its own tenant: an all-roles worker answering with a fake OpenAI-compatible server, and a
query-only replica without an LLM."""

import json
import urllib.error
import urllib.request
import uuid

import pytest

from ops.fake_llm import FakeOpenAI
from ops.stack.services import free_port
from tests.conftest import running_workers, write_docs
from workers.algorithms.chunking import chunk_id_of

FIRST = {
    "mill": "Oskar Lind runs the Tarn Mill. The Tarn Mill grinds rye for Port Selka.",
    "bakery": "Freya Holm owns the Selka Bakery. The Selka Bakery buys rye from the Tarn Mill.",
}
LATER = {
    "ferry": "Captain Juno Vale sails the Selka Ferry. The Selka Ferry carries rye from Port Selka to Ostra.",
}


def call(base: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# The fake model's answer, by input: given when the request carries the mill's passage (the
# worker checks that the citation names a passage it gave).
ANSWER = {FIRST["mill"]: json.dumps({"answer": "Oskar Lind", "citations": [chunk_id_of(FIRST["mill"])]})}


@pytest.fixture(scope="module")
def workers(stack_env, tmp_path_factory):
    """An all-roles worker (rules extractor, τ = 1) whose answers come from a fake
    OpenAI-compatible server, for every test of the module."""
    with FakeOpenAI(answers=ANSWER) as llm:
        with running_workers(
            stack_env,
            tmp_path_factory.mktemp("query-workers"),
            extractor="rules",
            tau=1,
            llm_base_url=llm.base_url,
            llm_model="fake-answer",
        ) as workers:
            yield workers


@pytest.fixture(scope="module")
def replica(workers) -> str:
    """A second query worker over the same Redis, without an LLM; its base URL. A replica loads
    a tenant's graph on that tenant's first query, so one started before that query is as new
    to the tenant as one started just then."""
    port = str(free_port())
    workers.start(role="query", MEMSTREAM_HTTP_PORT=port, MEMSTREAM_LLM_BASE_URL="", MEMSTREAM_LLM_MODEL="")
    return f"http://127.0.0.1:{port}"


def test_ppr_sees_new_documents_through_deltas_and_replicas_agree(workers, replica, tmp_path):
    base, tenant = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}", f"q-{uuid.uuid4().hex[:8]}"
    workers.cli.run("publish", *write_docs(tmp_path / "first", FIRST), "--tenant", tenant, "--wait", "--timeout", "120")

    status, first = call(
        base, "/v1/query", {"query": "Who runs the mill that grinds rye?", "tenant": tenant, "top_k": 2}
    )
    assert status == 200 and first["mode"] == "ppr" and "fallback" not in first
    assert first["passages"][0]["doc_id"] == "mill"
    assert first["seeds"]["facts"] and first["seeds"]["entities"] and first["facts"]
    assert {"embed", "retrieve", "seed", "ppr", "fetch", "total"} <= first["timings_ms"].keys()
    assert first["graph"]["loads"] == 1 and first["graph"]["rebuilds"] == 1

    workers.cli.run("publish", *write_docs(tmp_path / "later", LATER), "--tenant", tenant, "--wait", "--timeout", "120")
    status, later = call(
        base, "/v1/query", {"query": "Who sails the ferry that carries rye?", "tenant": tenant, "top_k": 2}
    )
    assert status == 200 and later["passages"][0]["doc_id"] == "ferry"
    # the new document arrived as change-stream deltas: still one load, one build of the matrix
    assert later["graph"]["loads"] == 1 and later["graph"]["rebuilds"] == 1
    assert later["graph"]["changes_applied"] > first["graph"]["changes_applied"]
    assert later["graph"]["nodes"] > first["graph"]["nodes"] and later["graph_version"] > first["graph_version"]

    # a second query replica, new to this tenant, loads the same graph and answers the same
    _, replicated = call(
        replica, "/v1/query", {"query": "Who sails the ferry that carries rye?", "tenant": tenant, "top_k": 2}
    )
    assert replicated["graph"]["loads"] == 1
    assert [(p["id"], p["score"]) for p in replicated["passages"]] == [(p["id"], p["score"]) for p in later["passages"]]
    assert replicated["graph"]["edges"] == later["graph"]["edges"]

    # dense mode keeps the skeleton's shape
    status, dense = call(base, "/v1/query", {"query": "Who sails the ferry?", "tenant": tenant, "mode": "dense"})
    assert status == 200 and dense["mode"] == "dense" and dense["passages"][0]["doc_id"] == "ferry"

    # drill-down: a fact, the raw passages behind it, a passage
    fact = later["facts"][0]
    status, got = call(base, f"/v1/facts/{fact['id']}?tenant={tenant}")
    assert status == 200 and got["head"] == fact["head"] and got["passage_ids"]
    status, evidence = call(base, f"/v1/facts/{fact['id']}/evidence?tenant={tenant}")
    assert status == 200 and evidence["passages"] and all(fact["head"] in p["text"] for p in evidence["passages"])
    status, passage = call(base, f"/v1/passages/{later['passages'][0]['id']}?tenant={tenant}")
    assert status == 200 and passage["doc_id"] == "ferry"
    assert call(base, f"/v1/facts/nope?tenant={tenant}") == (404, {"error": f"no fact 'nope' in tenant '{tenant}'"})
    assert call(base, "/v1/passages/x?tenant=bad%20tenant")[0] == 400


def test_query_errors_are_json_and_specific(replica):
    base = replica
    assert "'mode'" in call(base, "/v1/query", {"query": "x", "mode": "magic"})[1]["error"]
    assert "unknown retrieval parameter" in call(base, "/v1/query", {"query": "x", "params": {"alpah": 1}})[1]["error"]
    # a misspelt field is refused, not ignored (it answered from today, or with the default top_k)
    status, refused = call(base, "/v1/query", {"query": "x", "asof": "2024-04-01T00:00:00Z", "topk": 3})
    assert status == 400 and refused["error"].startswith(
        "unknown field(s) in the request body: 'asof' (did you mean 'as_of'?), 'topk' (did you mean 'top_k'?); known: query,"
    )
    assert "'answer'" in call(base, "/v1/query", {"query": "x", "answer": "yes"})[1]["error"]
    assert "needs an LLM" in call(base, "/v1/query", {"query": "x", "answer": True})[1]["error"]
    status, body = call(base, "/v1/query", {"query": "anything", "tenant": f"empty-{uuid.uuid4().hex[:6]}"})
    assert status == 200 and body["passages"] == [] and body["fallback"] == "first_stage"


def test_answer_generation_cites_retrieved_passages(workers, tmp_path):
    base, tenant = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}", f"a-{uuid.uuid4().hex[:8]}"
    workers.cli.run("publish", *write_docs(tmp_path / "docs", FIRST), "--tenant", tenant, "--wait", "--timeout", "120")
    status, body = call(
        base, "/v1/query", {"query": "Who runs the Tarn Mill?", "tenant": tenant, "answer": True, "top_k": 2}
    )
    assert status == 200 and body["answer"]["text"] == "Oskar Lind"
    assert body["answer"]["citations"] == [body["passages"][0]["id"]]
