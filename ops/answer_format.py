"""The query worker's answers as `memstream query` and `make demo` show them, and where to ask."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from topics import BadInput
from workers.settings import Settings

if TYPE_CHECKING:
    from workers.query.answers import QueryResult


def query_endpoint(settings: Settings, url: str | None = None) -> str:
    """POST /v1/query's address at `url` (--url), else at MEMSTREAM_HTTP_HOST:MEMSTREAM_HTTP_PORT;
    BadInput for a `url` that is not an http(s) address (urllib raised a bare ValueError)."""
    if url is not None:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- its check: a port out of range or not a number
        except ValueError as exc:
            raise BadInput(f"--url {url!r} is not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInput(f"--url {url!r} is not a URL: expected http://HOST:PORT or https://HOST:PORT")
    return (url or f"http://{settings.http_host}:{settings.http_port}").rstrip("/") + "/v1/query"


def read_answer(raw: bytes) -> QueryResult:
    """An HTTP answer read back into the type the query worker built it from (pydantic, imported
    here so that the CLI's other commands start without it)."""
    from workers.query.answers import QueryResult

    return QueryResult.model_validate_json(raw)


def format_answer(result: QueryResult) -> str:
    how = result.mode + (f" → {result.fallback} fallback" if result.fallback else "")
    total = (result.timings_ms or {}).get("total", 0.0)
    lines = [f"query: {result.query}  (tenant {result.tenant}, {how}, graph v{result.graph_version}, {total:.0f} ms)"]
    for rank, p in enumerate(result.passages, 1):
        text = " ".join(p.text.split())
        lines.append(f"  {rank}. [{p.score:.3f}] {p.doc_id}: {text[:110]}{'…' if len(text) > 110 else ''}")
    if result.facts:
        lines.append("  facts: " + "; ".join(f"({f.head}, {f.relation}, {f.tail})" for f in result.facts[:5]))
    if result.answer:
        lines.append(f"  answer: {result.answer.text}  [{', '.join(result.answer.citations)}]")
    return "\n".join(lines)
