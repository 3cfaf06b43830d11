"""The faust app: one agent per indexing role, plus the query API (workers.query.server) when
the roles include `query` next to indexing ones. With workers/faust_patches.py, the only modules
that import faust.

Agents run with concurrency 1 (faust #606 loses in-flight messages on a crash with more) and
read ahead instead (_read_ahead: the model calls of up to MEMSTREAM_LLM_CONCURRENCY events in
flight, one lane per partition processing and acking in offset order); scale further with
partitions and worker processes. An event is acknowledged only after `Pipeline.process`
returned, i.e. after its Redis effects and outgoing messages are durable."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import faust
from faust.types import TP

from store import Memory, Outgoing
from topics import TOPIC_SUFFIXES
from workers import faust_patches, metrics
from workers.liveness import EXIT_STALLED, StallWatch
from workers.models.embedding import make_embedder
from workers.models.extraction import make_extractor
from workers.models.llm import LLMClient
from workers.pipeline import Pipeline
from workers.query.clients import cached_embedder
from workers.query.server import check_exposure, listen, query_app, serve, serve_metrics
from workers.recovery import Recovery, applied_offsets
from workers.retry import backoff
from workers.roles import EMBEDDING_ROLES, ROLE_TOPICS
from workers.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, roles: set[str], http_sockets: Sequence[socket.socket] = ()) -> faust.App:
    """The faust app of `roles`; with `query`, the HTTP API is served on `http_sockets` (bound
    beforehand by run_worker) or else on MEMSTREAM_HTTP_HOST:PORT."""
    faust_patches.install()  # before any consumer exists: what effectively-once relies on
    settings.home.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        datadir=tempfile.mkdtemp(prefix="faust-", dir=settings.home),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,  # the query API is workers.query.server's (see _serve_query_api)
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=settings.max_message_bytes,
        consumer_max_fetch_size=settings.max_message_bytes,
        broker_session_timeout=settings.session_timeout,
        broker_heartbeat_interval=max(1.0, settings.session_timeout / 4),
        topic_partitions=settings.partitions,
        stream_wait_empty=False,
    )
    model = make_embedder(settings) if roles & EMBEDDING_ROLES else None
    dims = {"dims": model.dims} if model is not None else {}  # the indexes a writer creates hold its embedder's vectors
    memory = Memory.from_url(settings.redis_url, tau=settings.effective_tau, vector_index=settings.vector_index, **dims)
    embedder = cached_embedder(settings, memory, model) if model is not None else None
    extractor = None
    if "extractor" in roles:
        llm = (
            LLMClient(settings.llm_config(), memory.llm_cache(settings.llm_model))
            if settings.extractor == "llm"
            else None
        )
        extractor = make_extractor(settings.extractor, settings.replay_file, llm)
    names = dict(zip(TOPIC_SUFFIXES, settings.topics.all()))
    topics = {
        suffix: app.topic(
            name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw", allow_empty=True
        )
        for suffix, name in names.items()
    }

    async def send(item: Outgoing) -> None:
        await send_many([item])  # the broker's ack before the input offset may be committed

    async def send_many(items: list[Outgoing]) -> None:
        # enqueued one after the other (the producer keeps their order), acknowledged together:
        # an outbox of n messages waits for one broker round trip, not n
        await sent_and_acked(
            [
                functools.partial(topics[item.topic].send, key=item.key.encode("utf-8"), value=item.value)
                for item in items
            ]
        )

    resolver_llm = (
        LLMClient(settings.llm_config(), memory.llm_cache(settings.llm_model))
        if settings.resolver == "llm" and "resolver" in roles
        else None
    )
    pipeline = Pipeline(settings, memory, send, embedder, extractor, resolver_llm, send_many)
    watch: StallWatch[TP] = StallWatch(settings.stall_seconds)
    for role, suffix in ROLE_TOPICS.items():
        if role in roles:
            _register_agent(app, role, topics[suffix], suffix, pipeline, watch)
    if roles & set(ROLE_TOPICS):
        _register_outbox_sweep(app, settings, pipeline)
        _register_liveness(app, settings, watch)
        _register_recovery(app, Recovery(memory, settings.app_id, pipeline.envelope.applied))
    if "resolver" in roles:
        _register_expiry_sweep(app, settings, pipeline)
    if "extractor" in roles:
        _register_lexical_upkeep(app, memory)
    if "query" in roles:
        _serve_query_api(app, settings, embedder, http_sockets)
    return app


# How long a send waits for the broker's acks. aiokafka's idempotent producer never expires a
# batch it sent once and retries it while the broker is silent, so an ack could be waited for
# without end: the envelope's outage deadline never applied and the outage metrics stayed at 0
# (found by an audit). Past it the send fails as an outage (a TimeoutError: envelope.is_outage),
# retried with backoff; a copy that lands late is a redelivery, which every stage drops (event
# ids, done marks). A leader's failover acks within ~10-20 s here (tests/test_brokers.py).
SEND_ACK_TIMEOUT_S = 60.0


async def sent_and_acked(sends: list[Callable[[], Awaitable[Any]]]) -> None:
    """Each send (faust's Topic.send, which returns the delivery's future once the producer took
    the message) in order, then every delivery's ack, awaited before a failure is raised so none
    is left unretrieved behind it; all within SEND_ACK_TIMEOUT_S, then TimeoutError (acks still
    due are awaited in the background). The producer's taking is under the deadline too: with a
    partition's batch full it waits up to faust's producer_request_timeout (1200 s) for room, and
    each retry of a silent broker's outbox fills it further (from a review)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SEND_ACK_TIMEOUT_S
    deliveries: list[Any] = []  # (aiokafka's futures of RecordMetadata)
    try:
        for send in sends:
            deliveries.append(await asyncio.wait_for(send(), max(0.0, deadline - loop.time())))
        together = asyncio.gather(*deliveries, return_exceptions=True)
        results = await asyncio.wait_for(asyncio.shield(together), max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        answered = sum(d.done() for d in deliveries)
        raise TimeoutError(
            f"Kafka took {len(deliveries)} of {len(sends)} message(s) to send and answered {answered} "
            f"in {SEND_ACK_TIMEOUT_S:.0f} s"
        ) from None
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise failed[0]


def _register_agent(
    app: faust.App, role: str, topic, suffix: str, pipeline: Pipeline, watch: StallWatch[TP] | None = None
) -> None:
    # Each partition's events processed one at a time, in offset order, acked by hand once
    # `process` returned (its effects committed and its outbox published, or the message
    # dead-lettered). faust's own ack runs in a `finally` and so also acks the event whose
    # handler was cancelled by a SIGTERM or a rebalance: the message in flight was committed
    # unprocessed and lost. An event never acked here stays uncommitted and is delivered again
    # to the partition's next owner.
    # Batching the extractor with stream.take_events (to overlap LLM calls) stalled under a
    # consumer-group rebalance in about one run in three of the two-extractor test: not used;
    # the model calls overlap through the read-ahead window instead (_read_ahead).
    window = pipeline.read_ahead(suffix)

    async def agent(stream):
        await _read_ahead(stream.noack(), suffix, pipeline, window, watch)

    agent.__name__ = agent.__qualname__ = role
    app.agent(topic, name=f"memstream.{role}", concurrency=1)(agent)


async def _process_and_ack(manual, event, suffix: str, pipeline: Pipeline, watch: StallWatch[TP] | None = None) -> None:
    message = event.message
    attempt = 0
    while True:  # `process` only raises when even dead-lettering failed (e.g. Kafka down past
        attempt += 1  # the outage deadline): an agent that crashed would go on with the next
        try:  # message and its ack would let the commit pass this one, so run it again
            await pipeline.process(suffix, message.key, message.value, message.partition, message.offset)
            break
        except Exception as exc:
            log.error(
                "%s: message at offset %s not processed (%s: %s); trying again",
                suffix,
                message.offset,
                type(exc).__name__,
                exc,
            )
            await asyncio.sleep(backoff(attempt))
    message.memstream_processed = True
    await manual.ack(event)
    if watch is not None:
        watch.handled(message.tp, time.monotonic())


async def _prefetch_quietly(pipeline: Pipeline, suffix: str, message) -> None:
    try:
        await pipeline.prefetch(suffix, message.key, message.value)
    except Exception as exc:  # `process` meets the same error itself, and retries or dead-letters
        log.debug("%s: read-ahead of offset %s failed (%s: %s)", suffix, message.offset, type(exc).__name__, exc)


async def _read_ahead(
    manual, suffix: str, pipeline: Pipeline, window: int, watch: StallWatch[TP] | None = None
) -> None:
    """Up to `window` events held at once (Pipeline.read_ahead). Each event's model calls start
    as soon as it is read (`Pipeline.prefetch`, a task per event: answers land in the LLM cache,
    the extractor's memo and the embedding cache), while one consumer per partition (a lane)
    runs `process` and acks its partition's events strictly in offset order, as the
    one-at-a-time loop did. So one extractor keeps up to MEMSTREAM_LLM_CONCURRENCY LLM calls in
    flight, and each partition's effects and offsets still commit in offset order. Partitions
    run side by side as they would in separate processes (the envelope's fenced commits and
    optimistic checks make that safe): a message's serial part — Redis round trips and the
    broker's acknowledgements, about 150 ms for a chunk of 3 facts on the shared test machine —
    would otherwise cap one process at about 7 chunks/s, whatever the LLM allows.

    Crash-safe where faust's agent `concurrency > 1` is not (faust #606: concurrent actors
    share the partitions and ack on their own, so a commit could pass an event another actor
    had not finished): here only a partition's own lane acks, in order, and only after
    `process` returned, so a committed offset never passes an unprocessed event; on
    cancellation (SIGTERM, the agent stopped) lanes and prefetch tasks are cancelled and every
    event not acked stays uncommitted, to be delivered again (an extraction already asked of
    the LLM finishes into its cache). No stall under a rebalance, where take_events stalled (it
    holds a batch until the batch fills or times out, inside the stream's iteration): the
    reader waits for nothing but a free slot, which the lanes free by finishing events, and the
    lanes never wait on the stream; events of a revoked partition still held are processed (the
    done marks and fenced commits make their redelivery to the new owner a no-op). A prefetch
    that fails is ignored: `process` meets the error itself."""
    slots = asyncio.Semaphore(window)  # an event holds a slot from its read until its ack
    lanes: dict[int, asyncio.Queue] = {}  # partition → (event, its prefetch task), in offset order
    consumers: list[asyncio.Future] = []

    async def consume(held: asyncio.Queue) -> None:
        while True:
            event, prefetch = await held.get()
            try:
                await _process_and_ack(manual, event, suffix, pipeline, watch)
            finally:
                prefetch.cancel()  # done by now, unless `process` found the message already done
                slots.release()

    try:
        async for event in manual.events():
            free = asyncio.ensure_future(slots.acquire())
            try:
                await asyncio.wait({free, *consumers}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the agent is cancelled while waiting
                if not free.done():
                    free.cancel()
            for consumer in consumers:
                if consumer.done():  # a lane only ends by an error: raise it
                    consumer.result()
                    raise RuntimeError(f"{suffix}: a read-ahead lane stopped")
            partition = event.message.partition
            if partition not in lanes:
                lanes[partition] = asyncio.Queue()
                consumers.append(asyncio.ensure_future(consume(lanes[partition])))
            lanes[partition].put_nowait(
                (event, asyncio.ensure_future(_prefetch_quietly(pipeline, suffix, event.message)))
            )
    finally:
        for consumer in consumers:
            consumer.cancel()
        for held in lanes.values():
            while not held.empty():
                held.get_nowait()[1].cancel()
        await asyncio.gather(*consumers, return_exceptions=True)


def _register_liveness(app: faust.App, settings: Settings, watch: StallWatch[TP]) -> None:
    """Every quarter of MEMSTREAM_STALL_SECONDS: the held partitions' committed offsets against
    the ends of their logs (workers.liveness); a stall makes the worker rejoin its group, a
    second one exits it (EXIT_STALLED). MEMSTREAM_TEST_PAUSE_FETCH=1 (tests only) pauses the
    fetching of every partition once, after the first assignment: the stall it reproduces."""
    pause_for_test = os.environ.get("MEMSTREAM_TEST_PAUSE_FETCH") == "1"
    lag_labels: set[tuple[str, str]] = set()  # the partitions the lag gauge has a value for

    @app.timer(interval=max(0.5, settings.stall_seconds / 4))
    async def check_liveness():
        nonlocal pause_for_test
        consumer = app.consumer
        held = {tp for tp in consumer.assignment() if "__assignor" not in tp.topic}
        if pause_for_test and held:
            pause_for_test = False
            consumer.pause_partitions(held)
            log.warning("liveness: test hook: fetching paused on %d partitions", len(held))
        try:
            ends = await consumer.highwaters(*held) if held else {}
        except Exception as exc:  # the broker away: no verdict this round
            log.debug("liveness: end offsets not read (%s: %s)", type(exc).__name__, exc)
            return
        now, committed = time.monotonic(), faust_patches.committed_offsets(consumer, held)
        for labels in lag_labels - {(tp.topic, str(tp.partition)) for tp in held}:  # revoked: no stale value
            metrics.CONSUMER_LAG.remove(*labels)
            lag_labels.discard(labels)
        for tp in held:
            if ends.get(tp) is not None:
                metrics.CONSUMER_LAG.labels(topic=tp.topic, partition=str(tp.partition)).set(
                    max(0, ends[tp] - (committed[tp] or 0))
                )
                lag_labels.add((tp.topic, str(tp.partition)))
        stalled = watch.check(now, committed, ends)
        if not stalled:
            return
        names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in stalled)
        if watch.stalled(stalled, now) == "rejoin":
            metrics.STALLS.labels(action="rejoin").inc()
            log.error(
                "liveness: no progress for %.0fs on %s with messages waiting: leaving and rejoining the group",
                settings.stall_seconds,
                names,
            )
            await faust_patches.request_rejoin(consumer)
        else:
            metrics.STALLS.labels(action="exit").inc()
            log.critical(
                "liveness: stalled again (%s): exiting with %d so the supervisor starts this worker again",
                names,
                EXIT_STALLED,
            )
            logging.shutdown()
            os._exit(EXIT_STALLED)


RECOVERY_CHECK_S = 5.0  # how often a worker compares what Redis holds of its partitions with Kafka
RECOVERY_REJOIN_S = 30.0  # the least time between two rejoins for a loss (a replay takes its time)
RECOVERY_READ_S = 5.0  # how long a rewind waits for Redis at an assignment (then the timer catches up)


def _register_recovery(app: faust.App, recovery: Recovery) -> None:
    """Memory = f(log) (workers.recovery): at each assignment, the partitions whose effects Redis
    lost are read again from the first one it lacks; every RECOVERY_CHECK_S a loss under the
    running worker makes it rejoin its group, and so rewind."""

    def held(consumer) -> tuple[dict, dict]:
        """The held partitions: (topic, partition) → faust's TP, and → its committed offset."""
        tps = [tp for tp in consumer.assignment() if "__assignor" not in tp.topic]
        committed = faust_patches.committed_offsets(consumer, tps)
        return {(tp.topic, tp.partition): tp for tp in tps}, {(tp.topic, tp.partition): committed[tp] for tp in tps}

    async def rewind(consumer) -> None:
        partitions, committed = held(consumer)
        try:
            targets = await asyncio.wait_for(recovery.rewind(committed), RECOVERY_READ_S)
        except Exception as exc:  # Redis away: the timer's check finds the loss once it answers
            log.warning(
                "recovery: what Redis holds of the assigned partitions not read (%s: %s)", type(exc).__name__, exc
            )
            return
        for key, start in sorted(targets.items()):
            tp = partitions[key]
            metrics.REWINDS.labels(topic=tp.topic).inc()
            log.warning(
                "recovery: Redis holds %s[%d] up to offset %s, Kafka committed %s: reading it again from %d",
                tp.topic,
                tp.partition,
                start - 1 if start else "none",
                committed[key],
                start,
            )
            await faust_patches.seek_to(consumer, tp, start)

    app.memstream_rewind = rewind  # type: ignore[attr-defined]  # read by faust_patches' perform_seek
    rejoined = -RECOVERY_REJOIN_S

    @app.timer(interval=RECOVERY_CHECK_S)
    async def check_recovery():
        nonlocal rejoined
        consumer = app.consumer
        if app.rebalancing:  # the assignment's own rewind decides (and a rejoin now would start another)
            return
        _, committed = held(consumer)
        if not committed or time.monotonic() - rejoined < RECOVERY_REJOIN_S:
            return
        try:
            lost = await recovery.lost(committed)
        except Exception as exc:  # Redis away: no verdict this round
            log.debug("recovery: check skipped (%s: %s)", type(exc).__name__, exc)
            return
        if lost:
            rejoined = time.monotonic()
            applied = await applied_offsets(recovery.memory, recovery.group, lost)
            log.error(
                "recovery: Redis lost writes of %s: rejoining the group to read them again",
                ", ".join(
                    f"{topic}[{partition}] (Redis holds up to {applied[(topic, partition)]}, this worker recorded "
                    f"{recovery.recorded_here.get((topic, partition))}, Kafka committed {committed[(topic, partition)]})"
                    for topic, partition in lost
                ),
            )
            await faust_patches.request_rejoin(consumer)


def _register_outbox_sweep(app: faust.App, settings: Settings, pipeline: Pipeline) -> None:
    """Publish committed outboxes nobody published (a worker died between commit and send, or
    sending failed past every retry): at start, then every outbox_sweep_interval seconds."""

    @app.task
    async def sweep_outboxes():
        await asyncio.sleep(min(5.0, settings.outbox_sweep_interval))  # let the producer start
        while True:
            try:
                await pipeline.publish_unsent_outboxes(grace_s=settings.outbox_sweep_interval)
            except Exception as exc:  # Redis or Kafka away: the next round tries again
                log.warning(
                    "outbox sweep failed (%s: %s); next try in %.0fs",
                    type(exc).__name__,
                    exc,
                    settings.outbox_sweep_interval,
                )
            await asyncio.sleep(settings.outbox_sweep_interval)


def _register_expiry_sweep(app: faust.App, settings: Settings, pipeline: Pipeline) -> None:
    """Expire facts whose TTL lapsed (Pipeline.expire_lapsed), every expiry_sweep_interval
    seconds. In the resolver workers: every deployment has one, it is not the extractor's
    model-bound loop, and the sweep's work is the resolver's kind — fact transitions and the
    groups they make worth deciding again. Two resolvers sweep at once safely (one commit per
    fact and lapse); queries leave out lapsed facts before the sweep reaches them."""

    @app.task
    async def sweep_expired():
        while True:
            await asyncio.sleep(settings.expiry_sweep_interval)
            try:
                expired = await pipeline.expire_lapsed()
                if expired:
                    log.info("expiry sweep: %d facts expired", expired)
            except Exception as exc:  # Redis or Kafka away: the next round tries again
                log.warning(
                    "expiry sweep failed (%s: %s); next try in %.0fs",
                    type(exc).__name__,
                    exc,
                    settings.expiry_sweep_interval,
                )


LEXICAL_UPKEEP_S = 30.0  # how often an extractor looks over the own lexical indexes (one FT._LIST, an FT.INFO each)


def _register_lexical_upkeep(app: faust.App, memory: Memory) -> None:
    """Build again every large tenant's own lexical index whose statistics drifted
    (store.redis.lexical_index's own_lexical_upkeep): at start, then every LEXICAL_UPKEEP_S. In
    the extractors, the role that writes passages and promotes their indexes; a Redis restarted
    on its AOF may index an own index's copies twice, and a tenant that writes nothing afterwards
    would otherwise be answered by the slower shared path for good."""

    @app.task
    async def lexical_upkeep():
        while True:
            try:
                for tenant in await memory.own_lexical_upkeep():
                    log.info("lexical upkeep: tenant %s's own index built again", tenant)
            except Exception as exc:  # Redis away: the next round tries again
                log.warning(
                    "lexical upkeep failed (%s: %s); next try in %.0fs", type(exc).__name__, exc, LEXICAL_UPKEEP_S
                )
            await asyncio.sleep(LEXICAL_UPKEEP_S)


def _serve_query_api(app: faust.App, settings: Settings, embedder, socks: Sequence[socket.socket]) -> None:
    """Serve the query API (workers.query.server) from this worker's event loop; faust's own
    web server stays off. It starts with the app's tasks, once the app has started (the
    consumer group joined), and stops (Redis pool closed) when the worker stops. The port is
    bound by run_worker before anything starts, so a taken port fails the worker at once."""

    @app.task
    async def serve_query_api():
        try:
            await serve(query_app(settings, embedder), settings.http_host, settings.http_port, socks=socks)
        except OSError as exc:
            log.error("query API cannot listen on %s:%s: %s", settings.http_host, settings.http_port, exc)
            await app.crash(exc)


def run_worker(settings: Settings, roles: set[str]) -> None:
    """The roles as one faust worker (Kafka needed). `--role query` alone does not come here:
    workers.query.server.run_query_server serves it without Kafka."""
    http_sockets: list[socket.socket] = []
    if "query" in roles:
        check_exposure(settings)  # keys load; without keys, loopback only
        # bound before Kafka, Redis and the agents start: a taken port is a clear error now, not
        # a crash after the worker joined its consumer group (and a port chosen free just before
        # is not taken meanwhile by one of the clients' own connections)
        http_sockets = listen(settings)
    app = create_app(settings, roles, http_sockets)
    serve_metrics(settings)
    worker = _Worker(app, loglevel=settings.log_level, quiet=True)
    worker.stop_seconds = settings.stop_seconds
    worker.execute_from_commandline()


class _Worker(faust.Worker):
    """faust's worker, whose stop has a deadline: stop_seconds after the first SIGTERM or SIGINT
    the process exits with 1 if it has not stopped. faust's stop flushes the producer and commits
    the consumer's offsets with no timeout, and aiokafka retries both while the broker does not
    answer: a worker SIGTERMed while its one broker was SIGSTOPped was still running 150 s later,
    and a second signal does nothing. The exit is as safe as a SIGKILL, which every stage is
    built for: what was not committed is delivered again, and its effects are applied once."""

    stop_seconds = 90.0
    _deadline: threading.Timer | None = None

    def _on_sigterm(self) -> None:
        self._stop_deadline()
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._stop_deadline()
        super()._on_sigint()

    def _stop_deadline(self) -> None:
        if self._deadline is None:
            self._deadline = threading.Timer(self.stop_seconds, _stop_overdue, (self.stop_seconds,))
            self._deadline.daemon = True
            self._deadline.start()


def _stop_overdue(stop_seconds: float) -> None:
    log.error(
        "not stopped %.0f s after the signal (Kafka or Redis not answering?): exiting; what was not committed "
        "is delivered again (MEMSTREAM_STOP_SECONDS)",
        stop_seconds,
    )
    logging.shutdown()
    os._exit(1)
