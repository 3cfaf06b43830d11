"""How the query worker's HTTP server (workers.query.server) answers bad input and load, as
aiohttp middlewares: every error body is JSON {"error": ...}, including aiohttp's own 404/405/413 (text by
default) and unexpected exceptions; requests beyond the in-flight cap are shed with 503 and
Retry-After; a Redis that is down or whose connection pool stays saturated is a 503, not a 500.

Probes (/healthz, /metrics) are never shed: a health check failing under load would get a busy
worker restarted."""

from __future__ import annotations

import asyncio
import functools
import json
import logging

from aiohttp import web

from store.errors import redis_unavailable

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
UNSHED_PATHS = ("/healthz", "/metrics")


# Compact JSON, the bodies the query worker has always sent from its routes (faust views before)
_dumps = functools.partial(json.dumps, separators=(",", ":"))


def json_response(value, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.json_response(value, status=status, headers=headers, dumps=_dumps)


def error_response(status: int, message: str, headers: dict | None = None) -> web.Response:
    """Every error body, the routes' and the middlewares': {"error": message}."""
    return json_response({"error": message}, status, headers)


def middlewares(max_inflight: int) -> list:
    """[JSON errors, in-flight cap], outermost first, for `web.Application.middlewares`."""
    inflight = 0  # requests past the cap's check and not yet answered (one event loop: no lock)

    @web.middleware
    async def shed_load(request: web.Request, handler):
        nonlocal inflight
        if request.path in UNSHED_PATHS:
            return await handler(request)
        if inflight >= max_inflight:
            return error_response(503, f"the query worker is serving its limit of {max_inflight} requests (MEMSTREAM_QUERY_MAX_INFLIGHT); "
                                       f"retry after {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)})
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
            generic = not exc.text or exc.text == f"{exc.status}: {exc.reason}"  # aiohttp's default body
            message = f"{exc.reason}: {request.method} {request.path}" if generic else exc.text
            return error_response(exc.status, message, headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            cause = redis_unavailable(exc)
            if cause is not None:
                log.warning("%s %s: Redis unavailable: %s", request.method, request.path, cause)
                return error_response(503, f"the memory store is unavailable or saturated ({cause}); retry after {RETRY_AFTER_S} s",
                                      {"Retry-After": str(RETRY_AFTER_S)})
            log.exception("%s %s failed", request.method, request.path)
            return error_response(500, f"internal error: {type(exc).__name__}: {str(exc)[:300]}")

    return [json_errors, shed_load]
