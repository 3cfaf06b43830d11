"""The one producer of a client's messages onto memstream's topics: documents, their deletions
and erasures (`memstream.documents`, keyed tenant/doc id so the compacted topic keeps a
document's last word), fact retractions for the resolver (`memstream.conflict-sets`) and a
tenant's purge event (`memstream.indexed-facts`). The CLI (`publish`, `delete`, `retract`,
`tenant delete --purge`), the HTTP server (POST /v1/facts/{id}/retract) and the MCP tools
(remember, forget, retract_fact) all send through it, so how a client message is made and sent is
written once: kafka-python with acks from all in-sync replicas and idempotence (a retried send is
written once), every delivery awaited, a refusal a PublishError saying what Kafka did not take.

Not the workers' own output: their stages' messages go through the outbox (store) and the
stage graph (topics.graph)."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import TYPE_CHECKING, Callable, Iterable

from store.facts import Fact
from topics import CandidateFact, ConflictSet, ContractError, Document, DocumentDeletion, FactEvent, encode
from workers.envelope import Emit
from workers.settings import Settings

if TYPE_CHECKING:
    from kafka import KafkaProducer

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 10.0  # connecting to Kafka and the broker's ack of one message (the query worker's)


class PublishError(RuntimeError):
    """Kafka did not take a message (no broker, a timeout, a refusal): nothing after it was sent."""


def fact_probe(tenant: str, fact: Fact, why: str) -> CandidateFact:
    """The candidate an adjudication names when no extracted fact caused it (an expiry, a
    retraction): the fact itself, at its first passage (or its id when none is left). `why`
    stands as its extractor."""
    return CandidateFact(
        tenant=tenant,
        passage_id=(fact.passage_ids or [fact.id])[0],
        doc_id="",
        fact=fact.triple(),
        fact_index=0,
        chunk_fact_count=1,
        head_id=fact.head_id,
        tail_id=fact.tail_id,
        extractor=why,
    )


# A caller's reason is kept with the fact and told in its `retracted` event: a sentence or a
# paragraph. A reason of megabytes went into Redis and every subscriber's event, or past Kafka's
# message size, where the API answered 503 for what was bad input (a review).
MAX_REASON_CHARS = 2000


def check_reason(reason: str) -> str:
    """A caller's reason for a retraction, checked as the resolver's decode of the ConflictSet
    checks it (ContractError naming 'reason'): a NUL in it was queued (202) and dead-lettered, a
    lone surrogate a 500; and at most MAX_REASON_CHARS long."""
    if len(reason) > MAX_REASON_CHARS:
        raise ContractError(f"'reason' is {len(reason):,} characters; at most {MAX_REASON_CHARS:,}")
    ConflictSet.check_field("reason", reason, "'reason'")
    return reason


def retraction(tenant: str, fact: Fact, reason: str, request_id: str) -> Emit:
    """Work for the resolver: retract `fact` as a caller asked (one request: `request_id`)."""
    record = ConflictSet(
        tenant=tenant,
        kind="retract",
        candidate=fact_probe(tenant, fact, "request"),
        fact_id=fact.id,
        conflicting=[],
        passage_ids=[],
        work_id=f"retract:{fact.id}:{request_id}",
        reason=reason,
    )
    return Emit.of(record)  # keyed by the fact's head: its probe's head_id


# (topic, key, value or None for a tombstone, what it is — for a PublishError's message)
Message = tuple[str, str, bytes | None, str]


class ClientPublisher:
    """Sends a client's messages. The producer is made on first use and dropped after a failure,
    so the next call connects afresh; the async methods send on a thread, off the event loop.
    `linger_ms`: how long a batch waits to fill (a bulk publish's; one message need not wait)."""

    def __init__(self, settings: Settings, timeout_s: float = PUBLISH_TIMEOUT_S, linger_ms: int = 0):
        self.settings = settings
        self.timeout_s = timeout_s
        self.linger_ms = linger_ms
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()

    # ---- the messages ---------------------------------------------------------------------
    def document_messages(self, documents: Iterable[Document]) -> list[Message]:
        return [(self.settings.topics.documents, doc.key, encode(doc), f"document {doc.doc_id!r}") for doc in documents]

    def deletion_messages(self, tenant: str, doc_ids: Iterable[str], purge: bool = False) -> list[Message]:
        """A tombstone per document (no value, its key): the workers take it out of memory —
        with `purge`, its erasure first, under the same key (the chunker erases it from Redis)."""
        out: list[Message] = []
        for doc_id in doc_ids:
            deletion = DocumentDeletion(tenant, doc_id, purge=purge)
            if purge:
                out.append(
                    (
                        self.settings.topics.documents,
                        deletion.key,
                        deletion.erasure_value(),
                        f"the erasure of document {doc_id!r}",
                    )
                )
            out.append((self.settings.topics.documents, deletion.key, None, f"the deletion of document {doc_id!r}"))
        return out

    def retraction_message(self, tenant: str, fact: Fact, reason: str) -> tuple[Message, str]:
        """The fact's retraction for the resolver, and its work id."""
        work = retraction(tenant, fact, reason, uuid.uuid4().hex[:16])
        what = f"the retraction of fact {fact.id!r}"
        return (self.settings.topics.conflict_sets, work.key, encode(work.record), what), work.work_id

    def event_message(self, event: FactEvent) -> Message:
        return self.settings.topics.indexed_facts, event.key, encode(event), f"event {event.event_id!r}"

    # ---- sending ---------------------------------------------------------------------------
    def send(self, messages: list[Message], progress: Callable[[int], None] | None = None) -> None:
        """Send every message, in order, and wait until Kafka took each (PublishError when it did
        not: the message and Kafka's reason); `progress(n)` after each is queued."""
        what = messages[0][3] if len(messages) == 1 else f"{len(messages)} messages"  # until one is refused
        try:
            producer = self._connected()
            futures = []
            for n, (topic, key, value, _) in enumerate(messages, 1):
                futures.append(producer.send(topic, key=key.encode("utf-8"), value=value))
                if progress is not None:
                    progress(n)
            producer.flush(timeout=self.timeout_s * max(1, len(messages)))
            for future, message in zip(futures, messages):
                what = message[3]
                future.get(timeout=self.timeout_s)
        except Exception as exc:  # NoBrokersAvailable, KafkaTimeoutError, a refused message, ...
            self.close()
            raise PublishError(
                f"could not queue {what}: Kafka at {self.settings.kafka_bootstrap} did not take it ({exc})"
            ) from exc

    async def publish(self, doc: Document) -> None:
        await asyncio.to_thread(self.send, self.document_messages([doc]))

    async def delete(self, tenant: str, doc_id: str, purge: bool = False) -> None:
        await asyncio.to_thread(self.send, self.deletion_messages(tenant, [doc_id], purge))

    async def retract(self, tenant: str, fact: Fact, reason: str) -> str:
        """The fact's retraction queued for the resolver; its work id."""
        message, work_id = self.retraction_message(tenant, fact, reason)
        await asyncio.to_thread(self.send, [message])
        return work_id

    def _connected(self) -> KafkaProducer:
        with self._lock:
            if self._producer is None:
                from kafka import KafkaProducer

                timeout_ms = int(self.timeout_s * 1000)
                self._producer = KafkaProducer(
                    bootstrap_servers=self.settings.kafka_bootstrap,
                    acks="all",
                    enable_idempotence=True,
                    linger_ms=self.linger_ms,
                    max_request_size=self.settings.max_message_bytes,
                    bootstrap_timeout_ms=timeout_ms,
                    max_block_ms=timeout_ms,
                )
            return self._producer

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=self.timeout_s)
            except Exception as exc:
                log.warning("closing the Kafka producer: %s: %s", type(exc).__name__, exc)
