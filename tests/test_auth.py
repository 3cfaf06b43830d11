"""API keys and tenants on the query worker over HTTP: keys configured
hashed in MEMSTREAM_API_KEYS(_FILE) (workers.query.auth), enforced before any handler runs by
the middleware workers.query.http.authorization — 401 JSON without a known key, 403 JSON for a
tenant or scope the key lacks, on every endpoint but /healthz, MCP included; a worker without
keys refuses to listen beyond loopback.

The HTTP tests run workers.query.server.query_app over the dev stack's Redis, with two tenants
written from the SAME content (tests/test_query_server.write_memory), so B's fact and passage
ids are exactly the ids a key for A can compute from B's content."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import uuid

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ops.fake_llm import FakeOpenAI
from tests.conftest import MEMSTREAM, ROOT
from tests.test_query_server import ExactEmbedder, write_memory
from workers.query import auth, http
from workers.settings import Settings


def entry(name: str, token: str, tenants: list[str], scopes: list[str]) -> dict:
    return {"name": name, "key_sha256": auth.digest_of(token).hex(), "tenants": tenants, "scopes": scopes}


# ---- the key configuration (pure) ---------------------------------------------------------------


def test_keys_are_found_by_their_hash_and_nothing_close_to_them_is():
    token, made = auth.new_key(None, ["acme"], ["read", "answer"])
    assert token.startswith(auth.KEY_PREFIX) and token not in json.dumps(made)  # only the hash is configured
    ring = auth.parse_keys(json.dumps([made, entry("other", "ms_other", ["*"], ["admin"])]), "test")
    key = ring.find(token)
    assert key is not None and key.name == made["name"] == f"key-{made['key_sha256'][:8]}"
    assert key.may_use("acme") and not key.may_use("acme2") and key.scopes == {"read", "answer"}
    assert ring.find("ms_other").may_use("anything-at-all")
    same_length = token[:-1] + ("A" if token[-1] != "A" else "B")
    for wrong in (
        same_length,
        token[:-1],
        token + "x",
        "",
        token.upper(),
        made["key_sha256"],
    ):  # the stored hash is no key either
        assert ring.find(wrong) is None, wrong
    assert auth.new_key(None, ["acme"], ["read"])[0] != token


@pytest.mark.parametrize(
    "text, message",
    [
        ("{nope", "not valid JSON"),
        ("[]", "expected a non-empty JSON list"),
        ('{"name": "x"}', "expected a non-empty JSON list"),
        ('["x"]', "key 0: expected an object, got str"),
        ('[{"name": "a", "key": "ms_secret", "tenants": ["t"], "scopes": ["read"]}]', "never the key"),
        ('[{"name": "a", "tenants": ["t"], "scopes": ["read"]}]', "missing field(s) 'key_sha256'"),
        ('[{"name": "a", "key_sha256": "abc", "tenants": ["t"], "scopes": ["read"]}]', "64 hex digits"),
        (
            '[{"name": "a", "key_sha256": "' + "0" * 64 + '", "tenants": [], "scopes": ["read"]}]',
            "non-empty list of tenant names",
        ),
        ('[{"name": "a", "key_sha256": "' + "0" * 64 + '", "tenants": ["a b"], "scopes": ["read"]}]', "invalid tenant"),
        (
            '[{"name": "a", "key_sha256": "' + "0" * 64 + '", "tenants": ["t"], "scopes": ["read", "root"]}]',
            "unknown scope(s) 'root'",
        ),
        (
            '[{"name": "a", "key_sha256": "' + "0" * 64 + '", "tenants": ["t"], "scopes": ["read"]},'
            ' {"name": "a", "key_sha256": "' + "1" * 64 + '", "tenants": ["t"], "scopes": ["read"]}]',
            "same name",
        ),
        (
            '[{"name": "a", "key_sha256": "' + "0" * 64 + '", "tenants": ["t"], "scopes": ["read"]},'
            ' {"name": "b", "key_sha256": "' + "0" * 64 + '", "tenants": ["t"], "scopes": ["read"]}]',
            "same key_sha256",
        ),
    ],
)
def test_a_malformed_key_list_is_refused_with_what_is_wrong(text, message):
    with pytest.raises(auth.KeyConfigError) as refused:
        auth.parse_keys(text, "MEMSTREAM_API_KEYS")
    assert message in str(refused.value) and str(refused.value).startswith("MEMSTREAM_API_KEYS")


def test_keys_come_from_one_place_and_an_unreadable_file_is_named(tmp_path):
    good = json.dumps([entry("a", "ms_a", ["t"], ["read"])])
    path = tmp_path / "keys.json"
    path.write_text(good)
    assert auth.load_keys("", "") is None
    assert len(auth.load_keys(str(path), "")) == 1 and auth.load_keys("", good).source == "MEMSTREAM_API_KEYS"
    with pytest.raises(auth.KeyConfigError, match="configure the keys in one place"):
        auth.load_keys(str(path), good)
    with pytest.raises(
        auth.KeyConfigError, match=f"MEMSTREAM_API_KEYS_FILE={tmp_path / 'missing.json'}: cannot be read"
    ):
        auth.load_keys(str(tmp_path / "missing.json"), "")


def test_without_keys_only_loopback_may_be_bound():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert "loopback only" in auth.check_listener(host, 8765, None)
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "memstream.example"):
        with pytest.raises(auth.KeyConfigError, match="is not a loopback address and no API keys are configured"):
            auth.check_listener(host, 8765, None)
    keys = auth.parse_keys(json.dumps([entry("a", "ms_a", ["t"], ["read"])]), "MEMSTREAM_API_KEYS")
    assert "1 API key(s) from MEMSTREAM_API_KEYS" in auth.check_listener("0.0.0.0", 8765, keys)


def test_a_named_route_without_a_declared_need_is_refused_not_served():
    async def declared(request):
        return http.json_response({"ok": True})

    async def forgotten(request):
        return http.json_response({"leaked": True})

    async def main():
        app = web.Application(middlewares=http.middlewares(4, None, {"declared": http.OPEN}))
        app.router.add_get("/declared", declared, name="declared")
        app.router.add_get("/forgotten", forgotten, name="forgotten")
        async with TestClient(TestServer(app)) as client:
            return [(r.status, await r.json()) for r in [await client.get("/declared"), await client.get("/forgotten")]]

    served, refused = asyncio.run(main())
    assert served == (200, {"ok": True})
    assert refused[0] == 500 and "declares no Need" in refused[1]["error"]


# ---- the query worker's HTTP API over Redis ------------------------------------------------------

KEY_A, KEY_A_ANSWER, KEY_B, KEY_ADMIN = "ms_key-for-a-only", "ms_key-for-a-and-answers", "ms_key-for-b", "ms_admin-key"


@pytest.fixture(scope="module")
def api(stack_env):
    """(settings, {tenant: written}, tenant A, tenant B): A and B hold the same content; the
    worker's default tenant (and its MCP tenant) is B."""
    a, b = (f"auth-{name}-{uuid.uuid4().hex[:8]}" for name in ("a", "b"))
    written = {tenant: asyncio.run(write_memory(stack_env["MEMSTREAM_REDIS_URL"], tenant)) for tenant in (a, b)}
    assert written[a]["mill"]["fact"] == written[b]["mill"]["fact"]  # B's ids are computable from B's content
    keys = [
        entry("a-reader", KEY_A, [a], ["read"]),
        entry("a-answers", KEY_A_ANSWER, [a], ["read", "answer"]),
        entry("b-reader", KEY_B, [b], ["read"]),
        entry("metrics", KEY_ADMIN, ["*"], ["admin"]),
    ]
    settings = Settings(
        redis_url=stack_env["MEMSTREAM_REDIS_URL"],
        tenant=b,
        api_keys=json.dumps(keys),
        llm_model=f"auth-test-{uuid.uuid4().hex}",
    )  # a fresh model name: no cached answer
    return settings, written, a, b


