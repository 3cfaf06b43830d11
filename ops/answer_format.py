"""The query worker's answers as `memstream query` and `make demo` show them, and where to ask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.settings import Settings

if TYPE_CHECKING:
    from workers.query.answers import QueryResult


def query_endpoint(settings: Settings, url: str | None = None) -> str:
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
