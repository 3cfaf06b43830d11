"""The explorer page (workers/query/page.py, workers/query/explorer/) in a real browser: Debian's
chromium driven by Playwright (tests/browser.py), against the real query application
(workers.query.server.query_app) served on a port over the test stack's Redis, holding a small
memory written through the store (tests/test_query_server.write_memory) with one passage that
carries markup. The page must load with no console error, render a query's passages and
subgraph, show a fact's evidence byte for byte, render the markup as text without running it, and
with API keys configured show the 401 until a key is entered. A screenshot after a query is
saved as tests/artifacts/explorer.png."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from ops.stack.services import free_port
from tests.browser import chromium_path
from tests.test_query_server import PASSAGES, ExactEmbedder, write_memory
from workers.settings import Settings

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).parent / "artifacts"
MARKUP = "Mallory left <script>alert(1)</script> and <img src=x onerror=alert(2)> on the Evil Page & more."
CORPUS = {**PASSAGES, "evil": ("Mallory", "defaces", "Evil Page", MARKUP)}
KEY = "ms_explorer-test-key"
QUERY = "Who runs the Tarn Mill?"


class Served:
    """query_app on 127.0.0.1:<free port>, in a thread with its own event loop, until stop()."""

    def __init__(self, settings: Settings, embedder):
        from workers.query.server import query_app, serve

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None

        async def main() -> None:
            self.stop_event = asyncio.Event()
            await serve(query_app(settings, embedder), "127.0.0.1", self.port, self.stop_event)

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.base + "/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or not self.thread.is_alive():
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        stop_event = self.stop_event
        if stop_event is not None:
            self.loop.call_soon_threadsafe(stop_event.set)
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def memory(stack_env):
    tenant = f"explorer-{uuid.uuid4().hex[:8]}"
    written = asyncio.run(write_memory(stack_env["MEMSTREAM_REDIS_URL"], tenant, passages=CORPUS))
    return stack_env["MEMSTREAM_REDIS_URL"], tenant, written


def serving(memory, **settings_fields) -> Served:
    redis_url, tenant, written = memory
    settings = Settings(redis_url=redis_url, tenant=tenant, **settings_fields)
    return Served(settings, ExactEmbedder(written["mill"]["vector"]))


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


class Watched:
    """A page with what it did: console errors, dialogs opened, requests made, CSP refusals."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 1100})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

        def dialog(d) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", dialog)

    def ask(self, text: str, mode: str = "ppr", top_k: int = 4) -> None:
        page = self.page
        page.fill("#query", text)
        page.select_option("#mode", mode)
        page.fill("#top-k", str(top_k))
        page.click("#query-form button[type=submit]")

    def close(self) -> None:
        self.context.close()


