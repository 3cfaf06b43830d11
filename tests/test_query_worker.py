"""The query worker over HTTP on real Kafka + Redis: PPR answers with their seeds, new documents
seen without a restart through graph deltas (no second load, no rebuild), two replicas agreeing,
the drill-down endpoints, answer generation through an OpenAI-compatible server, and errors."""

import json
import urllib.error
import urllib.request
import uuid

from ops.fake_llm import FakeOpenAI
from ops.stack import free_port
from tests.conftest import write_docs

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


def test_ppr_sees_new_documents_through_deltas_and_replicas_agree(make_workers, tmp_path):
    workers = make_workers(extractor="rules", tau=1)
    workers.start()
    base, tenant = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}", f"q-{uuid.uuid4().hex[:8]}"
    workers.cli.run("publish", *write_docs(tmp_path / "first", FIRST), "--tenant", tenant, "--wait", "--timeout", "120")

    status, first = call(base, "/v1/query", {"query": "Who runs the mill that grinds rye?", "tenant": tenant, "top_k": 2})
    assert status == 200 and first["mode"] == "ppr" and "fallback" not in first
    assert first["passages"][0]["doc_id"] == "mill"
    assert first["seeds"]["facts"] and first["seeds"]["entities"] and first["facts"]
    assert {"embed", "retrieve", "seed", "ppr", "fetch", "total"} <= first["timings_ms"].keys()
    assert first["graph"]["loads"] == 1 and first["graph"]["rebuilds"] == 1

    workers.cli.run("publish", *write_docs(tmp_path / "later", LATER), "--tenant", tenant, "--wait", "--timeout", "120")
    status, later = call(base, "/v1/query", {"query": "Who sails the ferry that carries rye?", "tenant": tenant, "top_k": 2})
    assert status == 200 and later["passages"][0]["doc_id"] == "ferry"
    # the new document arrived as change-stream deltas: still one load, one build of the matrix
    assert later["graph"]["loads"] == 1 and later["graph"]["rebuilds"] == 1
    assert later["graph"]["changes_applied"] > first["graph"]["changes_applied"]
    assert later["graph"]["nodes"] > first["graph"]["nodes"] and later["graph_version"] > first["graph_version"]

    # a second query replica, started now, loads the same graph and answers the same
    port = str(free_port())
    workers.start(role="query", MEMSTREAM_HTTP_PORT=port)
    _, replica = call(f"http://127.0.0.1:{port}", "/v1/query", {"query": "Who sails the ferry that carries rye?", "tenant": tenant, "top_k": 2})
    assert [(p["id"], p["score"]) for p in replica["passages"]] == [(p["id"], p["score"]) for p in later["passages"]]
    assert replica["graph"]["edges"] == later["graph"]["edges"]

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


def test_query_errors_are_json_and_specific(make_workers):
    workers = make_workers(extractor="rules")
    workers.start(role="query")
    base = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}"
    assert "'mode'" in call(base, "/v1/query", {"query": "x", "mode": "magic"})[1]["error"]
    assert "unknown retrieval parameter" in call(base, "/v1/query", {"query": "x", "params": {"alpah": 1}})[1]["error"]
    assert "'answer'" in call(base, "/v1/query", {"query": "x", "answer": "yes"})[1]["error"]
    assert "needs an LLM" in call(base, "/v1/query", {"query": "x", "answer": True})[1]["error"]
    status, body = call(base, "/v1/query", {"query": "anything", "tenant": f"empty-{uuid.uuid4().hex[:6]}"})
    assert status == 200 and body["passages"] == [] and body["fallback"] == "dense"


def test_answer_generation_cites_retrieved_passages(make_workers, tmp_path):
    def model(body):
        ids = [line[1:].split("]", 1)[0] for line in body["messages"][1]["content"].splitlines() if line.startswith("[")]
        return json.dumps({"answer": "Oskar Lind", "citations": ids[:1]})

    with FakeOpenAI(default=model) as llm:
        workers = make_workers(extractor="rules", tau=1, llm_base_url=llm.base_url, llm_model="fake-answer")
        workers.start()
        base, tenant = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}", f"a-{uuid.uuid4().hex[:8]}"
        workers.cli.run("publish", *write_docs(tmp_path / "docs", FIRST), "--tenant", tenant, "--wait", "--timeout", "120")
        status, body = call(base, "/v1/query", {"query": "Who runs the Tarn Mill?", "tenant": tenant, "answer": True, "top_k": 2})
    assert status == 200 and body["answer"]["text"] == "Oskar Lind"
    assert body["answer"]["citations"] == [body["passages"][0]["id"]]
