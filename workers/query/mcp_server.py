"""memstream as an MCP server (Model Context Protocol, the official `mcp` SDK 2.x) for agent
frameworks: the memory of ONE tenant per server, as seven tools —

- `search_memory`: the query engine's answer (workers.query.engine), validated as POST /v1/query
  validates a body, so a bad request is a tool error with the same message as the HTTP 400;
- `remember`: a conversation turn or a document published to `memstream.documents`, indexed by
  the workers like anything `memstream publish` sends; `forget`: a document taken out again
  (a tombstone, as `memstream delete` sends; with `purge`, erased, as `delete --purge`); `retract_fact`: a fact taken back (as
  `memstream retract`);
- `fact_evidence`, `get_passage`: the drill-down of GET /v1/facts/{id}/evidence and
  /v1/passages/{id} (workers.query.drilldown);
- `standing_facts`: the tenant's constraints, rejected options and tool failures that hold, as
  GET /v1/facts?category= lists them (drilldown.standing_facts) — for an agent before a decision.

Two transports: stdio (`memstream mcp --tenant T`, `run_stdio`) and streamable HTTP at /mcp of
the query worker's own address (`mount`, called by workers.query.server.query_app for the
tenant MEMSTREAM_TENANT), sharing the HTTP API's engine, result cache and graph cache. The HTTP
endpoint is stateless (every POST stands alone, JSON responses; POST is all it serves, no GET
stream): no session to pin to one query worker, so several behind a load balancer serve it alike.

Searching needs Redis only; `remember`, `forget` and `retract_fact` need Kafka, and the producer is made on the
first call, so a query worker with no broker reachable still serves the other four tools."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Annotated, Any, AsyncIterator

from aiohttp import web
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field, SkipValidation

from topics import ContractError, Document, validate_tenant
from topics.conversations import turn_from_json, turn_ts
from topics.records import FACT_CATEGORIES, publication_version
from workers.algorithms.normalize import content_hash
from workers.models.embedding import EmbedderMismatch, LocalEmbedder, make_embedder
from workers.publisher import ClientPublisher, PublishError, check_reason
from workers.query import drilldown
from workers.query.answers import Evidence, Forgotten, PassageRecord, QueryResult, Remembered, Retracted, StandingFacts
from workers.query.asgi import ASGI_API_KEY, asgi_handler
from workers.query.auth import SCOPE_MEANINGS
from workers.query.clients import cached_embedder, query_memory
from workers.query.engine import QueryEngine
from workers.query.modes import DEFAULT_MODE, MAX_TOP_K, registered
from workers.query.request import QueryRequest, unknown_fields
from workers.settings import Settings

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
MCP_ROUTE_NAMES = ("mcp", "mcp.slash")  # /mcp and /mcp/, for the query worker's per-route key checks


def _mode_hint(mode) -> str:
    """A mode as the search tool's schema offers it (the registry's hint)."""
    return f"'{mode.name}' " + ("(the default) " if mode.name == DEFAULT_MODE else "") + mode.hint


# ---- what the tools answer (the SDK publishes these as output schemas): the query side's
# typed answers (workers.query.answers), and the write tools' receipts below -----------------


# ---- remember: one document onto memstream.documents --------------------------------------


def remembered_document(
    tenant: str,
    text: str,
    doc_id: str | None,
    session_id: str | None,
    turn: int | None,
    speaker: str | None,
    ts: float | str | None,
    metadata: dict | None,
    max_text_bytes: int,
) -> Document:
    """The document `remember` publishes, validated as the workers validate it (topics.Document).
    With `turn`, a conversation turn (topics.Document.is_turn) made as `memstream publish` makes
    one of a JSONL line (topics.conversations: doc id "{session_id}:{turn}", turn id in the
    metadata); else a document, chunked in windows even with a session_id, whose default id is
    derived from its text, so remembering the same text twice is one document. Its version is
    the time of remembering (topics.records.publication_version): remembered again after a
    `forget`, it comes back."""
    if turn is not None:
        row = {
            "session_id": session_id,
            "turn": turn,
            "speaker": speaker,
            "text": text,
            "ts": ts,
            "metadata": metadata or {},
            **({"doc_id": doc_id} if doc_id is not None else {}),
        }
        doc = replace(turn_from_json(row, "remember").document(tenant), version=publication_version())
    else:
        when = turn_ts(ts, "remember")
        doc = Document(
            tenant,
            f"memory-{content_hash(text)[:16]}" if doc_id is None else doc_id,
            text,
            metadata or {},
            version=publication_version(),
            session_id=session_id,
            speaker=speaker,
            ts=when,
        )
    return Document.from_dict(doc.to_dict(), max_text_bytes=max_text_bytes, where="remember")


# ---- the server -----------------------------------------------------------------------------


def require_scope(ctx: Context | None, scope: str) -> None:
    """Over HTTP, the API key the query worker's middleware admitted (it checked the tenant)
    must have `scope`, else a ToolError; over stdio (no HTTP request) whoever runs the process
    has its memory."""
    if ctx is None:  # the SDK hands every tool its context; without one nothing is known of the caller
        raise ToolError("no request context: the tool cannot check the caller's scopes")
    request = ctx.request_context.request
    if request is None:
        return
    key = request.scope.get("state", {}).get(ASGI_API_KEY)
    if key is None:
        raise ToolError("refused: this request was not authorized by the query worker")
    if scope not in key.scopes:
        raise ToolError(f"refused: API key {key.name!r} lacks scope {scope!r}, needed to {SCOPE_MEANINGS[scope]}")


class StrictArguments(MCPServer):
    """An MCPServer whose tools refuse arguments they do not declare (a ToolError naming them),
    as POST /v1/query refuses unknown fields: the SDK's argument models drop them silently, so
    a misspelt "asof" would search today's memory without a word."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None):
        declared = {tool.name: tool.input_schema for tool in await self.list_tools()}.get(name)
        if declared is not None:
            try:
                unknown_fields(arguments, tuple(declared.get("properties", {})), f"the arguments of {name}")
            except ContractError as exc:
                raise ToolError(str(exc)) from None
        return await super().call_tool(name, arguments, context)


