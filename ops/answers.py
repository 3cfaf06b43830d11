"""The query worker's answers as `memstream query` and `make demo` show them, and where to ask."""

from __future__ import annotations

from workers.settings import Settings


def query_endpoint(settings: Settings, url: str | None = None) -> str:
    return (url or f"http://{settings.http_host}:{settings.http_port}").rstrip("/") + "/v1/query"


def format_answer(result: dict) -> str:
    how = result["mode"] + (f" → {result['fallback']} fallback" if result.get("fallback") else "")
    lines = [
        f"query: {result['query']}  (tenant {result['tenant']}, {how}, graph v{result['graph_version']}, {result['timings_ms']['total']:.0f} ms)"
    ]
    for rank, p in enumerate(result["passages"], 1):
        text = " ".join(p["text"].split())
        lines.append(f"  {rank}. [{p['score']:.3f}] {p['doc_id']}: {text[:110]}{'…' if len(text) > 110 else ''}")
    if result["facts"]:
        lines.append(
            "  facts: " + "; ".join(f"({f['head']}, {f['relation']}, {f['tail']})" for f in result["facts"][:5])
        )
    if result.get("answer"):
        lines.append(f"  answer: {result['answer']['text']}  [{', '.join(result['answer']['citations'])}]")
    return "\n".join(lines)
