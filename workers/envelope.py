"""The envelope every indexing stage shares: one message handled effectively once (docs/architecture.md §6).

A stage decides its Redis writes and its outgoing messages; the envelope commits both in one
MULTI (writes + outbox), publishes the outbox, then sets the message's done mark. A redelivery
after a crash finds either nothing (decide again: the writes are idempotent), a committed outbox
(publish it again) or the done mark (skip).

Undecodable or invalid messages go to the dead-letter topic with the reason; transient errors
retry with capped exponential backoff and jitter, then go to the dead-letter topic too. Nothing
blocks a partition and nothing is dropped silently.

Stages return typed messages (`Emit`: topic, key, record — `Emit.of(record)`, both read from the
stage graph, topics.graph); the envelope gives fact events their
ids and encodes each record with `topics.encode` only when the outbox is committed, so the bytes
on the topics and in the Redis outboxes are what `topics.encode` gives.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Generic, Mapping, NamedTuple, Protocol, Sequence, TypeVar

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from store import AlreadyDone, CauseNotInMemory, Committed, Outgoing, StaleDecision
from store.base import Outbox, Progress
from store.errors import redis_unavailable
from store.records import cause
from topics import CandidateFact, ContractError, DeadLetter, Document, DocumentDeletion, FactEvent, decode, encode
from topics.graph import spec_of
from topics.records import Chunk, ConflictSet, Record, document_key
from workers import metrics
from workers.algorithms.normalize import short_hash
from workers.retry import backoff
from workers.settings import Settings

log = logging.getLogger(__name__)

Send = Callable[[Outgoing], Awaitable[None]]
# Sends several messages in their order and returns once the broker acknowledged them all: the
# acknowledgements are awaited together, not one round trip after the other (workers/app.py)
SendMany = Callable[[list[Outgoing]], Awaitable[None]]
MAX_ATTEMPTS = 5
MAX_REDECISIONS = 8


class EnvelopeStore(Outbox, Progress, Protocol):
    """What the envelope asks of the memory: the outbox and done marks, and work progress."""


class PermanentError(Exception):
    """Retrying cannot help: the message goes to the dead-letter topic at once."""


class Handling(NamedTuple):
    """What the envelope knows of the message the running task handles, beside its record."""

    position: tuple[int, int] | None  # (partition, offset); None where unknown (a broker in this process keeps no log)
    cause: str  # the decision that sent it (store.records.cause); "" for a message from outside the pipeline


_HANDLING: ContextVar[Handling | None] = ContextVar("memstream_handling", default=None)


CAUSED = (Chunk, CandidateFact, ConflictSet)  # the records the stages send one another (their `cause`)


def _handling() -> Handling:
    return _HANDLING.get() or Handling(None, "")


def message_position() -> tuple[int, int] | None:
    """The (partition, offset) of the message being handled, where the consumer knows it (read
    by the chunker: DocumentRecord.recorded_after)."""
    return _handling().position


@dataclass(frozen=True)
class Emit:
    """A message a stage decided to publish: the record, its topic suffix and partition key."""

    topic: str
    key: str
    record: Record

    @classmethod
    def of(cls, record: Record, key: str | None = None) -> "Emit":
        """The message of `record`: its topic and partition key as the stage graph derives them
        (topics.graph). `key` only where the record cannot give its key (a duplicate on
        conflict-sets: its target's head); naming one the record gives is an error, so each key
        is decided in one place."""
        spec = spec_of(record)
        derived = spec.key(record)
        if derived is not None and key is not None:
            raise ValueError(f"{spec.topic}: the key of {record!r:.200} is derived from the record; name none")
        chosen = derived if derived is not None else key
        if chosen is None:
            raise ValueError(f"{spec.topic}: {type(record).__name__} {record!r:.200} cannot give its key; name it")
        return cls(spec.topic, chosen, record)

    @property
    def work_id(self) -> str:
        """The chunk-progress work item this message is ('' for none: chunks, events)."""
        return getattr(self.record, "work_id", "")


Decided = Sequence["Emit"]  # what a decision returns: the messages to publish once it is committed
Decide = Callable[[object], Awaitable[Decided]]  # staged on the pipe it is given


class Finishes(NamedTuple):
    """The chunk-progress work item a message is: its chunk, its id and the chunk's fact count."""

    chunk_id: str
    work_id: str
    chunk_fact_count: int


class Once(Protocol):
    """Envelope.once; a Protocol, not a Callable, so `finishes` keeps its default."""

    def __call__(self, tenant: str, mark: str, decide: Decide, finishes: Finishes | None = None) -> Awaitable[None]: ...


M = TypeVar("M")  # what one topic's messages decode to
R = TypeVar("R", bound=Record)
# (value, key, max_text_bytes) → the message; raises ContractError (or any decoding error) on bad input
Decoder = Callable[[bytes | None, bytes | None, int], M]


@dataclass(frozen=True)
class Route(Generic[M]):
    """An input topic: how its messages decode, and the stage handler that takes what they
    decode to. Built together, so mypy checks that a handler takes its topic's messages."""

    decode: Decoder[M]
    handle: Callable[[M], Awaitable[None]]


def record_decoder(cls: type[R]) -> Decoder[R]:
    """A topic of one record type (`topics.decode`); a message of no value is an error."""

    def decode_record(value: bytes | None, key: bytes | None, max_text_bytes: int) -> R:
        if value is None:
            raise ContractError(f"{cls.TOPIC}: empty message (no value)")
        return decode(cls, value, max_text_bytes=max_text_bytes)

    return decode_record


def decode_document(value: bytes | None, key: bytes | None, max_text_bytes: int) -> Document | DocumentDeletion:
    """A message on `documents`: a version or an erasure (Document.decode_value), or with no
    value a tombstone — the deletion its key names. A keyed message's key must be the one its
    body names (topics.document_key): deletions and compaction go by the key, so a version
    under another key could never be deleted or compacted away (ContractError: dead-lettered).
    A message with no key is taken as its body says."""
    if value is None:
        return Document.tombstone(key)
    found = decode(Document, value, max_text_bytes=max_text_bytes)
    if key is not None:
        named = document_key(found.tenant, found.doc_id)
        given = bytes(key).decode("utf-8", errors="backslashreplace")
        if given != named:
            raise ContractError(
                f"documents: the message key {given!r} is not the one its body names ({named!r}: "
                f"'<tenant>/<doc_id>'); deletions and compaction go by the key, so publish it under {named!r}"
            )
    return found


def spawned_work_ids(outbox: Decided) -> list[str]:
    """The work items an outbox spawns downstream, read from its records' work_id."""
    return [item.work_id for item in outbox if item.work_id]


class Envelope:
    """Decode → the stage's handler → retry or wait out an outage → dead letter; and the
    effectively-once commit (`once`) the handlers run their decisions through.

    `routes` maps a topic suffix to its decoder and stage handler; the composition root
    (workers.pipeline) fills it after building the stages, which themselves call `once`."""

    def __init__(
        self,
        *,
        settings: Settings,
        memory: EnvelopeStore,
        send: Send,
        routes: Mapping[str, Route[Any]],  # Any: each route's handler is checked against its decoder
        send_many: SendMany | None = None,
    ):
        self.settings = settings
        self.memory = memory
        self.send = send
        self.send_many = send_many  # None: one send after the other
        self.routes = routes
        # (topic, partition) → the last offset this process recorded applied (workers.recovery)
        self.applied: dict[tuple[str, int], int] = {}

    # ---- decode, retry, dead-letter ----------------------------------------------------
    async def process(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        """Handle one message to the end: its effects and outbox committed and published, or
        the message dead-lettered with the reason; then its offset recorded applied (the
        store's record_applied: workers.recovery compares it with Kafka's committed offset).
        Returns only then, so the caller may ack."""
        await self._process(topic, key, value, partition, offset)
        if partition is not None and offset is not None:
            name = self.topic_name(topic)
            await self.memory.record_applied(self.settings.app_id, name, partition, offset)
            self.applied[(name, partition)] = max(offset, self.applied.get((name, partition), -1))

    def topic_name(self, suffix: str) -> str:
        return f"{self.settings.topic_namespace}.{suffix}"

    async def _process(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        started = time.perf_counter()
        try:
            record = self.decode(topic, value, key)
        except Exception as exc:  # any failure to decode is a dead letter, never a skipped message
            reason = (
                str(exc)
                if isinstance(exc, ContractError)
                else f"{topic}: undecodable message ({type(exc).__name__}: {exc})"
            )
            await self.dead_letter(topic, key, value, reason, partition, offset, attempts=1)
            return
        tenant = getattr(record, "tenant", None)
        position = (partition, offset) if partition is not None and offset is not None else None
        token = _HANDLING.set(Handling(position, getattr(record, "cause", "")))
        attempt, outage_retries, outage_since = 0, 0, None  # attempts count failures other than outages
        try:
            while True:
                try:
                    await self.routes[topic].handle(record)
                    metrics.MESSAGES.labels(stage=topic).inc()
                    metrics.STAGE_SECONDS.labels(stage=topic).observe(time.perf_counter() - started)
                    return
                except PermanentError as exc:
                    await self.dead_letter(topic, key, value, str(exc), partition, offset, attempt + 1, tenant)
                    return
                except Exception as exc:
                    if is_outage(exc):
                        # Redis or Kafka unreachable: nothing is wrong with the message; wait the
                        # outage out (up to the deadline) instead of dead-lettering all in flight
                        if outage_since is None:
                            outage_since = time.monotonic()
                            metrics.OUTAGE_WAITING.labels(stage=topic).inc()
                        waited = time.monotonic() - outage_since
                        if waited >= self.settings.outage_deadline:
                            reason = (
                                f"outage outlasted {self.settings.outage_deadline:.0f}s: {type(exc).__name__}: {exc}"
                            )
                            await self.dead_letter(topic, key, value, reason, partition, offset, attempt, tenant)
                            return
                        outage_retries += 1
                        delay = backoff(outage_retries)
                        metrics.OUTAGE_RETRIES.labels(stage=topic).inc()
                        log.warning(
                            "%s: waiting out an outage, %.0fs so far (%s: %s); retrying in %.1fs",
                            topic,
                            waited,
                            type(exc).__name__,
                            exc,
                            delay,
                        )
                    elif (attempt := attempt + 1) >= MAX_ATTEMPTS:
                        await self.dead_letter(
                            topic, key, value, f"{type(exc).__name__}: {exc}", partition, offset, attempt, tenant
                        )
                        return
                    else:
                        delay = backoff(attempt)
                        log.warning(
                            "%s: attempt %d failed (%s: %s); retrying in %.2fs",
                            topic,
                            attempt,
                            type(exc).__name__,
                            exc,
                            delay,
                        )
                    await asyncio.sleep(delay)
        finally:
            _HANDLING.reset(token)
            if outage_since is not None:
                metrics.OUTAGE_WAITING.labels(stage=topic).dec()

    def decode(self, topic: str, value: bytes | None, key: bytes | None = None) -> object:
        """The message's record — for a message of no value on a topic whose records have
        tombstones (documents), the deletion its key names; raises (ContractError or any
        decoding error) on bad input."""
        return self.routes[topic].decode(value, key, self.settings.max_text_bytes)

    async def dead_letter(self, topic, key, value, error, partition, offset, attempts, tenant=None) -> None:
        log.error("%s: to dead-letter topic: %s", topic, error[:2000])
        metrics.DEAD_LETTERS.labels(topic=topic).inc()
        letter = dead_letter_record(
            self.topic_name(topic),
            key,
            value,
            error,
            partition,
            offset,
            attempts,
            tenant,
            max_letter_bytes=self.settings.max_message_bytes,
        )
        message = Emit.of(letter)
        await self._send_until_sent(Outgoing(message.topic, message.key, encode(letter)))

    async def _send_until_sent(self, item: Outgoing) -> None:
        """Publish, waiting out a broker outage up to the deadline (then raise: the message
        stays unacknowledged and is delivered again)."""
        since = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.send(item)
                return
            except Exception as exc:
                if not is_outage(exc) or time.monotonic() - since >= self.settings.outage_deadline:
                    raise
                log.warning("%s: publish failed (%s: %s); retrying", item.topic, type(exc).__name__, exc)
                await asyncio.sleep(backoff(attempt))

    # ---- effectively once: decide, commit, publish, mark done ----------------------------
    async def once(self, tenant: str, mark: str, decide: Decide, finishes: Finishes | None = None) -> None:
        """Decide, commit (writes + outbox in one MULTI), publish, mark done.

        `finishes`: the work item this message is.
        The same work can be spawned twice (two promotions of one pending fact, a group
        re-adjudicated for the same cause); the copy that finds it done must still mark it
        finished, or the chunk it belongs to would wait for it forever.

        The commit is fenced (Memory.commit_once): of two deliveries of one message running at
        once, only one commits; the other publishes that one's outbox, never its own."""
        stage = mark.split(":", 1)[0]
        finished = False
        try:
            committed = await self.memory.pending_outbox(tenant, mark, _handling().cause)
            if committed is None:
                committed = await self._decide_and_commit(tenant, mark, decide, stage)
                finished = not committed.outbox  # an empty outbox commits with the done mark (Memory.stage_outbox)
            else:
                metrics.REDELIVERIES.labels(stage=stage, found="outbox").inc()
        except CauseNotInMemory as exc:  # Redis lost writes: the stage upstream sends it again (workers.recovery)
            metrics.CAUSE_NOT_IN_MEMORY.labels(stage=stage).inc()
            log.warning("%s in tenant %s: passed over until it is sent again (%s)", mark, tenant, exc)
            return
        except AlreadyDone:
            metrics.REDELIVERIES.labels(stage=stage, found="done").inc()
            if finishes:
                pipe = self.memory.pipeline(tenant)
                self.memory.stage_work_done(
                    pipe, tenant, finishes.chunk_id, finishes.work_id, finishes.chunk_fact_count
                )
                await pipe.execute()
            return
        await self._publish(committed.outbox)
        if not finished:
            await self.memory.finish(tenant, mark, committed.decision)

    async def _publish(self, outbox: list[Outgoing]) -> None:
        """Send the outbox in order; returns once the broker acknowledged every message."""
        if self.send_many is not None and len(outbox) > 1:
            await self.send_many(outbox)
            return
        for item in outbox:
            await self.send(item)

    async def _decide_and_commit(self, tenant: str, mark: str, decide: Decide, stage: str) -> Committed:
        """Decide and commit; decide again while another stage changes a fact under the decision
        (optimistic: the commit checks what the decision read). Returns the committed outbox:
        each of its messages names this decision as its cause (`decision_id`)."""
        for _ in range(MAX_REDECISIONS):
            pipe = self.memory.pipeline(tenant)
            decided = stamp_event_ids(tenant, mark, await decide(pipe))
            decision = decision_id(mark, decided)
            decided = stamp_causes(decided, cause(mark, decision))
            outbox = encode_outbox(decided)
            self.memory.stage_outbox(pipe, tenant, mark, outbox, decision)
            try:
                committed = await self.memory.commit_once(pipe, tenant, mark)
            except StaleDecision:
                metrics.STALE_DECISIONS.labels(stage=stage).inc()
                continue
            if committed is not None:
                metrics.FENCED.labels(stage=stage).inc()
                return committed
            promoted_schemas = set()
            for item in decided:  # committed: its events will be published
                if isinstance(item.record, FactEvent):
                    metrics.FACT_EVENTS.labels(event=item.record.event).inc()
                elif isinstance(item.record, CandidateFact) and item.record.activation:
                    metrics.FACTS_PROMOTED.inc()
                    promoted_schemas.add(
                        (
                            item.record.tenant,
                            item.record.fact.head_type,
                            item.record.fact.relation,
                            item.record.fact.tail_type,
                        )
                    )
            metrics.SCHEMAS_PROMOTED.inc(len(promoted_schemas))
            return Committed(outbox, decision)
        raise RuntimeError(f"{mark}: the facts it decides about kept changing under {MAX_REDECISIONS} decisions")

    async def publish_unsent_outboxes(self, grace_s: float = 30.0) -> int:
        """Publish outboxes that were committed but never published (their worker died or
        publishing kept failing and the message was dead-lettered), oldest first, and mark
        them done. `grace_s` leaves alone outboxes whose own worker is still publishing them; a
        race with it publishes twice, which consumers absorb (same event ids, done marks)."""
        sent = 0
        for tenant, mark, committed in await self.memory.unsent_outboxes(time.time() - grace_s):
            outbox = committed.outbox
            try:
                await self._publish(outbox)
                await self.memory.finish(tenant, mark, committed.decision)
            except Exception as exc:  # one outbox that cannot be sent must not hold back the others
                if is_outage(exc):
                    raise
                log.error(
                    "sweep: the outbox of %s in tenant %s could not be published (%s: %s)",
                    mark,
                    tenant,
                    type(exc).__name__,
                    exc,
                )
                continue
            metrics.OUTBOXES_SWEPT.inc()
            log.warning(
                "sweep: published the unsent outbox of %s in tenant %s (%d messages)", mark, tenant, len(outbox)
            )
            sent += 1
        return sent


def stamp_event_ids(tenant: str, mark: str, outbox: Decided) -> list[Emit]:
    """Give each fact event the id of its transition: the message that caused it (its mark)
    and its place among that message's events. A redelivery of the message decides the same
    events in the same order, so it repeats the ids (consumers drop it); two transitions of one
    fact never share an id, even when the fact returns to an earlier state; the same document in
    two tenants gives two ids (one topic carries every tenant's events).

    The place is the index in the whole outbox (other messages count too), as since event ids
    were first given; the id is set on the record before it is encoded, which gives the same
    bytes as setting it in the encoded JSON did (the field keeps its place in the object)."""
    out = []
    for position, item in enumerate(outbox):
        if isinstance(item.record, FactEvent):
            event = item.record
            item = replace(
                item,
                record=replace(
                    event,
                    event_id=short_hash(
                        "event", tenant, mark, str(position), event.event, event.fact_id or event.doc_id
                    ),
                ),
            )
        out.append(item)
    return out


def decision_id(mark: str, outbox: Decided) -> str:
    """A decision's id: a hash of its message's mark and of what it sends the stages downstream
    (CAUSED records; fact events, which carry times, are read by no stage). A decision lost with
    Redis's writes and made again the same way has the same id (the first one's messages, still
    on the topics, count as the second's); made otherwise (another order of the replay), another
    id, and the first one's messages are passed over downstream (CauseNotInMemory)."""
    sent = (item for item in outbox if isinstance(item.record, CAUSED))
    return short_hash(
        "decision", mark, *(f"{item.topic}\x1f{item.key}\x1f{encode(item.record).decode()}" for item in sent)
    )


def stamp_causes(outbox: Decided, text: str) -> list[Emit]:
    """Name the decision (store.records.cause) on each message a stage consumes downstream
    (CAUSED: the records with a `cause` field): the envelope there passes over one whose cause memory does
    not hold (CauseNotInMemory)."""
    return [
        replace(item, record=replace(item.record, cause=text)) if isinstance(item.record, CAUSED) else item
        for item in outbox
    ]


def encode_outbox(outbox: Decided) -> list[Outgoing]:
    """The messages as they are committed to the outbox and published: `topics.encode` bytes."""
    return [Outgoing(item.topic, item.key, encode(item.record)) for item in outbox]


def is_outage(exc: BaseException) -> bool:
    """Redis or Kafka could not be reached (here or in anything it was raised from): a
    retry after a wait can succeed, whatever the message is."""
    seen = set()
    link: BaseException | None = exc  # the chain walked: exc, then what each was raised from
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if redis_unavailable(link) is link or isinstance(link, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if isinstance(link, KafkaError) and (
            link.retriable or isinstance(link, (KafkaConnectionError, KafkaTimeoutError))
        ):
            return True
        link = link.__cause__ or link.__context__
    return False


def dead_letter_record(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    error: str,
    partition,
    offset,
    attempts: int,
    tenant: str | None,
    max_letter_bytes: int,
) -> DeadLetter:
    """A dead letter that always fits the topic: the whole payload (undecodable bytes escaped)
    when the letter fits `max_letter_bytes`, else the payload cut to a sixth of it (JSON
    escaping grows text up to 6×: control characters as a 6-character escape), with the original's size and
    sha256 kept; the error cut to 8 KiB."""
    raw = value or b""
    payload = raw.decode("utf-8", errors="backslashreplace")

    def letter(text: str, truncated: bool) -> DeadLetter:
        return DeadLetter(
            topic=topic,
            payload=text,
            error=error[:8192]
            .encode("utf-8", errors="backslashreplace")
            .decode("utf-8"),  # lone surrogates from model output
            key=None if key is None else key[:1024].decode("utf-8", errors="backslashreplace"),
            partition=partition,
            offset=offset,
            attempts=attempts,
            tenant=tenant,
            ts=time.time(),
            payload_bytes=len(raw),
            payload_sha256=hashlib.sha256(raw).hexdigest(),
            payload_truncated=truncated,
        )

    whole = letter(payload, False)
    if len(encode(whole)) <= max_letter_bytes:
        return whole
    cut = max(0, (max_letter_bytes - (64 << 10)) // 6)
    return letter(payload.encode("utf-8")[:cut].decode("utf-8", errors="ignore"), True)