def memory_server(tenant: str, engine: QueryEngine, settings: Settings, publisher: ClientPublisher) -> MCPServer:
    """The MCP server of one tenant's memory over `engine` (and its store)."""
    tenant = validate_tenant(tenant)
    memory = engine.memory
    server = StrictArguments(
        "memstream",
        version="1",
        log_level=settings.log_level_name,
        instructions=(
            f"Long-term memory of tenant {tenant!r}: past conversation turns and documents, the facts extracted from them "
            "(with constraints, rejected options and tool failures marked) and the exact passages behind each fact. "
            "standing_facts and search_memory before deciding anything earlier turns may bear on; remember what later sessions need."
        ),
    )
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    @server.tool(
        annotations=read_only,
        description=(
            "Recall what memory holds about a question or topic: the passages (exact text of past turns and documents) most relevant to "
            "`query`, the facts behind them and the entities they involve. Use it before answering or deciding anything that may depend on "
            "earlier conversations: decisions, hard constraints, options already rejected and why, tool calls that failed. Each passage and "
            "fact has an `id` for get_passage and fact_evidence."
        ),
    )
    async def search_memory(
        query: Annotated[str, Field(description="what to recall, in natural language")],
        mode: Annotated[
            str,
            Field(description="retrieval mode: " + "; ".join(_mode_hint(m) for m in registered())),
        ] = DEFAULT_MODE,
        # SkipValidation: the value as sent reaches QueryRequest's check, as POST /v1/query's does;
        # the SDK's model took true for 1 and "5" for 5, which the HTTP API refuses (an audit)
        top_k: Annotated[int, SkipValidation, Field(description=f"passages to return, 1 to {MAX_TOP_K}")] = 5,
        as_of: Annotated[
            str | None, Field(description="an ISO time: answer from the facts valid then (default: now)")
        ] = None,
        ctx: Context | None = None,
    ) -> QueryResult:
        require_scope(ctx, "read")
        body: dict[str, Any] = {"query": query, "mode": mode, "top_k": top_k, "tenant": tenant}
        if as_of is not None:
            body["as_of"] = as_of
        try:
            request = QueryRequest.from_json(body, tenant, top_k)
        except ContractError as exc:
            raise ToolError(str(exc)) from None
        try:
            return await engine.answer(request)
        except EmbedderMismatch as exc:
            raise ToolError(str(exc)) from None

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
        description=(
            "Store something in long-term memory so later sessions can recall it: a conversation turn (give session_id, turn and speaker) "
            "or a document or note (text alone). Record decisions, constraints, rejected options with their reasons, and tool failures as "
            "they happen. It is indexed in the background (seconds); search_memory finds it afterwards. Returns the doc_id; the same "
            "doc_id and text again is the same memory, indexed once."
        ),
    )
    async def remember(
        text: Annotated[str, Field(description="the exact text to keep; passages return it byte for byte")],
        doc_id: Annotated[
            str | None,
            Field(
                description="an id of your own; default: '{session_id}:{turn}' for a turn, else derived from the text"
            ),
        ] = None,
        session_id: Annotated[
            str | None, Field(description="the conversation it belongs to (required for a turn)")
        ] = None,
        turn: Annotated[
            int | None, Field(description="the turn's number in its session (makes this a conversation turn)")
        ] = None,
        speaker: Annotated[str | None, Field(description="who said it (required for a turn)")] = None,
        ts: Annotated[
            float | str | None, Field(description="when it was said: seconds since the epoch or an ISO time")
        ] = None,
        metadata: Annotated[
            dict[str, Any] | None, Field(description="anything else to keep with it (strings, numbers)")
        ] = None,
        ctx: Context | None = None,
    ) -> Remembered:
        require_scope(ctx, "write")
        try:
            doc = remembered_document(
                tenant, text, doc_id, session_id, turn, speaker, ts, metadata, settings.max_text_bytes
            )
            await publisher.publish(doc)
        except (ContractError, PublishError) as exc:
            raise ToolError(str(exc)) from None
        return Remembered(doc_id=doc.doc_id, tenant=tenant, topic=settings.topics.documents, queued=True)

    @server.tool(
        description=(
            "Forget a document or turn you remembered (by its doc_id): its passages leave memory, and every fact only they supported "
            "is retracted (facts also said elsewhere stay, with that evidence). Use it when something said is taken back; with "
            "purge, to erase it: its text, and what only it said, leave the store for good. Processed in the background (seconds)."
        )
    )
    async def forget(
        doc_id: Annotated[str, Field(description="the doc_id remember returned (or the one you gave it)")],
        purge: Annotated[
            bool,
            Field(description="erase it: its text, vectors and what only it said leave the store, not kept for audit"),
        ] = False,
        ctx: Context | None = None,
    ) -> Forgotten:
        require_scope(ctx, "write")
        if not doc_id.strip():
            raise ToolError("doc_id must not be empty")
        try:
            await publisher.delete(tenant, doc_id, purge)
        except PublishError as exc:
            raise ToolError(str(exc)) from None
        return Forgotten(doc_id=doc_id, tenant=tenant, topic=settings.topics.documents, queued=True)

    @server.tool(
        description=(
            "Retract a fact that no longer holds (by its fact_id, as search_memory or standing_facts return it): it leaves memory and "
            "standing facts with a `retracted` event, and stays out until a passage says it again. Use it when a decision, "
            "constraint or rejection is taken back. Processed in the background (seconds)."
        )
    )
    async def retract_fact(
        fact_id: Annotated[str, Field(description="the fact's id")],
        reason: Annotated[str, Field(description="why it no longer holds; kept with the fact")] = "",
        ctx: Context | None = None,
    ) -> Retracted:
        require_scope(ctx, "write")
        try:
            check_reason(reason)  # as POST /v1/facts/{id}/retract checks it
        except ContractError as exc:
            raise ToolError(str(exc)) from None
        fact = await engine.memory.fact(tenant, fact_id)
        if fact is None:
            raise ToolError(f"no fact {fact_id!r} in tenant {tenant!r}")
        try:
            work_id = await publisher.retract(tenant, fact, reason)
        except PublishError as exc:
            raise ToolError(str(exc)) from None
        return Retracted(fact_id=fact_id, tenant=tenant, request=work_id, queued=True)

    @server.tool(
        annotations=read_only,
        description=(
            "A fact and the exact passages it was extracted from (its evidence). Use it to check a fact that search_memory returned "
            "against its source before relying on it, or to see when and by whom it was said."
        ),
    )
    async def fact_evidence(
        fact_id: Annotated[str, Field(description="a fact's id, as search_memory returns it")],
        ctx: Context | None = None,
    ) -> Evidence:
        require_scope(ctx, "read")
        found = await drilldown.fact_evidence(memory, tenant, fact_id)
        if found is None:
            raise ToolError(drilldown.missing(f"fact {fact_id!r}", tenant))
        return found

    @server.tool(
        annotations=read_only,
        description=(
            "One passage, its text byte for byte as it was published, with its document id. Use it to quote or re-read a passage "
            "that search_memory or fact_evidence named."
        ),
    )
    async def get_passage(
        passage_id: Annotated[str, Field(description="a passage's id, as search_memory or fact_evidence return it")],
        ctx: Context | None = None,
    ) -> PassageRecord:
        require_scope(ctx, "read")
        found = await drilldown.passage_record(memory, tenant, passage_id)
        if found is None:
            raise ToolError(drilldown.missing(f"passage {passage_id!r}", tenant))
        return found

    @server.tool(
        annotations=read_only,
        description=(
            "The standing facts of this memory: every hard constraint, rejected option (with its reason in the passage) and tool "
            "failure that still holds, most specific first. Call it before a decision (booking, routing, retrying a tool, offering an "
            "option) so that nothing already refused, failed or ruled out is proposed again; fact_evidence gives each one's passages."
        ),
    )
    async def standing_facts(
        categories: Annotated[
            list[str] | None,
            Field(
                description=(
                    f"categories to list, of {', '.join(FACT_CATEGORIES)}; default: {', '.join(drilldown.STANDING_CATEGORIES)}"
                )
            ),
        ] = None,
        limit: Annotated[  # the value as sent meets drilldown.parse_limit, as top_k's meets its check
            int, SkipValidation, Field(description=f"facts to return, 1 to {drilldown.MAX_FACTS_LIMIT}")
        ] = drilldown.DEFAULT_FACTS_LIMIT,
        ctx: Context | None = None,
    ) -> StandingFacts:
        require_scope(ctx, "read")
        try:
            chosen, bounded = drilldown.fact_filter(categories, limit)
        except ContractError as exc:
            raise ToolError(str(exc)) from None
        return await drilldown.standing_facts(memory, tenant, chosen, bounded)

    return server