def endpoints(tenant: str, ids: dict) -> list[tuple[str, str, dict | None]]:
    """(method, path, JSON body) of every endpoint, addressed to `tenant` and its ids."""
    mill = ids["mill"]
    q = f"?tenant={tenant}"
    return [
        ("POST", "/v1/query", {"query": "Who runs the Tarn Mill?", "tenant": tenant, "mode": "dense", "top_k": 1}),
        ("GET", f"/v1/facts{q}", None),
        ("GET", f"/v1/facts/{mill['fact']}{q}", None),
        ("GET", f"/v1/facts/{mill['fact']}/evidence{q}", None),
        ("GET", f"/v1/passages/{mill['passage']}{q}", None),
        ("GET", f"/v1/overview{q}", None),
        ("GET", f"/v1/entities/oskar_lind/facts{q}", None),
        ("GET", f"/v1/recent-facts{q}&status=active", None),
    ]


async def serve_app(settings: Settings, written: dict, llm_url: str = ""):
    from workers.query.server import query_app

    vector = next(iter(written.values()))["mill"]["vector"]
    if llm_url:
        settings = dataclasses.replace(settings, llm_base_url=llm_url)
    client = TestClient(TestServer(query_app(settings, ExactEmbedder(vector))))
    await client.start_server()
    return client


