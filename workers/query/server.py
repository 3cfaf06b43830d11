"""The query worker's HTTP API as a plain aiohttp application, needing only Redis.

`memstream worker --role query` runs it alone (`run_query_server`): no Kafka client, no faust,
so the query side answers while the broker is down or was never there. A worker that also runs
indexing agents (`--role all`, `chunker,query`, ...) serves the same application from inside its
faust event loop (`workers.app`), so there is one implementation of the API.

Routes: POST /v1/query; GET /v1/facts/{id}, /v1/facts/{id}/evidence, /v1/passages/{id},
/v1/entities/{id}/facts (a record of the tenant named by ?tenant=, 404 when missing);
GET /v1/overview (the tenant's counts by layer and fact status); GET /v1/recent-facts (its
newest facts, of some statuses); GET / and /explore (the explorer
page, workers.query.page); GET /v1/facts?category=&limit= (the
tenant's standing facts: constraints, rejected options, tool failures); /mcp (the MCP server of the tenant
MEMSTREAM_TENANT, streamable HTTP: workers.query.mcp_server); /healthz (200 while Redis answers a
PING, else 503); /metrics (Prometheus). Load shedding and JSON error bodies: workers.query.http.

API keys (workers.query.auth, enforced by http.authorization): every route but /healthz and the
explorer's files needs a key; the `needs` of query_app say what each needs. With no keys configured the worker must listen
on loopback (auth.check_listener, at start)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from topics import ContractError, tenant_or_default
from workers.models.embedding import EmbedderMismatch
from workers.models.llm import LLMClient, LLMError, MalformedOutput
from workers.models.protocols import ChatModel, Embedder
from workers.publisher import ClientPublisher, PublishError, check_reason
from workers.query import auth, drilldown, http, mcp_server, page
from workers.query.answers import Health, Retracted
from workers.query.clients import cached_embedder, query_memory
from workers.query.engine import QueryEngine
from workers.query.generation import generate_answer
from workers.query.request import QueryRequest, parse_json_body
from workers.settings import Settings
from workers.tenant_metrics import census_loop

log = logging.getLogger(__name__)
CENSUS_STOP_S = 10.0  # the longest a shutdown waits for a census under way


def query_app(
    settings: Settings, embedder: Embedder | None = None, answer_llm: ChatModel | None = None
) -> web.Application:
    """The HTTP API over a Redis pool of its own (closed with the application). `embedder`:
    the worker's shared one (an `all` worker embeds for its extractor too), else one is built
    here, cached in Redis. `answer_llm`: the model for `"answer": true`, else the
    OpenAI-compatible endpoint of MEMSTREAM_LLM_BASE_URL/MODEL when both are set."""
    keys = settings_keys(settings)  # KeyConfigError (a ValueError) before anything is opened
    memory = query_memory(settings)
    if embedder is None:
        embedder = cached_embedder(settings, memory)
    owned_llm = None  # the answer LLM made here, closed with the application
    if answer_llm is None and settings.llm_base_url and settings.llm_model:
        answer_llm = owned_llm = LLMClient(settings.llm_config(), memory.llm_cache(settings.llm_model))
    engine = QueryEngine.from_settings(settings, memory, embedder)

    def named_tenant(request: web.Request) -> str:
        """The tenant of ?tenant= (default: MEMSTREAM_TENANT); ContractError when invalid."""
        return tenant_or_default(request.query.get("tenant"), settings.tenant)

    def given_limit(request: web.Request) -> str | None:
        """A listing's ?limit=, as given (None: not given; drilldown.parse_limit reads it); a
        ContractError when given more than once, on every listing (/v1/recent-facts and an
        entity's facts took the first, silently, where /v1/facts refused)."""
        limits = request.query.getall("limit", [])
        if len(limits) > 1:
            raise ContractError(f"'limit' given {len(limits)} times: give it once")
        return limits[0] if limits else None

    async def lookup(request: web.Request, load) -> web.Response:
        """GET a record of the tenant named by ?tenant= (default: MEMSTREAM_TENANT): 400 for a
        bad tenant, 404 with what was missing, else the record as JSON."""
        try:
            tenant = named_tenant(request)
        except ContractError as exc:
            return http.error_response(400, str(exc))
        found, what = await load(tenant)
        if found is None:
            return http.error_response(404, drilldown.missing(what, tenant))
        return http.json_response(found.to_json())

    async def post_query(request: web.Request) -> web.Response:
        try:
            query = QueryRequest.from_bytes(await request.read(), settings.tenant, settings.top_k)
        except ContractError as exc:
            return http.error_response(400, str(exc))
        if query.answer and answer_llm is None:
            return http.error_response(
                400,
                "'answer': true needs an LLM: set MEMSTREAM_LLM_BASE_URL and MEMSTREAM_LLM_MODEL on the query worker",
            )
        try:
            result = await engine.answer(query)
        except EmbedderMismatch as exc:  # the tenant's memory is another embedder's: no query of it means anything here
            return http.error_response(409, str(exc))
        if query.answer and answer_llm is not None:  # (without one the request was refused above)
            try:
                result.answer = await generate_answer(answer_llm, query.query, result.passages)
            except (LLMError, MalformedOutput) as exc:
                return http.error_response(502, f"answer generation failed: {exc}")
        return http.json_response(result.to_json())

    async def list_facts(request: web.Request) -> web.Response:
        """GET /v1/facts?tenant=&category=A,B&limit=N: the tenant's standing facts
        (drilldown.standing_facts); categories repeated (?category=A&category=B) add up; 400 for a
        bad tenant, category or limit, or a limit given twice."""
        try:
            tenant = named_tenant(request)
            # ?category=A&category=B,C: every one, as ?category=A,B,C lists them
            categories, limit = drilldown.fact_filter(
                ",".join(request.query.getall("category", [])), given_limit(request)
            )
        except ContractError as exc:
            return http.error_response(400, str(exc))
        return http.json_response((await drilldown.standing_facts(memory, tenant, categories, limit)).to_json())

    async def get_overview(request: web.Request) -> web.Response:
        """GET /v1/overview?tenant=: the tenant's records per layer, facts per status, graph version."""
        try:
            tenant = named_tenant(request)
        except ContractError as exc:
            return http.error_response(400, str(exc))
        return http.json_response((await drilldown.overview(memory, tenant)).to_json())

    async def get_recent_facts(request: web.Request) -> web.Response:
        """GET /v1/recent-facts?tenant=&status=A,B&limit=N: the tenant's newest facts (of those
        statuses); 400 for a bad tenant, status or limit, or a limit given twice."""
        try:
            tenant = named_tenant(request)
            statuses = drilldown.status_filter(",".join(request.query.getall("status", [])))
            limit = drilldown.parse_limit(given_limit(request))
        except ContractError as exc:
            return http.error_response(400, str(exc))
        return http.json_response((await drilldown.recent_facts(memory, tenant, statuses, limit)).to_json())

    async def get_entity_facts(request: web.Request) -> web.Response:
        """GET /v1/entities/{id}/facts?tenant=&limit=N: the entity and the facts naming it; 400
        for a bad tenant or limit, or a limit given twice."""
        entity_id = request.match_info["entity_id"]
        try:
            limit = drilldown.parse_limit(given_limit(request))
        except ContractError as exc:
            return http.error_response(400, str(exc))

        async def load(tenant):
            return await drilldown.neighbourhood(memory, tenant, entity_id, limit), f"entity {entity_id!r}"

        return await lookup(request, load)

    async def get_fact(request: web.Request) -> web.Response:
        fact_id = request.match_info["fact_id"]

        async def load(tenant):
            return await drilldown.fact_record(memory, tenant, fact_id), f"fact {fact_id!r}"

        return await lookup(request, load)

    async def get_evidence(request: web.Request) -> web.Response:
        fact_id = request.match_info["fact_id"]

        async def load(tenant):
            return await drilldown.fact_evidence(memory, tenant, fact_id), f"fact {fact_id!r}"

        return await lookup(request, load)

    publisher = ClientPublisher(settings)  # Kafka, made on the first retraction

    async def post_retract(request: web.Request) -> web.Response:
        """POST /v1/facts/{id}/retract?tenant= with an optional body {"reason": "..."}: the fact's
        retraction queued for the resolver (202); 400 for a bad tenant or body (a reason the
        resolver's decode would refuse too: publisher.check_reason), 404 for an unknown fact,
        503 when Kafka does not take it."""
        fact_id = request.match_info["fact_id"]
        try:
            tenant = named_tenant(request)
            raw = await request.read()
            body = parse_json_body(raw) if raw.strip() else {}
            if not isinstance(body, dict) or set(body) - {"reason"} or not isinstance(body.get("reason", ""), str):
                raise ContractError('the body, when given, is {"reason": "<text>"}')
            reason = check_reason(body.get("reason", ""))
        except ContractError as exc:
            return http.error_response(400, str(exc))
        fact = await memory.fact(tenant, fact_id)
        if fact is None:
            return http.error_response(404, drilldown.missing(f"fact {fact_id!r}", tenant))
        try:
            work_id = await publisher.retract(tenant, fact, reason)
        except PublishError as exc:
            return http.error_response(503, str(exc))
        return http.json_response(
            Retracted(fact_id=fact_id, tenant=tenant, request=work_id, queued=True).to_json(), status=202
        )

    async def get_passage(request: web.Request) -> web.Response:
        passage_id = request.match_info["passage_id"]

        async def load(tenant):
            return await drilldown.passage_record(memory, tenant, passage_id), f"passage {passage_id!r}"

        return await lookup(request, load)

    async def health(request: web.Request) -> web.Response:
        try:
            await memory.ping()
        except Exception as exc:
            # /healthz needs no key: the error (hosts, ports) goes to the log, not to the caller
            log.warning("healthz: Redis does not answer: %s: %s", type(exc).__name__, exc)
            return http.json_response(Health(status="unhealthy", redis="unavailable").to_json(), status=503)
        return http.json_response(Health(status="ok").to_json())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    background: list[
        tuple[asyncio.Task, asyncio.Event]
    ] = []  # the census of the shared indexes (workers.tenant_metrics)

    async def start_census(app: web.Application) -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(
            census_loop(memory, settings.metrics_top_tenants, settings.metrics_census_seconds, stop)
        )
        background.append((task, stop))

    async def close_memory(app: web.Application) -> None:
        for census, stop in background:
            stop.set()
            census.cancel()
            await asyncio.wait([census], timeout=CENSUS_STOP_S)
        await asyncio.to_thread(publisher.close)
        await engine.aclose()
        if owned_llm is not None:
            await owned_llm.aclose()
        await memory.close()

    # ---- who may call what: the tenant each route reads, checked before its handler runs ----
    async def read_named_tenant(request: web.Request) -> http.Need:
        return http.Need(named_tenant(request), ("read",))

    async def write_named_tenant(request: web.Request) -> http.Need:
        return http.Need(named_tenant(request), ("write",))

    async def query_need(request: web.Request) -> http.Need:
        # the body parsed as post_query parses it (aiohttp keeps the bytes read): its tenant and
        # whether it asks for generation
        query = QueryRequest.from_bytes(await request.read(), settings.tenant, settings.top_k)
        return http.Need(query.tenant, ("read", "answer") if query.answer else ("read",))

    needs: dict[str, http.RouteNeed] = {
        "query": query_need,
        "facts": read_named_tenant,
        "fact": read_named_tenant,
        "evidence": read_named_tenant,
        "passage": read_named_tenant,
        "overview": read_named_tenant,
        "recent_facts": read_named_tenant,
        "entity_facts": read_named_tenant,
        "retract": write_named_tenant,
        "healthz": http.OPEN,
        "metrics": http.Need(None, ("admin",)),
        # MCP serves the tenant MEMSTREAM_TENANT only; each tool checks its scope (read, or write for remember)
        **{name: http.Need(settings.tenant) for name in mcp_server.MCP_ROUTE_NAMES},
    }

    # a body read whole (http.authorization) may hold MCP's `remember` of a text of
    # max_text_bytes, each byte up to six in JSON (a control character as \u00XX): at aiohttp's
    # default of 1 MiB such a call got 413 instead of its tool's answer (from a review)
    app = web.Application(
        middlewares=http.middlewares(settings.query_max_inflight, keys, needs),
        client_max_size=6 * settings.max_text_bytes + (1 << 16),
    )
    app.router.add_post("/v1/query", post_query, name="query")
    app.router.add_get("/v1/facts", list_facts, name="facts")
    app.router.add_get("/v1/facts/{fact_id}", get_fact, name="fact")
    app.router.add_get("/v1/facts/{fact_id}/evidence", get_evidence, name="evidence")
    app.router.add_post("/v1/facts/{fact_id}/retract", post_retract, name="retract")
    app.router.add_get("/v1/passages/{passage_id}", get_passage, name="passage")
    app.router.add_get("/v1/overview", get_overview, name="overview")
    app.router.add_get("/v1/recent-facts", get_recent_facts, name="recent_facts")
    app.router.add_get("/v1/entities/{entity_id}/facts", get_entity_facts, name="entity_facts")
    app.router.add_get("/healthz", health, name="healthz")
    # the explorer: a page over these routes (workers.query.page), its files open to all
    page.mount(app, needs)
    app.router.add_get("/metrics", metrics, name="metrics")
    # MCP for agent frameworks: the tenant MEMSTREAM_TENANT's memory at /mcp, over this engine
    mcp_server.mount(app, settings, engine)
    app.on_startup.append(start_census)
    app.on_startup.append(freeze_startup_objects)  # last: what the other hooks made is frozen too
    app.on_cleanup.append(close_memory)
    return app


async def freeze_startup_objects(_app: web.Application) -> None:
    """The objects alive once the API starts — modules, the embedding model, the engine —
    collected once and moved out of the cyclic collector's generations (gc.freeze): they live
    as long as the process, and every full collection traversed all of them while each query in
    flight waited. Measured on the 2-core machine: a query worker's full collection took 93.5 ms
    over 192,367 objects (the server's imports), 294 ms over 617,005 with the local model
    loaded, 0.1 ms once frozen; two came in 300 ppr and reconstruct queries of a 50,000-passage
    tenant, 65-73 ms each, and they were its slowest queries (max 92.8 → 58.1 ms frozen). Objects
    made later (a tenant's graph, a request's) are collected as before."""
    gc.collect()  # the start's own garbage is freed, not frozen
    gc.freeze()


def settings_keys(settings: Settings) -> auth.KeyRing | None:
    """The API keys configured in `settings` (None: none); KeyConfigError when malformed."""
    return auth.load_keys(settings.api_keys_file, settings.api_keys)


def check_exposure(settings: Settings) -> None:
    """At a query worker's start, before it binds: its keys load, and without keys it listens
    on loopback only (KeyConfigError, a ValueError: `memstream worker` exits 2 with the
    message); logs how the API is protected."""
    log.info("%s", auth.check_listener(settings.http_host, settings.http_port, settings_keys(settings)))


def serve_metrics(settings: Settings) -> None:
    """MEMSTREAM_METRICS_PORT > 0: /metrics (Prometheus, no key) on MEMSTREAM_METRICS_HOST
    (default loopback) from a thread of its own, for every worker role. The API's own /metrics
    needs a key with scope admin."""
    if settings.metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.metrics_port, addr=settings.metrics_host)
        except OSError as exc:  # one line, exit 1, as a taken API port (an OSError's traceback before)
            raise SystemExit(
                f"memstream: /metrics cannot listen on {settings.metrics_host}:{settings.metrics_port}: {exc}"
            ) from None
        log.info("metrics on http://%s:%s/metrics", settings.metrics_host, settings.metrics_port)