def test_the_explorer_queries_draws_and_shows_evidence_as_text(memory, browser):
    from playwright.sync_api import expect

    redis_url, tenant, written = memory
    served = serving(memory)
    watched = Watched(browser)
    page = watched.page
    try:
        response = page.goto(served.base + "/")
        assert response is not None and response.status == 200
        csp = response.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "'unsafe-inline'" not in csp
        page.wait_for_selector("#layers tr")  # the glance panel polled /v1/overview
        layers = dict(
            zip(
                page.locator("#layers td:nth-child(1)").all_text_contents(),
                page.locator("#layers td.n").all_text_contents(),
            )
        )
        assert layers["passages"] == str(len(CORPUS)) and layers["facts"] == str(len(CORPUS))
        page.wait_for_selector("#newest li .fact-link")
        assert page.locator("#newest .fact-link").count() == len(CORPUS)

        watched.ask(QUERY)
        page.wait_for_selector("#passages li")
        texts = page.locator("#passages .passage-text").all_text_contents()
        assert texts[0] == PASSAGES["mill"][3]  # the passage embedded as the query is
        assert set(texts) <= {c[3] for c in CORPUS.values()} and MARKUP in texts
        # the subgraph: a node per passage, fact and entity, linked
        page.wait_for_selector("#graph circle.fact")
        assert page.locator("#graph circle.passage").count() >= len(texts)
        assert page.locator("#graph circle.entity").count() >= 2
        assert page.locator("#graph line").count() >= 2

        # the markup passage rendered as text: its element holds no element, nothing ran, nothing fetched x
        markup = page.locator("#passages li", has_text="Mallory left").locator(".passage-text")
        assert markup.evaluate("n => n.children.length") == 0
        assert markup.evaluate("n => n.textContent") == MARKUP
        assert page.locator("#passages img, #passages script").count() == 0

        # a fact's evidence, byte for byte
        evil_fact = written["evil"]["fact"]
        page.click(f"#graph g[data-kind=fact][data-id='{evil_fact}'] circle")
        page.wait_for_selector("#evidence li")
        assert page.locator("#evidence .passage-text").all_text_contents() == [MARKUP]
        # an entity expands to the facts naming it
        page.click("#graph g[data-kind=entity] circle >> nth=0")
        expect(page.locator("#graph-state")).to_contain_text(" facts")  # (no wait_for_function: the CSP refuses eval)

        page.wait_for_timeout(300)
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "explorer.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000

        # reconstruct: its path step by step, cue → tag → content
        watched.ask(QUERY, mode="reconstruct")
        page.wait_for_selector("#path-box:not([hidden]) #path li")
        first = page.locator("#path li").first
        text = first.text_content() or ""
        assert text.startswith("cue Tarn Mill (entity) → tag ")
        # a passage read is named by its document and text, not its hash, and opens on a click
        read = first.locator(f".passage-link[data-passage='{written['mill']['passage']}']")
        assert (read.text_content() or "").startswith("mill: Oskar Lind runs the Tarn Mill")
        assert written["mill"]["passage"] not in text and "; tag " in text and ", chain " in text
        read.click()
        expect(page.locator("#detail-title")).to_have_text("Passage")
        expect(page.locator("#detail .passage-text")).to_have_text(PASSAGES["mill"][3])

        # a passage in the answer's list opens on a click too; passage nodes are labelled by document
        watched.ask(QUERY)
        page.wait_for_selector("#graph circle.fact")
        assert "mill" in page.locator("#graph text.passage").all_text_contents()
        page.click("#passages li >> nth=1 >> .passage-link")
        second = page.locator("#passages li >> nth=1 >> .passage-text").text_content()
        expect(page.locator("#detail .passage-text")).to_have_text(second or "")

        # another tenant: nothing of this one's answer stays on screen under its name
        page.fill("#tenant", f"other-{tenant}")
        page.locator("#tenant").dispatch_event("change")
        expect(page.locator("#passages li")).to_have_count(0)
        expect(page.locator("#graph circle")).to_have_count(0)
        assert page.is_hidden("#detail-box") and (page.text_content("#graph-state") or "") == ""
        assert (page.text_content("#query-state") or "") == ""
        assert watched.dialogs == []
        assert not [u for u in watched.requests if u.rstrip("/").endswith("/x") or "/x?" in u]
        assert watched.errors == []
    finally:
        watched.close()
        served.stop()


def test_the_explorer_with_keys_shows_the_401_then_works_with_a_key(memory, browser):
    redis_url, tenant, written = memory
    keys = [
        {
            "name": "explorer",
            "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(),
            "tenants": [tenant],
            "scopes": ["read"],
        }
    ]
    served = serving(memory, api_keys=json.dumps(keys))
    watched = Watched(browser)
    page = watched.page
    try:
        response = page.goto(f"{served.base}/explore?tenant={tenant}")
        assert response is not None and response.status == 200  # the page itself needs no key
        assert page.input_value("#tenant") == tenant
        watched.ask(QUERY, mode="dense")
        page.wait_for_selector("#error:not([hidden])")
        assert page.text_content("#error").startswith("401: ")
        assert page.locator("#passages li").count() == 0

        page.fill("#key", KEY)
        page.click("#key-form button[type=submit]")
        assert page.evaluate("sessionStorage.getItem('memstream.api_key')") == KEY
        watched.ask(QUERY, mode="dense")
        page.wait_for_selector("#passages li")
        assert page.locator("#passages .passage-text").first.text_content() == PASSAGES["mill"][3]
        assert page.is_hidden("#error")
        # the key stays for the tab: a reload still works
        page.reload()
        watched.ask(QUERY, mode="dense")
        page.wait_for_selector("#passages li")
        page.click("#passages li >> nth=0 >> .passage-link")
        page.wait_for_selector("#detail-box:not([hidden])")
        # the key forgotten, a 401: the answer and the passage shown before are gone with it
        page.click("#forget-key")
        watched.ask(QUERY, mode="dense")
        page.wait_for_selector("#error:not([hidden])")
        assert page.text_content("#error").startswith("401: ")
        assert page.locator("#passages li").count() == 0 and page.is_hidden("#detail-box")
        assert page.locator("#graph circle").count() == 0 and page.locator("#layers tr").count() == 0
        assert watched.dialogs == []
        # the only errors are the 401s answered before the key was entered
        assert all("401" in e for e in watched.errors), watched.errors
    finally:
        watched.close()
        served.stop()
