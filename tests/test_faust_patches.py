"""workers/faust_patches.py: what the two consumer patches rely on in faust-streaming, and what
they do. A faust release that renames or reshapes any of it fails here, before a worker runs
with a patch that silently does nothing (or breaks effectively-once)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import faust.transport.consumer
import faust.transport.drivers.aiokafka as aiokafka_driver
from faust.types import TP

from workers import faust_patches

ROOT = Path(__file__).resolve().parent.parent
Consumer = faust.transport.consumer.Consumer


def test_the_installed_faust_is_the_pinned_tested_minor_version():
    pinned = next(
        d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("faust-streaming")
    )
    assert re.fullmatch(r"faust-streaming>=0\.15\.\d+,<0\.16", pinned), pinned
    installed = tuple(int(x) for x in importlib.metadata.version("faust-streaming").split(".")[:2])
    assert installed == faust_patches.TESTED_MINOR


def test_faust_has_what_the_patches_rely_on():
    """The methods' names and shapes, and the consumer state the rewind reads."""
    assert list(inspect.signature(Consumer.ack).parameters) == ["self", "message"]
    assert inspect.iscoroutinefunction(Consumer.perform_seek) and list(
        inspect.signature(Consumer.perform_seek).parameters
    ) == ["self"]
    source = inspect.getsource(Consumer.__init__)
    assert "self._committed_offset" in source and "self._read_offset" in source
    assert callable(Consumer.assignment)
    assert "self._thread" in inspect.getsource(aiokafka_driver.Consumer)
    assert inspect.iscoroutinefunction(aiokafka_driver.ConsumerThread.seek_to_beginning)


def test_install_patches_once_and_only_once():
    faust_patches.install()
    ack, seek = Consumer.ack, Consumer.perform_seek
    faust_patches.install()
    assert Consumer.ack is ack and Consumer.perform_seek is seek
    assert faust_patches.installed("ack") and faust_patches.installed("perform_seek")


def test_the_worker_installs_them_when_it_builds_its_app():
    source = inspect.getsource(__import__("workers.app", fromlist=["create_app"]).create_app)
    assert "faust_patches.install()" in source


def test_only_a_processed_message_is_acked():
    acked = []
    ack = faust_patches._ack_only_processed(lambda self, message: acked.append(message) or True)
    skipped, processed = SimpleNamespace(), SimpleNamespace(memstream_processed=True)
    assert ack(None, skipped) is False and ack(None, processed) is True
    assert acked == [processed]


def test_a_partition_without_a_committed_offset_is_read_again_from_the_beginning():
    """After faust's own seek, the partitions with no committed offset are sought to the
    beginning on the driver's consumer thread, and faust's read offset of each is cleared."""
    sought, done = [], []

    async def perform_seek(self):
        done.append(True)

    class Thread:
        async def seek_to_beginning(self, *partitions):
            sought.extend(partitions)

    fresh, committed, assignor = TP("t.chunks", 0), TP("t.chunks", 1), TP("t.__assignor-__leader", 0)
    consumer = SimpleNamespace(
        _thread=Thread(),
        _committed_offset={committed: 42},
        _read_offset={fresh: 7, committed: 42},
        assignment=lambda: {fresh, committed, assignor},
    )
    asyncio.run(faust_patches._seek_uncommitted_to_beginning(perform_seek)(consumer))
    assert done == [True]
    assert [(p.topic, p.partition) for p in sought] == [("t.chunks", 0)]
    assert consumer._read_offset == {fresh: None, committed: 42}


def test_faust_and_aiokafka_have_what_liveness_relies_on():
    """workers.liveness reads committed offsets and makes the consumer rejoin through these."""
    import aiokafka.consumer.group_coordinator as coordinator

    assert inspect.iscoroutinefunction(Consumer.highwaters) and callable(Consumer.pause_partitions)
    assert inspect.iscoroutinefunction(aiokafka_driver.AIOKafkaConsumerThread.call_thread)
    assert callable(aiokafka_driver.AIOKafkaConsumerThread._ensure_consumer)
    assert "_coordinator" in inspect.getsource(__import__("aiokafka").AIOKafkaConsumer)
    assert callable(coordinator.GroupCoordinator.request_rejoin)


