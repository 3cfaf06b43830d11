"""The Grafana dashboard (ops/grafana/dashboards/memstream.json, provisioned by
docker-compose.yml) asks Prometheus only for metrics the workers export: every metric name in
its queries is one workers/metrics.py declares (a histogram's _bucket/_sum/_count, a counter's
_total as exported), so a renamed metric fails here instead of leaving a panel empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import workers.metrics  # noqa: F401  (declares the metrics in the default registry)
import workers.models.llm  # noqa: F401  (the LLM client's)
import workers.tenant_metrics  # noqa: F401  (the query worker's census)

ROOT = Path(__file__).resolve().parent.parent


SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("_sum", "_count", ""),
}


def exported_names() -> set[str]:
    """The sample names each declared metric exports (a labelled one has no sample until used)."""
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("memstream_")
        for suffix in SUFFIXES.get(family.type, ("",))
    }


def test_every_metric_the_dashboard_queries_is_exported():
    dashboard = json.loads((ROOT / "ops/grafana/dashboards/memstream.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert exprs, "a dashboard without queries"
    queried = {word for expr in exprs for word in re.findall(r"[a-z_]+", expr) if word.startswith("memstream_")}
    assert queried and queried <= exported_names(), sorted(queried - exported_names())


def test_compose_provisions_the_dashboard_and_prometheus_scrapes_every_role():
    compose = (ROOT / "docker-compose.yml").read_text()
    assert (
        "./ops/grafana/dashboards:/var/lib/grafana/dashboards" in compose
        and "./ops/grafana/provisioning:/etc/grafana/provisioning" in compose
    )
    scraped = (ROOT / "ops/prometheus.yml").read_text()
    assert all(f"{role}:9100" in scraped for role in ("chunker", "extractor", "detector", "resolver", "query"))
