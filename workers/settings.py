"""Settings from `MEMSTREAM_*` environment variables (docs/configuration.md lists them all)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Literal, cast

from topics import Topics
from workers.algorithms.expiry import parse_ttl_setting
from workers.algorithms.reconstruction import DEFAULT_PASSAGES, DEFAULT_STEPS, DEFAULT_TOKENS


def _home() -> Path:
    return Path(os.environ.get("MEMSTREAM_HOME", Path.home() / ".memstream"))


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_LEVELS: tuple[LogLevel, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=_home)
    kafka_port: int = 19092
    redis_port: int = 16379
    kafka_bootstrap: str = ""  # default: 127.0.0.1:<kafka_port>
    redis_url: str = ""  # default: redis://127.0.0.1:<redis_port>/0
    topic_namespace: str = "memstream"
    app_id: str = "memstream"
    partitions: int = 4
    tenant: str = "default"
    extractor: str = "rules"  # rules | replay | llm
    replay_file: str = ""
    embedder: str = "local"  # local | openai (MEMSTREAM_EMBEDDER_* below)
    vector_index: str = "flat"  # flat | hnsw, for indexes created from now on
    llm_base_url: str = ""
    llm_api_key: str = ""
    llm_model: str = ""
    llm_concurrency: int = 8
    llm_timeout: float = 60.0
    max_text_bytes: int = 1 << 20
    chunk_tokens: int = 200
    chunk_overlap: int = 40
    http_host: str = "127.0.0.1"
    http_port: int = 8765
    metrics_port: int = 0  # >0: serve /metrics there (on metrics_host), on every worker
    tau: int = 2  # schema stability threshold (distinct supporting passages)
    delta: float = 0.9  # fact-embedding cosine above which two facts conflict (near-duplicates)
    sim_edge: float = 0.8  # entity cosine for a similarity bridge edge
    resolver: str = "rules"  # rules | llm
    # ablation switches (on|off)
    schema_filter: str = "on"
    conflicts: str = "on"
    sim_bridging: str = "on"
    type_bridging: str = "on"
    top_k: int = 5
    graph_cache_edges: int = 5_000_000  # graph edges one query worker keeps, over all tenants
    query_max_inflight: int = 64  # HTTP requests one query worker serves at once; more get 503 + Retry-After
    redis_pool_timeout: float = 10.0  # seconds a query waits for a free Redis connection before a 503
    session_timeout: int = 10  # seconds before a dead worker's partitions move
    outage_deadline: float = 300.0  # seconds a message waits out a Redis/Kafka outage before it is dead-lettered
    outbox_sweep_interval: float = 30.0  # seconds between sweeps for committed, unpublished outboxes
    stall_seconds: float = (
        60.0  # a held partition with messages waiting and no progress this long is stalled (workers.liveness)
    )
    log_level: str = "info"
    # query mode reconstruct (workers.query.reconstruct): the router and the default budget of a walk
    router: str = "similarity"  # similarity | llm (the LLM at MEMSTREAM_LLM_*)
    reconstruct_steps: int = DEFAULT_STEPS
    reconstruct_passages: int = DEFAULT_PASSAGES
    reconstruct_tokens: int = DEFAULT_TOKENS
    # ---- the embeddings endpoint (MEMSTREAM_EMBEDDER=openai; workers.models.embedding.OpenAIEmbedder) ----
    embedder_base_url: str = ""  # any OpenAI-compatible /v1 (OpenAI, vLLM, TEI)
    embedder_model: str = ""
    embedder_api_key: str = ""
    embedder_dims: int = 0  # >0: sent as `dimensions` and checked; 0: the server's size, asked once at start
    embedder_batch: int = 256  # texts per request
    embedder_concurrency: int = 4  # requests in flight per process
    embedder_timeout: float = 30.0  # seconds per request before it is retried
    # ---- time in memory (workers.algorithms.expiry) ----
    ttl_seconds: str = ""  # per fact category: "TOOL_FAILURE=86400,DECLARATIVE=0" (0 or absent: never expires)
    expiry_sweep_interval: float = 60.0  # seconds between sweeps that expire lapsed facts (resolver workers)
    # ---- API keys (workers.query.auth; loaded and checked when a query worker starts) ----
    api_keys_file: str = ""  # JSON list of {"name", "key_sha256", "tenants", "scopes"}; none: no keys, loopback only
    api_keys: str = ""  # the same list inline (not with api_keys_file)
    api_key: str = ""  # the key `memstream query` sends (Authorization: Bearer)
    metrics_host: str = "127.0.0.1"  # where MEMSTREAM_METRICS_PORT serves /metrics (any role), without a key
    metrics_top_tenants: int = 10  # tenants with labels of their own in the per-tenant gauges (workers.tenant_metrics)
    metrics_census_seconds: float = 60.0  # how often the query worker counts every tenant's records for them

    @property
    def log_level_name(self) -> LogLevel:
        """MEMSTREAM_LOG_LEVEL as logging and the MCP server name it ("INFO"), checked at start."""
        return cast(LogLevel, self.log_level.upper())

    def __post_init__(self):
        if not self.kafka_bootstrap:
            object.__setattr__(self, "kafka_bootstrap", f"127.0.0.1:{self.kafka_port}")
        if not self.redis_url:
            object.__setattr__(self, "redis_url", f"redis://127.0.0.1:{self.redis_port}/0")
        if self.extractor not in ("rules", "replay", "llm"):
            raise ValueError(f"MEMSTREAM_EXTRACTOR={self.extractor!r}: expected rules, replay or llm")
        for switch in ("schema_filter", "conflicts", "sim_bridging", "type_bridging"):
            if getattr(self, switch) not in ("on", "off"):
                raise ValueError(f"MEMSTREAM_{switch.upper()}={getattr(self, switch)!r}: expected on or off")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"MEMSTREAM_LOG_LEVEL={self.log_level!r}: expected one of {', '.join(LOG_LEVELS).lower()}")
        if self.vector_index not in ("flat", "hnsw"):
            raise ValueError(f"MEMSTREAM_VECTOR_INDEX={self.vector_index!r}: expected flat or hnsw")
        if self.resolver not in ("rules", "llm"):
            raise ValueError(f"MEMSTREAM_RESOLVER={self.resolver!r}: expected rules or llm")
        if not 0 <= self.chunk_overlap < self.chunk_tokens:
            raise ValueError("MEMSTREAM_CHUNK_OVERLAP must be >= 0 and below MEMSTREAM_CHUNK_TOKENS")
        if self.router not in ("similarity", "llm"):
            raise ValueError(f"MEMSTREAM_ROUTER={self.router!r}: expected similarity or llm")
        if self.query_max_inflight < 1 or not self.redis_pool_timeout > 0:
            raise ValueError("MEMSTREAM_QUERY_MAX_INFLIGHT must be >= 1 and MEMSTREAM_REDIS_POOL_TIMEOUT > 0")
        self._check_time_settings()
        self._check_embedder_settings()

    def _check_embedder_settings(self) -> None:
        if self.embedder not in ("local", "openai"):
            raise ValueError(f"MEMSTREAM_EMBEDDER={self.embedder!r}: expected local or openai")
        if (
            self.embedder_dims < 0
            or self.embedder_batch < 1
            or self.embedder_concurrency < 1
            or not self.embedder_timeout > 0
        ):
            raise ValueError(
                "MEMSTREAM_EMBEDDER_DIMS must be >= 0, MEMSTREAM_EMBEDDER_BATCH and MEMSTREAM_EMBEDDER_CONCURRENCY >= 1, "
                "MEMSTREAM_EMBEDDER_TIMEOUT > 0"
            )

    def _check_time_settings(self) -> None:
        parse_ttl_setting(self.ttl_seconds)  # ValueError naming the setting, at start (kept by _category_ttls)
        if not self.stall_seconds > 0:
            raise ValueError("MEMSTREAM_STALL_SECONDS must be > 0")
        if self.metrics_top_tenants < 0 or not self.metrics_census_seconds > 0:
            raise ValueError("MEMSTREAM_METRICS_TOP_TENANTS must be >= 0 and MEMSTREAM_METRICS_CENSUS_SECONDS > 0")
        if not self.expiry_sweep_interval > 0:
            raise ValueError("MEMSTREAM_EXPIRY_SWEEP_INTERVAL must be > 0")

    @cached_property  # not a field: from_env and the settings docs read every field as a MEMSTREAM_* variable
    def _category_ttls(self) -> dict[str, int]:
        return parse_ttl_setting(self.ttl_seconds)

    @property
    def category_ttls(self) -> dict[str, int]:
        """MEMSTREAM_TTL_SECONDS as {category: seconds}, validated at start."""
        return dict(self._category_ttls)

    def on(self, switch: str) -> bool:
        return getattr(self, switch) == "on"

    @property
    def effective_tau(self) -> int:
        return self.tau if self.on("schema_filter") else 1

    def llm_config(self):
        from workers.models.llm import LLMConfig

        if not self.llm_base_url or not self.llm_model:
            raise ValueError("the llm extractor/resolver needs MEMSTREAM_LLM_BASE_URL and MEMSTREAM_LLM_MODEL")
        return LLMConfig(self.llm_base_url, self.llm_api_key, self.llm_model, self.llm_concurrency, self.llm_timeout)

    def embedder_config(self):
        from workers.models.embedding import EndpointConfig

        if not self.embedder_base_url or not self.embedder_model:
            raise ValueError("MEMSTREAM_EMBEDDER=openai needs MEMSTREAM_EMBEDDER_BASE_URL and MEMSTREAM_EMBEDDER_MODEL")
        return EndpointConfig(
            self.embedder_base_url,
            self.embedder_api_key,
            self.embedder_model,
            self.embedder_dims,
            self.embedder_batch,
            self.embedder_concurrency,
            self.embedder_timeout,
        )

    @property
    def max_message_bytes(self) -> int:
        """Largest Kafka message memstream produces or accepts: a document at the text limit
        (JSON-escaped), or a dead letter carrying one."""
        return 4 * self.max_text_bytes + (1 << 20)

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_namespace)

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "Settings":
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(f"MEMSTREAM_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            kind = {"int": int, "float": float, "Path": Path}.get(
                f.type if isinstance(f.type, str) else f.type.__name__, str
            )
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"MEMSTREAM_{f.name.upper()}={raw!r}: expected {kind.__name__}") from None
        values.update(overrides)
        return cls(**values)