async def fetch(
    client: TestClient,
    method: str,
    path: str,
    body: dict | None,
    token: str | None = None,
    authorization: str | None = None,
) -> tuple[int, dict]:
    headers = {"Authorization": authorization or f"Bearer {token}"} if (token or authorization) else {}
    data = None if body is None else json.dumps(body)
    response = await client.request(method, path, data=data, headers=headers)
    return response.status, (
        await response.json() if response.content_type == "application/json" else {"text": await response.text()}
    )


def test_no_key_or_an_unknown_key_is_401_on_every_endpoint_but_healthz(api):
    settings, written, a, b = api
    key_a = KEY_A
    wrong_same_length = key_a[:-1] + ("x" if key_a[-1] != "x" else "y")

    async def main():
        client = await serve_app(settings, written)
        try:
            paths = [
                *endpoints(a, written[a]),
                ("GET", "/metrics", None),
                ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}),
                ("GET", "/v1/nowhere", None),
            ]
            answers = {}
            for method, path, body in paths:
                answers[path] = [
                    await fetch(client, method, path, body),
                    await fetch(client, method, path, body, wrong_same_length),
                    await fetch(client, method, path, body, key_a + "-longer"),
                    await fetch(client, method, path, body, authorization=f"Basic {key_a}"),
                ]
            health = await fetch(client, "GET", "/healthz", None)
            known_unrouted = await fetch(client, "GET", "/v1/nowhere", None, KEY_A)
            return answers, health, known_unrouted
        finally:
            await client.close()

    answers, health, known_unrouted = asyncio.run(main())
    assert len(answers) == 11
    for path, (none, same_length, longer, basic) in answers.items():
        assert none == (
            401,
            {
                "error": f"{'POST' if path in ('/v1/query', '/mcp') else 'GET'} {path.split('?')[0]} needs an API key: "
                "send 'Authorization: Bearer <key>'"
            },
        ), path
        assert same_length == longer == (401, {"error": "unknown API key"}), path
        assert basic[0] == 401, path
    assert health == (200, {"status": "ok"})
    assert known_unrouted[0] == 404  # a known key learns that a path does not exist, nothing else


def test_a_key_for_tenant_a_is_refused_on_b_before_any_lookup(api):
    settings, written, a, b = api

    async def main():
        client = await serve_app(settings, written)
        try:
            own = [await fetch(client, m, p, body, KEY_A) for m, p, body in endpoints(a, written[a])]
            other = [await fetch(client, m, p, body, KEY_A) for m, p, body in endpoints(b, written[b])]
            # B's ids that do not exist answer exactly as B's ids that do: a refusal, no 404
            missing = [
                await fetch(client, "GET", f"/v1/{what}/nope?tenant={b}", None, KEY_A) for what in ("facts", "passages")
            ]
            default_tenant = await fetch(
                client, "GET", f"/v1/passages/{written[b]['mill']['passage']}", None, KEY_A
            )  # no ?tenant=: B
            body_default = await fetch(client, "POST", "/v1/query", {"query": "Who runs the Tarn Mill?"}, KEY_A)
            b_reads_b = [await fetch(client, m, p, body, KEY_B) for m, p, body in endpoints(b, written[b])]
            metrics = [await fetch(client, "GET", "/metrics", None, token) for token in (KEY_A, KEY_ADMIN)]
            admin_reads = await fetch(
                client, "GET", f"/v1/facts?tenant={a}", None, KEY_ADMIN
            )  # '*' tenants, no read scope
            bad_tenant = await fetch(client, "GET", "/v1/facts?tenant=a%20b", None, KEY_A)
            return own, other, missing, default_tenant, body_default, b_reads_b, metrics, admin_reads, bad_tenant
        finally:
            await client.close()

    own, other, missing, default_tenant, body_default, b_reads_b, metrics, admin_reads, bad_tenant = asyncio.run(main())
    assert [status for status, _ in own] == [200] * 8 and own[4][1]["doc_id"] == "mill"
    for status, body in [*other, *missing, default_tenant, body_default]:
        assert (status, body) == (403, {"error": f"API key 'a-reader' may not use tenant '{b}'"})
    assert [status for status, _ in b_reads_b] == [200] * 8 and b_reads_b[0][1]["tenant"] == b
    assert metrics[0] == (
        403,
        {"error": "API key 'a-reader' lacks scope 'admin': needed to read /metrics on the API's address"},
    )
    assert metrics[1][0] == 200 and "# HELP" in metrics[1][1]["text"]
    assert admin_reads[0] == 403 and "lacks scope 'read'" in admin_reads[1]["error"]
    assert bad_tenant[0] == 400 and "invalid tenant" in bad_tenant[1]["error"]  # checked by a known key, as before


