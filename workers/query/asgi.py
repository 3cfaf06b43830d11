"""An ASGI application as an aiohttp handler, so the query worker serves the MCP SDK's streamable
HTTP endpoint (an ASGI app) on its own address, next to /v1/query, with one server and one
port. Only what the MCP endpoint needs: HTTP requests (no websockets, no lifespan events: the
owner runs the app's lifespan itself), the body given whole (read by http.authorization, bounded), the
response streamed out."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, MutableMapping

from aiohttp import web

from workers.query import http

# as Starlette types them (Scope and Message are MutableMapping[str, Any])
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]
ASGI_API_KEY = "memstream_api_key"  # scope["state"] entry: the request's auth.ApiKey (None: not authorized)


def asgi_handler(app: ASGIApp) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler that runs `app` for each request."""

    async def handle(request: web.Request) -> web.StreamResponse:
        scope = _scope(request)
        answered = asyncio.Event()  # the handler is done: the app's receive() reports a disconnect
        response: web.StreamResponse | None = None
        body_read = False

        async def receive() -> Message:
            nonlocal body_read
            if not body_read:  # read whole (and bounded) by the API-key middleware, http.authorization
                body_read = True
                return {"type": "http.request", "body": await request.read(), "more_body": False}
            await answered.wait()  # an app that listens for a disconnect hears one once the response ends
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal response
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
            elif message["type"] == "http.response.body":
                if response is None:
                    raise RuntimeError("ASGI app sent a body before http.response.start")
                if not response.prepared:
                    await response.prepare(request)
                # a HEAD's response has headers only: a body after them is read as the next
                # response on a kept-alive connection (StreamResponse.write sends what it is given)
                if message.get("body") and request.method != "HEAD":
                    await response.write(message["body"])
                if not message.get("more_body", False):
                    await response.write_eof()

        try:
            await app(scope, receive, send)
        finally:
            answered.set()
        if response is None:
            return http.error_response(500, f"internal error: {request.method} {request.path} sent no response")
        if not response.prepared:  # a start without a body message: an empty body
            await response.prepare(request)
            await response.write_eof()
        return response

    return handle


def _scope(request: web.Request) -> dict[str, Any]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport else None
    host = transport.get_extra_info("sockname") if transport else None
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.rel_url.raw_path.encode("latin-1"),
        "query_string": request.rel_url.raw_query_string.encode("latin-1"),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(host[:2]) if isinstance(host, tuple) else None,
        # what the middlewares decided, for the app's handlers (MCP tools check the key's scopes)
        "state": {ASGI_API_KEY: request.get(http.API_KEY)},
    }