def test_a_rejoin_is_asked_of_the_coordinator_on_the_consumer_thread():
    calls = []

    class Thread:
        def _ensure_consumer(self):
            return SimpleNamespace(_coordinator=SimpleNamespace(request_rejoin=lambda: calls.append("rejoin")))

        async def call_thread(self, fun, *args):
            calls.append("on thread")
            return await fun(*args)

    asyncio.run(faust_patches.request_rejoin(SimpleNamespace(_thread=Thread())))
    assert calls == ["on thread", "rejoin"]
    consumer = SimpleNamespace(_committed_offset={TP("t", 0): 5})
    assert faust_patches.committed_offsets(consumer, [TP("t", 0), TP("t", 1)]) == {TP("t", 0): 5, TP("t", 1): None}


def test_the_producer_is_idempotent_outside_transactions_too():
    """faust asks aiokafka for an idempotent producer only inside a transaction; the patch asks
    for one always, so a send retried across a leader change is written once."""
    faust_patches.install()
    app = SimpleNamespace(in_transaction=False)
    extra = aiokafka_driver.Producer._settings_extra(SimpleNamespace(app=app))
    assert extra["acks"] == "all" and extra["enable_idempotence"] is True


def _thread_with_partition_awaiting_reset(tp: TP):
    """faust's real consumer thread class, bare, over aiokafka's real subscription state: one
    partition fetched before (a poll timestamp), then sought back, so it awaits a reset."""
    from aiokafka.consumer.subscription_state import SubscriptionState
    from aiokafka.structs import OffsetAndMetadata
    from aiokafka.structs import TopicPartition as AIOKafkaTP

    subscriptions = SubscriptionState()
    subscriptions.assign_from_user({AIOKafkaTP(tp.topic, tp.partition)})
    state = subscriptions.subscription.assignment.state_value(AIOKafkaTP(tp.topic, tp.partition))
    state.update_committed(OffsetAndMetadata(3, ""))
    state.reset_to(3)
    state.timestamp = int(time.time() * 1000)
    state.await_reset(0)  # what a seek to the beginning does
    thread = aiokafka_driver.AIOKafkaConsumerThread.__new__(aiokafka_driver.AIOKafkaConsumerThread)
    thread._consumer = SimpleNamespace(_fetcher=SimpleNamespace(_subscriptions=subscriptions))
    thread._ensure_consumer = lambda: thread._consumer
    thread.time_started = time.monotonic() - 600
    thread.tp_fetch_request_timeout_secs = thread.tp_stream_timeout_secs = thread.tp_commit_timeout_secs = 300.0
    monitor = SimpleNamespace(stream_inbound_time={})
    thread.consumer = SimpleNamespace(
        app=SimpleNamespace(monitor=monitor, topics=SimpleNamespace(acks_enabled_for=bool))
    )
    return thread


def test_the_livelock_check_skips_a_partition_awaiting_a_reset():
    """faust's livelock check read the position of a partition sought back after a rebalance
    through aiokafka's asserting accessor: the survivor of a SIGKILL crashed on it in CI
    (tests/test_crash.py). Patched, the check passes over it until the fetcher resets it."""

    async def check() -> None:
        tp = TP("t.chunks", 0)
        thread = _thread_with_partition_awaiting_reset(tp)
        faust_patches.install()
        assert aiokafka_driver.AIOKafkaConsumerThread.verify_event_path(thread, time.monotonic(), tp) is None
        unpatched = aiokafka_driver.AIOKafkaConsumerThread.verify_event_path.__wrapped_verify__
        try:
            unpatched(thread, time.monotonic(), tp)
        except AssertionError:
            return
        raise AssertionError("faust's own check no longer asserts on a partition awaiting a reset: drop the patch")

    asyncio.run(check())