def test_a_key_without_the_answer_scope_cannot_trigger_generation(api):
    settings, written, a, b = api
    answer = json.dumps({"answer": "Oskar Lind", "citations": []})
    question = {"query": "Who runs the Tarn Mill?", "tenant": a, "mode": "dense", "top_k": 1, "answer": True}

    async def main(llm: FakeOpenAI):
        client = await serve_app(settings, written, llm.base_url)
        try:
            refused = await fetch(client, "POST", "/v1/query", question, KEY_A)
            calls_after_refusal = llm.calls
            answered = await fetch(client, "POST", "/v1/query", question, KEY_A_ANSWER)
            return refused, calls_after_refusal, answered
        finally:
            await client.close()

    with FakeOpenAI(schema_answers={"answer": answer}) as llm:
        refused, calls_after_refusal, answered = asyncio.run(main(llm))
    assert refused[0] == 403 and refused[1]["error"].startswith("API key 'a-reader' lacks scope 'answer'")
    assert calls_after_refusal == 0  # the model never saw the refused request
    assert (
        answered[0] == 200
        and answered[1]["answer"] == {"text": "Oskar Lind", "citations": [], "dropped_citations": []}
        and llm.calls == 1
    )


def test_mcp_over_http_needs_a_key_for_its_tenant_and_the_tool_s_scope(api):
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    settings, written, a, b = api  # the worker's MCP tenant is B

    async def main():
        client = await serve_app(settings, written)
        try:
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            refused = await fetch(client, "POST", "/mcp", ping, KEY_A)
            url = str(client.make_url("/mcp"))
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY_B}"}) as http_client:
                async with Client(streamable_http_client(url, http_client=http_client)) as mcp:
                    passage = await mcp.call_tool("get_passage", {"passage_id": written[b]["mill"]["passage"]})
                    remember = await mcp.call_tool("remember", {"text": "The Tarn Mill closes on Sundays."})
            return refused, passage, remember
        finally:
            await client.close()

    refused, passage, remember = asyncio.run(main())
    assert refused == (403, {"error": f"API key 'a-reader' may not use tenant '{b}'"})
    assert not passage.is_error and passage.structured_content["doc_id"] == "mill"
    assert remember.is_error and "API key 'b-reader' lacks scope 'write'" in remember.content[0].text


def test_memstream_query_sends_memstream_api_key(api, monkeypatch, capsys):
    from ops.cli import main as cli
    from ops.stack.services import free_port
    from workers.query.server import query_app, serve

    settings, written, a, b = api
    port = free_port()

    async def main():
        stop = asyncio.Event()
        server = asyncio.create_task(
            serve(query_app(settings, ExactEmbedder(written[a]["mill"]["vector"])), "127.0.0.1", port, stop)
        )
        try:
            for _ in range(100):
                await asyncio.sleep(0.05)
                if server.done() or await asyncio.to_thread(_listening, port):
                    break
            args = [
                "query",
                "Who runs the Tarn Mill?",
                "--tenant",
                a,
                "--mode",
                "dense",
                "--json",
                "--url",
                f"http://127.0.0.1:{port}",
            ]
            monkeypatch.delenv("MEMSTREAM_API_KEY", raising=False)
            without = await asyncio.to_thread(cli, args)
            monkeypatch.setenv("MEMSTREAM_API_KEY", KEY_A)
            with_key = await asyncio.to_thread(cli, args)
            return without, with_key
        finally:
            stop.set()
            await server

    without, with_key = asyncio.run(main())
    out, err = capsys.readouterr()
    assert without == 1 and "HTTP 401" in err and "needs an API key" in err
    assert with_key == 0 and json.loads(out)["tenant"] == a


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---- refusing to start -------------------------------------------------------------------------


