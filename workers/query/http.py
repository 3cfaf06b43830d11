"""How the query worker's HTTP server (workers.query.server) answers bad input and load, as
aiohttp middlewares: every error body is JSON {"error": ...}, including aiohttp's own 404/405/413 (text by
default) and unexpected exceptions; requests beyond the in-flight cap are shed with 503 and
Retry-After; a body is read whole, once its key is known and before the request takes a slot (408
when it has not arrived in BODY_READ_TIMEOUT_S); a Redis that is down or whose connection pool
stays saturated is a 503, not a 500.

Probes (/healthz, /metrics) are never shed: a health check failing under load would get a busy
worker restarted.

Who may call what (`authorization`): every route but /healthz and the explorer's static files
(workers.query.page: they hold no data) needs `Authorization: Bearer <key>`
of a configured key (workers.query.auth) whose tenants include the tenant the request names and
whose scopes include what it does; 401 JSON without a known key, 403 JSON otherwise — decided
before the handler runs, so a refused request never reaches a lookup (a key for tenant A asking
for B's ids learns nothing from 404 vs 200). Each route declares its Need by name; a named
route without one is refused (500), so a new route cannot be served unprotected by accident."""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping, Union

from aiohttp import web

from store.errors import redis_unavailable
from topics import ContractError
from workers.query.auth import OPEN_ACCESS, SCOPE_MEANINGS, ApiKey, KeyRing

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
BODY_READ_TIMEOUT_S = 30.0  # how long a request's body may take to arrive, before it takes a slot
UNSHED_PATHS = ("/healthz", "/metrics")


# Compact JSON, the bodies the query worker has always sent from its routes (faust views before)
_dumps = functools.partial(json.dumps, separators=(",", ":"))


def json_response(value, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(value, status=status, headers=headers, dumps=_dumps)


def error_response(status: int, message: str, headers: dict | None = None) -> web.Response:
    """Every error body, the routes' and the middlewares': {"error": message}."""
    return json_response({"error": message}, status, headers)


@dataclass(frozen=True)
class Need:
    """What a request must be allowed: the tenant whose memory it reads or writes (None: no
    tenant's data, e.g. /metrics) and the scopes it needs, every one of them."""

    tenant: str | None
    scopes: tuple[str, ...] = ()


class Access(enum.Enum):
    OPEN = "open"


OPEN = Access.OPEN  # the Need of a route anyone may call: /healthz
# a route's Need: fixed, OPEN, or computed from the request (which may raise ContractError: a 400)
RouteNeed = Union[Need, Access, Callable[[web.Request], Awaitable[Need]]]
API_KEY = web.RequestKey(
    "memstream.api_key", ApiKey
)  # the request's key once authorized (OPEN_ACCESS without keys configured)


def refusal(key: ApiKey, need: Need) -> str | None:
    """Why `key` may not do what `need` says (the 403 message), else None."""
    if need.tenant is not None and not key.may_use(need.tenant):
        return f"API key {key.name!r} may not use tenant {need.tenant!r}"
    for scope in need.scopes:
        if scope not in key.scopes:
            return f"API key {key.name!r} lacks scope {scope!r}: needed to {SCOPE_MEANINGS[scope]}"
    return None


def authorization(keys: KeyRing | None, needs: Mapping[str, RouteNeed]):
    """The middleware enforcing API keys (None: none configured, every request is OPEN_ACCESS —
    the worker then listens on loopback only). `needs`: each named route's Need."""

    def unauthorized(message: str) -> web.Response:
        return error_response(401, message, {"WWW-Authenticate": 'Bearer realm="memstream"'})

    @web.middleware
    async def authorize(request: web.Request, handler):
        route_name = request.match_info.route.name
        need_of = needs.get(route_name) if route_name is not None else Need(None)  # unrouted: 404/405 to a known key
        if need_of is OPEN:
            return await handler(request)
        if need_of is None:
            return error_response(
                500, f"internal error: route {route_name!r} ({request.method} {request.path}) declares no Need"
            )
        if keys is None:
            key = OPEN_ACCESS
        else:
            scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return unauthorized(
                    f"{request.method} {request.path} needs an API key: send 'Authorization: Bearer <key>'"
                )
            found = keys.find(token.strip())
            if found is None:
                return unauthorized("unknown API key")
            key = found
        if request.body_exists:
            # read whole here, bounded, before a Need reads the tenant in it and before the
            # in-flight cap (shed_load) gives the request a slot (every later read is cached): a
            # client that sent its headers and stalled its body held a slot for good — aiohttp has
            # no body timeout — and max_inflight of them shed every later request (an audit)
            try:
                await asyncio.wait_for(request.read(), BODY_READ_TIMEOUT_S)
            except asyncio.TimeoutError:
                return error_response(408, f"the request's body did not arrive within {BODY_READ_TIMEOUT_S:.0f} s")
        try:
            need = need_of if isinstance(need_of, Need) else await need_of(request)
        except ContractError as exc:
            return error_response(400, str(exc))
        refused = refusal(key, need)
        if refused is not None:
            return error_response(403, refused)
        request[API_KEY] = key
        return await handler(request)

    return authorize


def middlewares(max_inflight: int, keys: KeyRing | None, needs: Mapping[str, RouteNeed]) -> list:
    """[JSON errors, API keys, in-flight cap], outermost first, for `web.Application.middlewares`
    (a refused request takes no in-flight slot)."""
    inflight = 0  # requests past the cap's check and not yet answered (one event loop: no lock)

    @web.middleware
    async def shed_load(request: web.Request, handler):
        nonlocal inflight
        if request.path in UNSHED_PATHS:
            return await handler(request)
        if inflight >= max_inflight:
            return error_response(
                503,
                f"the query worker is serving its limit of {max_inflight} requests (MEMSTREAM_QUERY_MAX_INFLIGHT); "
                f"retry after {RETRY_AFTER_S} s",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        inflight += 1
        try:
            return await handler(request)
        finally:
            inflight -= 1

    @web.middleware
    async def json_errors(request: web.Request, handler):
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            headers = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
            text = exc.text or ""
            generic = not text or text == f"{exc.status}: {exc.reason}"  # aiohttp's default body
            message = f"{exc.reason}: {request.method} {request.path}" if generic else text
            return error_response(exc.status, message, headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause = redis_unavailable(exc)
            if cause is not None:
                log.warning("%s %s: Redis unavailable: %s", request.method, request.path, cause)
                return error_response(
                    503,
                    f"the memory store is unavailable or saturated ({cause}); retry after {RETRY_AFTER_S} s",
                    {"Retry-After": str(RETRY_AFTER_S)},
                )
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, f"internal error: {type(exc).__name__}: {str(exc)[:300]}")

    return [json_errors, authorization(keys, needs), shed_load]
