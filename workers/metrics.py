"""Prometheus metrics of the workers (served on the query worker's /metrics)."""

from prometheus_client import Counter, Histogram

MESSAGES = Counter("memstream_messages_total", "Messages processed per stage", ["stage"])
DEAD_LETTERS = Counter("memstream_dead_letters_total", "Messages sent to the dead-letter topic", ["topic"])
STAGE_SECONDS = Histogram("memstream_stage_seconds", "Time to process one message per stage", ["stage"])
QUERY_SECONDS = Histogram("memstream_query_seconds", "Time to answer one query", ["mode"])
