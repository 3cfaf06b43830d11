"""`memstream query`, `alias`, `fact`, `facts`, `passage` and `mcp`: reading a tenant's memory —
over HTTP from the query worker, or from Redis directly — and its MCP server on stdio."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.error
import urllib.request

from ops.answer_format import format_answer, query_endpoint, read_answer
from ops.cli.numbers import whole_number
from topics import BadInput, tenant_or_default
from workers.query.modes import DEFAULT_MODE, MAX_TOP_K, mode_names, registered
from workers.settings import Settings


def add_parsers(sub) -> None:
    """Its commands' parsers, on the `memstream` parser's subparsers."""
    query = sub.add_parser("query", help="query the memory over HTTP")
    query.add_argument("text")
    query.add_argument("--tenant", default=None)
    query.add_argument(
        "--top-k", type=whole_number(MAX_TOP_K), default=None, help=f"passages to return, 1 to {MAX_TOP_K}"
    )
    query.add_argument(
        "--mode",
        choices=mode_names(),
        default=DEFAULT_MODE,
        help="; ".join(f"{mode.name}: {mode.hint}" for mode in registered()),
    )
    query.add_argument(
        "--as-of",
        default=None,
        metavar="TIME",
        help="answer from the memory as it was at this ISO 8601 time (e.g. 2026-05-01T12:00:00Z)",
    )
    query.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a retrieval parameter for this query (repeatable; VALUE as JSON: 0.5, false, 10), e.g. --param damping=0.7",
    )
    query.add_argument(
        "--answer", action="store_true", help="generate an answer with citations (the query worker needs an LLM)"
    )
    query.add_argument("--json", action="store_true", help="print the response body unchanged")
    query.add_argument(
        "--url", default=None, help="query endpoint base URL (default http://MEMSTREAM_HTTP_HOST:MEMSTREAM_HTTP_PORT)"
    )

    alias = sub.add_parser("alias", help="entity aliases of a tenant (applied to what is extracted afterwards)")
    alias.add_argument("action", choices=["add", "list"])
    alias.add_argument("names", nargs="*", metavar="NAME", help="add: ALIAS CANONICAL")
    alias.add_argument("--tenant", default=None)

    add_drilldown_commands(sub)
    mcp = sub.add_parser(
        "mcp",
        help="an MCP server of one tenant's memory on stdio, for agent frameworks (HTTP: /mcp of the query worker)",
    )
    mcp.add_argument(
        "--tenant", default=None, help="the one tenant this server reads and writes (default MEMSTREAM_TENANT)"
    )


# ---- drill-down: a fact, its evidence, a passage, the standing facts — what GET
# /v1/facts/{id}[/evidence], /v1/passages/{id} and /v1/facts?category= answer (workers.query.drilldown), read from Redis directly ---------------------
def add_drilldown_commands(sub) -> None:
    fact = sub.add_parser("fact", help="a fact of a tenant as JSON; --evidence: with the passages it came from")
    fact.add_argument("id", metavar="FACT_ID")
    fact.add_argument("--tenant", default=None)
    fact.add_argument("--evidence", action="store_true", help="also its passages, as published")
    facts = sub.add_parser(
        "facts", help="a tenant's standing facts as JSON (GET /v1/facts): constraints, rejected options, tool failures"
    )
    facts.add_argument("--tenant", default=None)
    facts.add_argument(
        "--category",
        action="append",
        default=None,
        help="categories, comma-separated or the flag repeated, as ?category= is "
        "(default: HARD_CONSTRAINT,REJECTED_OPTION,TOOL_FAILURE)",
    )
    facts.add_argument("--limit", default=None, help="at most this many facts, 1 to 500 (default 50)")
    passage = sub.add_parser("passage", help="a passage of a tenant as JSON (text, doc_id, metadata, context)")
    passage.add_argument("id", metavar="PASSAGE_ID")
    passage.add_argument("--tenant", default=None)
    passage.add_argument(
        "--text", action="store_true", help="write only its text: the published bytes, nothing appended"
    )


def query_params(pairs: list[str]) -> dict:
    """`--param NAME=VALUE` pairs as the request's "params": each VALUE read as JSON, else as a
    string (the query worker checks names and types)."""
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise BadInput(f"--param {pair!r}: expected NAME=VALUE, e.g. --param damping=0.7")
        try:
            params[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[name.strip()] = value
    return params


def cmd_query(settings: Settings, args) -> int:
    body = {
        "query": args.text,
        "tenant": tenant_or_default(args.tenant, settings.tenant),
        "top_k": settings.top_k if args.top_k is None else args.top_k,
        "mode": args.mode,
        "answer": args.answer,
    }
    if args.as_of is not None:
        body["as_of"] = args.as_of  # checked by the query worker, which says what is wrong
    if args.param:
        body["params"] = query_params(args.param)
    headers = {"Content-Type": "application/json"}
    if settings.api_key:  # MEMSTREAM_API_KEY: a query worker with keys configured needs one
        headers["Authorization"] = f"Bearer {settings.api_key}"
    request = urllib.request.Request(
        query_endpoint(settings, args.url), data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        print(f"memstream query: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(
            f"memstream query: cannot reach the query worker at {request.full_url} ({exc.reason}); is `memstream worker` running?",
            file=sys.stderr,
        )
        return 1
    result = read_answer(raw)
    if result.warning:
        print(f"memstream query: warning: {result.warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(raw.decode("utf-8"))
        return 0
    print(format_answer(result))
    return 0


def cmd_alias(settings: Settings, args) -> int:

    from store import Memory
    from workers.algorithms.normalize import entity_id

    tenant = tenant_or_default(args.tenant, settings.tenant)
    if args.action == "add" and len(args.names) != 2:
        raise BadInput("usage: memstream alias add ALIAS CANONICAL [--tenant T]")

    async def run() -> None:
        memory = Memory.from_url(settings.redis_url)
        try:
            if args.action == "add":
                await memory.add_alias(tenant, entity_id(args.names[0]), entity_id(args.names[1]))
            for alias_id, canonical in sorted((await memory.alias_map(tenant)).items()):
                print(f"{alias_id} -> {canonical}")
        finally:
            await memory.close()

    asyncio.run(run())
    return 0


def cmd_fact(settings: Settings, args) -> int:
    from workers.query import drilldown

    load = drilldown.fact_evidence if args.evidence else drilldown.fact_record
    return _drill(
        settings,
        args,
        "fact",
        lambda memory, tenant: load(memory, tenant, args.id),
        lambda found: _json_bytes(found.to_json()),
    )


def cmd_facts(settings: Settings, args) -> int:
    from workers.query import drilldown

    # --category A --category B,C: every one, as GET /v1/facts?category=A&category=B,C lists them
    categories, limit = drilldown.fact_filter(
        ",".join(args.category) if args.category else None, args.limit
    )  # ContractError: exit 2 with its message
    return _drill(
        settings,
        args,
        "facts",
        lambda memory, tenant: drilldown.standing_facts(memory, tenant, categories, limit),
        lambda found: _json_bytes(found.to_json()),
    )


def cmd_passage(settings: Settings, args) -> int:
    from workers.query import drilldown

    return _drill(
        settings,
        args,
        "passage",
        lambda memory, tenant: drilldown.passage_record(memory, tenant, args.id),
        lambda found: found.text.encode("utf-8") if args.text else _json_bytes(found.to_json()),
    )


def _drill(settings: Settings, args, what: str, load, render) -> int:
    """Load a record from Redis (`load(memory, tenant)`: a workers.query.drilldown record) and
    write `render(record)` to stdout as bytes; a missing record or an unreachable Redis: a
    message on stderr, exit 1."""

    from store import Memory
    from store.errors import redis_unavailable
    from workers.query import drilldown

    tenant = tenant_or_default(args.tenant, settings.tenant)

    async def run():
        memory = Memory.from_url(settings.redis_url)
        try:
            return await load(memory, tenant)
        finally:
            await memory.close()

    try:
        found = asyncio.run(run())
    except Exception as exc:
        if redis_unavailable(exc) is None:
            raise
        # the address, not the URL: it may hold a password
        print(f"memstream {what}: cannot reach Redis at {settings.redis_address} ({exc})", file=sys.stderr)
        return 1
    if found is None:
        print(f"memstream {what}: {drilldown.missing(f'{what} {args.id!r}', tenant)}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(render(found))
    sys.stdout.buffer.flush()
    return 0


def _json_bytes(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def cmd_mcp(settings: Settings, args) -> int:
    # stdout carries the protocol: every log line goes to stderr, configured before the SDK's own
    logging.basicConfig(
        level=settings.log_level_name, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from workers.query.mcp_server import run_stdio

    run_stdio(settings, tenant_or_default(args.tenant, settings.tenant))
    return 0


COMMANDS = {
    "query": cmd_query,
    "alias": cmd_alias,
    "fact": cmd_fact,
    "facts": cmd_facts,
    "passage": cmd_passage,
    "mcp": cmd_mcp,
}
