"""`memstream rebuild [--tenant T] [--wait]`: a tenant's memory (or every tenant's) built again
from the documents log — e.g. after a backup was restored for one tenant by hand, after its keys
were damaged, or to make sure memory is a function of the log.

Workers already catch Redis up on their own when it lost writes (workers.recovery: each stage
reads its input again from the first message whose effects Redis lacks). This command does the
same on request, from the one topic that holds every current document whatever the others'
retention kept: `memstream.documents`, compacted by key (tenant/doc id). It reads that topic up
to its current end, keeps each document's last message (a tombstone or an erasure: the document
is gone), erases the tenant's memory — not its model-cache entries: the same texts get the same
answers and vectors again, with no model call — and publishes each current document again; the
workers index them as new. `--wait` returns once they are all indexed, with progress.

Run it with nothing else being published for the tenant: a version published meanwhile is
indexed, but one still in flight from before the erasure may land before it."""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from topics import BadInput, Document
from workers.envelope import decode_document
from workers.settings import Settings

# How long the read of the documents topic waits with no partition's position moving: a broker
# or a partition's leader gone mid-read made poll() answer nothing, and the loop asked again
# forever (found in a review); a read advances each poll while the log answers.
READ_STALL_S = 60.0


def current_documents(settings: Settings, tenant: str | None = None) -> tuple[dict[str, list[Document]], int]:
    """tenant → its current documents (their last message on `documents`, tombstoned and erased
    ones left out), read up to the topic's end as it was when called; and how many messages
    were unreadable (they went to the dead-letter topic when the chunker met them)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes),
        fetch_max_bytes=max(52_428_800, settings.max_message_bytes),
    )
    latest: dict[str, Document | None] = {}
    unreadable = 0
    try:
        topic = settings.topics.documents
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not partitions:
            return {}, 0
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        progress, moved = None, time.monotonic()
        while behind := {tp: at for tp in partitions if (at := consumer.position(tp)) < ends[tp]}:
            if behind != progress:
                progress, moved = behind, time.monotonic()
            elif time.monotonic() - moved >= READ_STALL_S:
                stuck = ", ".join(f"{tp.partition} at {at} of {ends[tp]}" for tp, at in sorted(behind.items()))
                raise RuntimeError(
                    f"rebuild: reading {topic} made no progress in {READ_STALL_S:.0f} s (partitions {stuck}); "
                    f"is Kafka at {settings.kafka_bootstrap} up? Nothing was erased"
                )
            for tp, records in consumer.poll(timeout_ms=1000, max_records=5000).items():
                for record in records:
                    if record.offset >= ends[tp] or record.key is None:
                        continue
                    key = record.key.decode("utf-8", errors="replace")
                    if tenant is not None and key.split("/", 1)[0] != tenant:
                        continue
                    try:
                        found = decode_document(record.value, record.key, settings.max_text_bytes)
                    except Exception:
                        unreadable += 1
                        continue
                    latest[key] = found if isinstance(found, Document) else None
    finally:
        consumer.close()
    by_tenant: dict[str, list[Document]] = defaultdict(list)
    for doc in latest.values():
        if doc is not None:
            by_tenant[doc.tenant].append(doc)
    return dict(by_tenant), unreadable


def rebuild(settings: Settings, tenant: str | None, wait_s: float | None, quiet: bool = False) -> int:
    """The command: read, erase, publish again, and with `wait_s` wait. Returns the exit code."""
    import asyncio

    from ops.publish import publish, wait_indexed
    from store import Memory

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    documents, unreadable = current_documents(settings, tenant)
    if unreadable:
        say(f"rebuild: {unreadable} unreadable messages on {settings.topics.documents} left out (see the dead letters)")
    if tenant is not None and tenant not in documents:
        # erasing it would leave nothing: a misspelt tenant, a log emptied or a Kafka that is not
        # this memory's own (an audit: `rebuild --tenant nosuch` erased keys and said nothing)
        raise BadInput(
            f"rebuild: {settings.topics.documents} holds no current document of tenant {tenant!r}: nothing to "
            "rebuild it from, so its memory is left as it is (`memstream tenant delete --purge` erases a tenant)"
        )
    tenants = [tenant] if tenant is not None else sorted(documents)
    if not tenants:
        say(f"rebuild: no document on {settings.topics.documents}: nothing to rebuild")
        return 0

    async def erase() -> dict[str, dict[str, int]]:
        memory = Memory.from_url(settings.redis_url)
        try:
            gone = {}
            for name in tenants:  # the model caches kept: the same texts cost no model call again
                gone[name] = await memory.purge_tenant(name, lambda passages: [], lambda *layers: [])
            return gone
        finally:
            await memory.close()

    for name, gone in asyncio.run(erase()).items():
        erased = ", ".join(f"{n} {what}" for what, n in gone.items())
        say(f"rebuild: tenant {name}: erased {erased}; {len(documents.get(name, []))} current documents to index")
    every = [doc for name in tenants for doc in documents.get(name, [])]
    if every:
        publish(settings, every, quiet=quiet)
    if wait_s is None or not every:
        return 0
    pending = wait_indexed(settings, every, wait_s, quiet=quiet)
    if pending:
        say(f"rebuild: {len(pending)} documents not indexed within {wait_s:.0f}s: {', '.join(pending[:10])}")
        return 1
    return 0