# ---- transports -----------------------------------------------------------------------------


def mount(app: web.Application, settings: Settings, engine: QueryEngine) -> None:
    """Serve the MCP server of MEMSTREAM_TENANT over streamable HTTP at /mcp of `app` (the query
    worker's aiohttp application): the SDK's ASGI endpoint through workers.query.asgi, its
    session manager run from the application's startup to its cleanup. Call it before the
    cleanup that closes the store, so requests in flight end first."""
    publisher = ClientPublisher(settings)
    server = memory_server(settings.tenant, engine, settings, publisher)
    # The SDK's own construction of the endpoint: its defaults (DNS-rebinding protection when
    # bound to localhost, body limit) come with it; its Starlette app is not used.
    server.streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True, host=settings.http_host
    )
    manager = server.session_manager
    running: dict[str, Any] = {}

    async def start(app: web.Application) -> None:
        # The manager's run() is an anyio task group: entered and left by one task of its own,
        # whatever tasks aiohttp runs startup and cleanup on.
        started, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(run(), name="memstream-mcp-sessions")
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done():
            task.result()  # raises what stopped it
        running.update(task=task, stop=stop)

    async def stop(app: web.Application) -> None:
        if running:
            running["stop"].set()
            await running["task"]
        await asyncio.to_thread(publisher.close)

    handler = asgi_handler(manager.handle_request)
    # POST only: a GET opened the SDK's standalone SSE stream, which in stateless mode never
    # ends, and each held an in-flight slot, so a few idle GETs shed every /v1/* request (an
    # audit). Stateless, there is no stream to offer, and the SDK's client opens one only with
    # a session id, never given here; any other method is aiohttp's 405 with Allow, as JSON.
    for path, name in zip((MCP_PATH, MCP_PATH + "/"), MCP_ROUTE_NAMES):
        app.router.add_post(path, handler, name=name)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)