async def serve(
    app: web.Application,
    host: str,
    port: int,
    stop: asyncio.Event | None = None,
    socks: Sequence[socket.socket] = (),
) -> None:
    """Serve `app` on host:port — or on `socks`, listening sockets bound beforehand (listen) —
    until `stop` is set or this task is cancelled (a faust worker stopping cancels its tasks);
    then close the listeners, let requests in flight finish and run the app's cleanup (the Redis
    pool). Raises OSError when the port cannot be bound."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        sites: list[web.BaseSite] = [web.SockSite(runner, sock) for sock in socks] or [web.TCPSite(runner, host, port)]
        for site in sites:
            await site.start()
        log.info("query API serving on http://%s:%s", host, port)
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
        log.info("query API on %s:%s stopped", host, port)


def listen(settings: Settings) -> list[socket.socket]:
    """The query API's listening sockets on MEMSTREAM_HTTP_HOST:MEMSTREAM_HTTP_PORT, one for each
    address the host names (`localhost`: 127.0.0.1 and ::1; `::1` alone; "" every interface of
    both families), as aiohttp's own site binds them, bound before anything else starts. A port
    taken (or a host not this machine's) ends the process with one line, exit 1, not an
    OSError's traceback. (socket.create_server binds IPv4 only: `::1`, an allowed loopback,
    could not be served; a review.)"""
    host, port = settings.http_host or None, settings.http_port
    socks: list[socket.socket] = []
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # its IPv4 twin binds the same port
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:  # a port chosen by the first: the same on every address
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(128)
    except OSError as exc:
        for sock in socks:
            sock.close()
        raise SystemExit(
            f"memstream: the query API cannot listen on {settings.http_host}:{settings.http_port}: {exc}"
        ) from None
    return socks


def run_query_server(settings: Settings) -> None:
    """`memstream worker --role query`: the HTTP API in a process of its own, needing only
    Redis; SIGTERM or SIGINT stops it cleanly (requests in flight are finished, pool closed)."""

    check_exposure(settings)
    http_sockets = listen(settings)
    serve_metrics(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("query worker: Redis at %s, no Kafka", settings.redis_address)  # no password
        await serve(query_app(settings), settings.http_host, settings.http_port, stop, http_sockets)

    asyncio.run(main())
