"""Prometheus metrics of the workers (served on the query worker's /metrics)."""

from prometheus_client import Counter, Gauge, Histogram

MESSAGES = Counter("memstream_messages_total", "Messages processed per stage", ["stage"])
DEAD_LETTERS = Counter("memstream_dead_letters_total", "Messages sent to the dead-letter topic", ["topic"])
STAGE_SECONDS = Histogram("memstream_stage_seconds", "Time to process one message per stage", ["stage"])
QUERY_SECONDS = Histogram("memstream_query_seconds", "Time to answer one query", ["mode"])
OUTAGE_RETRIES = Counter(
    "memstream_outage_retries_total", "Retries while Redis or Kafka could not be reached", ["stage"]
)
OUTAGE_WAITING = Gauge("memstream_outage_waiting", "Messages waiting out a Redis or Kafka outage now", ["stage"])
FACT_EVENTS = Counter(
    "memstream_fact_events_total",
    "Events committed for indexed-facts, by event (activated, merged, retracted, retired, purged, ...)",
    ["event"],
)
CONFLICT_DECISIONS = Counter(
    "memstream_conflict_decisions_total",
    "Facts a group decision changed, by conflict kind and the status it gave (a decision made again after a stale read counts again)",
    ["kind", "status"],
)
FACTS_PROMOTED = Counter(
    "memstream_facts_promoted_total",
    "Pending facts sent to activation because their schema reached tau (counted when committed)",
)
SCHEMAS_PROMOTED = Counter(
    "memstream_schemas_promoted_total", "Schemas whose reaching tau released parked facts (counted when committed)"
)
EMBEDDING_CACHE = Counter(
    "memstream_embedding_cache_total", "Texts looked up in the shared embedding cache, by result", ["result"]
)
EXTRACTION_TEXTS = Counter(
    "memstream_extraction_texts_total",
    "Texts a chunk's extraction writes a vector of (its passage, entity names, facts, schemas), by where the vector "
    "came from: held (a record of the tenant holds it for that text: nothing embedded) or embedded (asked of the "
    "embedder: the shared cache, else the model; memstream_embedding_cache_total)",
    ["source"],
)
CONSUMER_LAG = Gauge(
    "memstream_consumer_lag",
    "Messages after the committed offset of a partition this worker holds (read every quarter of MEMSTREAM_STALL_SECONDS)",
    ["topic", "partition"],
)
STALLS = Counter(
    "memstream_consumer_stalls_total",
    "Held partitions with messages waiting that made no progress for MEMSTREAM_STALL_SECONDS, by what the worker did",
    ["action"],
)
OUTBOXES_SWEPT = Counter(
    "memstream_outboxes_swept_total", "Committed outboxes published by the sweep, not by their message"
)
CAUSE_NOT_IN_MEMORY = Counter(
    "memstream_cause_not_in_memory_total",
    "Messages whose cause (the decision that sent them) Redis lost, passed over until the stage upstream sends them again",
    ["stage"],
)
REWINDS = Counter(
    "memstream_recovery_rewinds_total",
    "Partitions read again from the first offset whose effects Redis lost (workers.recovery), by topic",
    ["topic"],
)
REDELIVERIES = Counter(
    "memstream_redeliveries_total", "Messages found committed or done before (a redelivery)", ["stage", "found"]
)
FENCED = Counter(
    "memstream_fenced_commits_total",
    "Commits discarded because another delivery of the message committed first",
    ["stage"],
)
STALE_DECISIONS = Counter(
    "memstream_stale_decisions_total",
    "Decisions made again because a fact they read changed before their commit",
    ["stage"],
)

# ---- grounding: model output the passages do not support (workers.algorithms.grounding) ----
UNGROUNDED_FACTS = Counter(
    "memstream_ungrounded_facts_total",
    "Extracted facts dropped: a name not in the passage, or over a length limit",
    ["reason"],
)
UNGROUNDED_ENTITIES = Counter(
    "memstream_ungrounded_entities_total",
    "Extracted entities dropped: not in the passage, or over the length limit",
    ["reason"],
)
DEMOTED_FACTS = Counter(
    "memstream_demoted_facts_total",
    "Facts whose category no sentence of their passage states, admitted as DECLARATIVE",
    ["category"],
)
UNGROUNDED_EVIDENCE = Counter(
    "memstream_ungrounded_evidence_total",
    "LLM resolver answers whose evidence sentence is not in the passage cited: the evidence policy decided",
)
DROPPED_CITATIONS = Counter(
    "memstream_dropped_citations_total", "Answer citations dropped: not ids of passages in the answer's context"
)