@contextlib.asynccontextmanager
async def stdio_parts(settings: Settings, tenant: str) -> AsyncIterator[tuple[MCPServer, QueryEngine]]:
    """The MCP server of `tenant` that `memstream mcp` runs, and its engine — built as the query
    worker builds its own (QueryEngine.from_settings: MEMSTREAM_ROUTER, MEMSTREAM_RECONSTRUCT_*,
    the graph cache's size); everything closed on leaving."""
    memory = query_memory(settings)
    publisher = ClientPublisher(settings)
    engine = model = None
    try:
        model = make_embedder(settings, background=True)  # the handshake answered at once, the model loading meanwhile
        engine = QueryEngine.from_settings(settings, memory, cached_embedder(settings, memory, model))
        yield memory_server(tenant, engine, settings, publisher), engine
    finally:
        await asyncio.to_thread(publisher.close)
        if engine is not None:
            await engine.aclose()
        await memory.close()
        if isinstance(model, LocalEmbedder):  # a client that closes at once: the load ends before the exit
            await asyncio.to_thread(model.wait_loaded)


def run_stdio(settings: Settings, tenant: str) -> None:
    """`memstream mcp`: the MCP server of `tenant` on stdin/stdout until the client closes it."""

    async def main() -> None:
        async with stdio_parts(settings, tenant) as (server, _):
            await server.run_stdio_async()

    asyncio.run(main())
