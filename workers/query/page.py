"""The explorer: a page of the query worker (GET / and /explore) that asks the API what a person
wants to see of a tenant's memory — a query's passages, facts and subgraph, a fact's evidence, an
entity's facts, the memory's counts and standing facts. Static files inside the package
(workers/query/explorer/: HTML, CSS, JS; no build step, nothing fetched from elsewhere), served
with a strict Content-Security-Policy: scripts and styles of this origin only, nothing inline.

The files hold no data: anyone who reaches the worker may load them (http.OPEN). Every call the
page makes goes to the API with the key entered in the page (kept in the tab's sessionStorage),
so it sees what that key may read and nothing else."""

from __future__ import annotations

import html
from pathlib import Path

from aiohttp import web

from workers.query import http
from workers.query.modes import registered

FILES = Path(__file__).parent / "explorer"
ASSETS = {"explorer.js": "text/javascript", "explorer.css": "text/css", "favicon.svg": "image/svg+xml"}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ROUTE_NAMES = ("explorer", "explorer_alias", "explorer_asset")


def _file(name: str, content_type: str) -> web.Response:
    return web.Response(body=(FILES / name).read_bytes(), content_type=content_type, charset="utf-8", headers=HEADERS)


MODES_MARK = "<!-- modes: the query worker writes the registered modes here (workers/query/page.py) -->"


def page_html() -> str:
    """index.html with the mode picker's choices: the registered modes (workers.query.modes),
    each titled with its hint — a mode added there is offered here with no edit of the page."""
    page = (FILES / "index.html").read_text(encoding="utf-8")
    options = "".join(
        f'<option value="{html.escape(m.name)}" title="{html.escape(m.hint)}">{html.escape(m.name)}</option>'
        for m in registered()
    )
    if MODES_MARK not in page:
        raise RuntimeError(f"{FILES / 'index.html'}: no mode picker mark {MODES_MARK!r}")
    return page.replace(MODES_MARK, options)


async def index(request: web.Request) -> web.Response:
    return web.Response(text=page_html(), content_type="text/html", charset="utf-8", headers=HEADERS)


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:  # only the files named here: no path is read from the request
        return http.error_response(404, f"no explorer file {name!r}")
    return _file(name, ASSETS[name])


def mount(app: web.Application, needs: dict[str, http.RouteNeed]) -> None:
    """The explorer's routes on `app`, open to all (`needs`: what the authorization reads)."""
    app.router.add_get("/", index, name="explorer")
    app.router.add_get("/explore", index, name="explorer_alias")
    app.router.add_get("/explorer/{name}", asset, name="explorer_asset")
    needs.update({name: http.OPEN for name in ROUTE_NAMES})