def bare_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_API_KEY")}
    # nothing listens there: the refusal must come before any connection is tried
    env.update(
        MEMSTREAM_REDIS_URL="redis://127.0.0.1:9/0",
        MEMSTREAM_KAFKA_BOOTSTRAP="127.0.0.1:9",
        MEMSTREAM_OUTAGE_DEADLINE="2",
        **extra,
    )
    return env


@pytest.mark.parametrize("role", ["query", "chunker,query"])
def test_a_worker_without_keys_refuses_a_non_loopback_address(role):
    proc = subprocess.run(
        [*MEMSTREAM, "worker", "--role", role],
        env=bare_env(MEMSTREAM_HTTP_HOST="0.0.0.0"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "memstream: MEMSTREAM_HTTP_HOST=0.0.0.0 is not a loopback address and no API keys are configured" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


def test_a_worker_with_a_malformed_keys_file_refuses_to_start(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(
        '[{"name": "ops", "key_sha256": "' + "a" * 64 + '", "tenants": ["acme"], "scopes": ["read", "everything"]}]'
    )
    proc = subprocess.run(
        [*MEMSTREAM, "worker", "--role", "query"],
        env=bare_env(MEMSTREAM_API_KEYS_FILE=str(path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"memstream: MEMSTREAM_API_KEYS_FILE={path}: key 0 ('ops'): unknown scope(s) 'everything'" in proc.stderr


def test_run_query_server_refuses_before_binding():
    from workers.query.server import run_query_server

    with pytest.raises(auth.KeyConfigError, match="MEMSTREAM_HTTP_HOST=0.0.0.0 is not a loopback address"):
        run_query_server(Settings(http_host="0.0.0.0", redis_url="redis://127.0.0.1:9/0"))


def test_memstream_keys_new_prints_a_key_once_and_the_entry_that_admits_it(tmp_path):
    made = subprocess.run(
        [*MEMSTREAM, "keys", "new", "--tenant", "acme,globex", "--scope", "read,answer", "--name", "agents"],
        env=bare_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    token, line = made.stdout.splitlines()
    made_entry = json.loads(line)
    assert (
        made_entry["name"] == "agents"
        and made_entry["tenants"] == ["acme", "globex"]
        and made_entry["scopes"] == ["read", "answer"]
    )
    assert token not in line and "shown once" in made.stderr
    path = tmp_path / "keys.json"
    path.write_text(json.dumps([made_entry]))
    key = auth.load_keys(str(path), "").find(token)
    assert key is not None and key.may_use("globex") and not key.may_use("initech")
    listed = subprocess.run(
        [*MEMSTREAM, "keys", "list"],
        env=bare_env(MEMSTREAM_API_KEYS_FILE=str(path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        listed.stdout == "agents: tenants acme,globex; scopes read,answer\n"
        and made_entry["key_sha256"] not in listed.stdout
    )
    bad = subprocess.run(
        [*MEMSTREAM, "keys", "new", "--tenant", "acme", "--scope", "read,root"],
        env=bare_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown scope(s) 'root'" in bad.stderr and bad.stdout == ""


def test_compose_serves_the_api_beyond_loopback_only_with_keys():
    import yaml

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    query = services["query"]["environment"]
    assert not auth.is_loopback(query["MEMSTREAM_HTTP_HOST"]) and query["MEMSTREAM_API_KEYS_FILE"]
    assert any(v.endswith(":" + query["MEMSTREAM_API_KEYS_FILE"] + ":ro") for v in services["query"]["volumes"])
    scraped = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text())["scrape_configs"]
    assert (
        "query:" + query["MEMSTREAM_METRICS_PORT"] in scraped[0]["static_configs"][0]["targets"]
    )  # no key needed there


def test_metrics_port_serves_metrics_without_a_key_on_loopback_by_default():
    import urllib.request

    from ops.stack.services import free_port
    from workers.query.server import serve_metrics

    port = free_port()
    serve_metrics(Settings(metrics_port=port))  # a daemon thread, as in a worker
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200 and b"# HELP" in response.read()
    assert Settings().metrics_host == "127.0.0.1"


def test_isolation_as_a_property_no_crafted_tenant_or_id_reaches_another_tenant(api):
    """Hypothesis: tenant names near A's (case, affixes, separators, the caches' namespaces,
    B's) and arbitrary ids — a key for A is refused (403, or 400 for a name no tenant can have)
    on every endpoint, before any lookup: never a 200, a 404 or a 5xx."""
    from urllib.parse import quote

    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    from store.keys import INTERNAL_NAMESPACES

    settings, written, a, b = api
    near_a = st.sampled_from(
        [
            a.upper(),
            a + "x",
            "x" + a,
            a + ".",
            a.replace("-", "_"),
            a[:-1],
            b,
            *INTERNAL_NAMESPACES,
            "llm-cache",
            "embedding-cache",
            "*",
            "default",
            a + "/../" + b,
            a + "\x00",
            " " + a,
        ]
    )
    any_name = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=70)
    ids = st.one_of(
        st.sampled_from([written[b]["mill"]["fact"], written[b]["mill"]["passage"]]),
        st.text(alphabet="0123456789abcdef", min_size=16, max_size=32),
        st.text(min_size=1, max_size=40),
    )
    outcomes: list[tuple[str, int]] = []

    @hsettings(
        max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(tenant=st.one_of(near_a, any_name).filter(lambda t: t != a), ident=ids)
    def check(tenant, ident):
        async def main():
            client = await serve_app(settings, written)
            try:
                q, i = quote(tenant, safe=""), quote(ident, safe="")
                return [
                    await fetch(
                        client, "POST", "/v1/query", {"query": "Who runs the Tarn Mill?", "tenant": tenant}, KEY_A
                    ),
                    await fetch(client, "GET", f"/v1/facts?tenant={q}", None, KEY_A),
                    await fetch(client, "GET", f"/v1/facts/{i}?tenant={q}", None, KEY_A),
                    await fetch(client, "GET", f"/v1/facts/{i}/evidence?tenant={q}", None, KEY_A),
                    await fetch(client, "GET", f"/v1/passages/{i}?tenant={q}", None, KEY_A),
                ]
            finally:
                await client.close()

        for status, body in asyncio.run(main()):
            # 404 only from routing (an id aiohttp's router does not match: another path), the same
            # for every tenant: no lookup ran, nothing was read
            routed_away = status == 404 and body.get("error", "").startswith("Not Found: ")
            assert status in (400, 403) or routed_away, (tenant, ident, status, body)
            outcomes.append((tenant, status))

    check()
    assert {status for _, status in outcomes} >= {403}


def test_a_bearer_token_that_is_not_utf8_is_an_unknown_key_not_a_500():
    """aiohttp keeps a header's non-UTF-8 bytes as lone surrogates, which the key's hash could
    not encode: `Authorization: Bearer \\xff\\xfe` was a 500 UnicodeEncodeError."""
    ring = auth.parse_keys(json.dumps([entry("a", "ms_a", ["t"], ["read"])]), "test")
    assert ring.find("\udcff\udcfe") is None and ring.find("ms_a") is not None

    async def declared(request):
        return http.json_response({"ok": True})

    async def main():
        app = web.Application(middlewares=http.middlewares(4, ring, {"declared": http.Need(None)}))
        app.router.add_get("/declared", declared, name="declared")
        async with TestClient(TestServer(app)) as client:
            answers = []
            for token in (b"\xff\xfe", b"caf\xe9", b"ms_a"):
                reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
                writer.write(
                    b"GET /declared HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                    + token
                    + b"\r\nConnection: close\r\n\r\n"
                )
                answers.append(await asyncio.wait_for(reader.read(), 5))
                writer.close()
            return answers

    not_utf8, latin1, known = asyncio.run(main())
    for answer in (not_utf8, latin1):
        assert answer.startswith(b"HTTP/1.1 401") and answer.endswith(b'{"error":"unknown API key"}'), answer
    assert known.startswith(b"HTTP/1.1 200") and known.endswith(b'{"ok":true}'), known
