"""Two corrections to faust-streaming's consumer that effectively-once relies on, installed
explicitly when a worker starts (workers.app.create_app calls `install`) and checked by
tests/test_faust_patches.py, whose tests fail if a faust release changes what they rely on:

- `Consumer.ack(self, message)` — wrapped so only what our agents processed is acked;
- `Consumer.perform_seek(self)` (a coroutine) — followed by a rewind of the partitions with no
  committed offset, which reads faust's `_committed_offset` and `_read_offset` (dicts by TP),
  `assignment()`, and the aiokafka driver's consumer thread (`_thread.seek_to_beginning`); then
  by the app's `memstream_rewind(consumer)` where the worker set one (workers.recovery: the
  partitions whose effects Redis lost, read again through `seek_to`).

And one to its aiokafka producer: `Producer._settings_extra(self)` — idempotent (acks=all and
enable_idempotence) outside transactions too, where faust sets neither: a send retried after a
broker's leadership moved is written once, not twice.

And one to its aiokafka consumer thread: `AIOKafkaConsumerThread.verify_event_path(self, now, tp)`
— faust's livelock check, run every 2.5 commit intervals, reads the partition's position through
aiokafka's `TopicPartitionState.position`, which *asserts* one is set; a partition sought back
(to its beginning or by a rewind) has none until the fetcher resets it, and the assertion
crashed the worker (tests/test_crash.py, the survivor of a SIGKILL, in CI). Such a partition is
skipped this round: there is nothing to compare yet, and the next round checks it.

And two reads of its internals for workers.liveness: `committed_offsets` (`_committed_offset`)
and `request_rejoin` (the consumer thread's `call_thread`, its aiokafka consumer's coordinator's
`request_rejoin`).

faust-streaming is pinned to the minor version these were written and tested against
(pyproject.toml); a new minor version is adopted by running those tests against it first."""

from __future__ import annotations

from typing import Hashable, Iterable, TypeVar

import faust.transport.consumer
import faust.transport.drivers.aiokafka
from aiokafka.structs import TopicPartition as AIOKafkaTP

P = TypeVar("P", bound=Hashable)  # a partition (faust's TP)

TESTED_MINOR = (0, 15)  # faust-streaming's version these patches are tested against (pyproject pins it)


def _ack_only_processed(ack):
    """Only what our agents processed is acked. faust's pure-Python stream path acks a message
    it skips after a rebalance (old generation id) — the partition is then sought back and the
    message fetched again, but its offset already counts as acked, so a commit could pass it
    before the new copy ran. (The compiled iterator does not; this keeps both paths safe.)
    Every topic these workers consume is an agent's."""

    def ack_processed(self, message) -> bool:
        if not getattr(message, "memstream_processed", False):
            return False
        return ack(self, message)

    ack_processed.memstream_patched = True  # type: ignore[attr-defined]  # our mark, read by installed()
    return ack_processed


def _seek_uncommitted_to_beginning(perform_seek):
    """After a rebalance faust drops the messages it fetched in the old generation and seeks each
    partition back to its committed offset — but aiokafka's seek_to_committed skips a partition
    with no committed offset (or 0), and faust drops fetched messages below the offset it last
    read: a refetch that lands before faust's seek is dropped, and the fetcher stays past it. A
    chaos run lost 66 of 128 documents this way when a second extractor joined while the first
    held fetched, uncommitted chunks (the race did not reproduce in a targeted test). Such
    partitions start again from the beginning, as auto_offset_reset=earliest says, with faust's
    read offset cleared; what was already done is found done."""

    async def perform_seek_and_rewind(self) -> None:
        await perform_seek(self)
        fresh = [tp for tp in self.assignment() if not self._committed_offset.get(tp) and "__assignor" not in tp.topic]
        if fresh:  # the aiokafka driver seeks on its consumer thread, with aiokafka's partition type
            await getattr(self, "_thread", self).seek_to_beginning(
                *(AIOKafkaTP(tp.topic, tp.partition) for tp in fresh)
            )
            for tp in fresh:
                self._read_offset[tp] = None
        rewind = getattr(getattr(self, "app", None), "memstream_rewind", None)
        if rewind is not None:
            await rewind(self)

    perform_seek_and_rewind.memstream_patched = True  # type: ignore[attr-defined]  # our mark, read by installed()
    return perform_seek_and_rewind


async def seek_to(consumer, tp, offset: int) -> None:
    """Read the partition again from `offset` (0: its beginning, wherever retention left it),
    faust's read offset moved with it so it keeps the messages it fetches again."""
    if offset <= 0:
        await getattr(consumer, "_thread", consumer).seek_to_beginning(AIOKafkaTP(tp.topic, tp.partition))
        consumer._read_offset[tp] = None
    else:
        await consumer.seek(tp, offset)


def _verify_positioned(verify_event_path):
    """faust's livelock check, skipping a partition that awaits a reset (see the module doc)."""

    def verify_positioned_event_path(self, now: float, tp) -> None:
        subscription = self._ensure_consumer()._fetcher._subscriptions.subscription
        assignment = subscription.assignment if subscription is not None else None
        state = assignment.state_value(AIOKafkaTP(tp.topic, tp.partition)) if assignment is not None else None
        if state is not None and not state.has_valid_position:
            return None
        return verify_event_path(self, now, tp)

    verify_positioned_event_path.memstream_patched = True  # type: ignore[attr-defined]  # our mark
    verify_positioned_event_path.__wrapped_verify__ = verify_event_path  # type: ignore[attr-defined]  # for the test
    return verify_positioned_event_path


def _idempotent(settings_extra):
    """The producer's extra settings, idempotent whatever faust adds (its transactions' too)."""

    def idempotent_settings(self):
        return {**settings_extra(self), "acks": "all", "enable_idempotence": True}

    idempotent_settings.memstream_patched = True  # type: ignore[attr-defined]  # our mark
    return idempotent_settings


def committed_offsets(consumer, tps: Iterable[P]) -> dict[P, int | None]:
    """Each partition's committed offset as the consumer knows it (None: none committed)."""
    return {tp: consumer._committed_offset.get(tp) for tp in tps}


async def request_rejoin(consumer) -> None:
    """Make the consumer leave and rejoin its group (a rebalance), on the aiokafka driver's
    consumer thread, where its coordinator lives."""
    await consumer._thread.call_thread(_rejoin, consumer._thread)


async def _rejoin(thread) -> None:
    thread._ensure_consumer()._coordinator.request_rejoin()


def install() -> None:
    """Patch faust's Consumer (idempotent: a second call changes nothing)."""
    consumer = faust.transport.consumer.Consumer
    # method-assign ignored: replacing faust's methods is what this module is for
    if not installed("ack"):
        consumer.ack = _ack_only_processed(consumer.ack)  # type: ignore[method-assign]
    if not installed("perform_seek"):
        consumer.perform_seek = _seek_uncommitted_to_beginning(consumer.perform_seek)  # type: ignore[method-assign]
    thread = faust.transport.drivers.aiokafka.AIOKafkaConsumerThread
    if not getattr(thread.verify_event_path, "memstream_patched", False):
        thread.verify_event_path = _verify_positioned(thread.verify_event_path)  # type: ignore[method-assign]
    producer = faust.transport.drivers.aiokafka.Producer
    if not getattr(producer._settings_extra, "memstream_patched", False):
        producer._settings_extra = _idempotent(producer._settings_extra)  # type: ignore[method-assign]


def installed(method: str) -> bool:
    return getattr(getattr(faust.transport.consumer.Consumer, method), "memstream_patched", False)
