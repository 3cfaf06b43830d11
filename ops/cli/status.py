"""`memstream status`, `tail`, `tenants` and `export`: where the pipeline stands, its events, the
tenants in Redis and a tenant's whole memory."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from ops.cli.numbers import positive_int, seconds
from topics import ContractError, FactEvent, decode, tenant_or_default, validate_tenant
from workers.settings import Settings

MAX_SAMPLE_S = 3600.0  # a throughput sample of an hour is already long; inf overflowed time.sleep


def add_parsers(sub) -> None:
    """Its commands' parsers, on the `memstream` parser's subparsers."""
    tenants = sub.add_parser("tenants", help="the tenants in Redis, with their passages, facts, entities and schemas")
    tenants.add_argument("--json", action="store_true")

    status_cmd = sub.add_parser(
        "status",
        help="where the pipeline stands: lag and throughput per stage, dead letters; a tenant's documents and facts",
    )
    status_cmd.add_argument("--tenant", default=None)
    status_cmd.add_argument("--json", action="store_true")
    status_cmd.add_argument(
        "--sample",
        type=seconds(zero=True, most=MAX_SAMPLE_S),
        default=2.0,
        help=f"seconds over which throughput is measured, 0 to {MAX_SAMPLE_S:g} (default 2)",
    )
    tail = sub.add_parser("tail", help="print memstream.indexed-facts events as JSON lines")
    tail.add_argument("--tenant", default=None)
    tail.add_argument("--from-beginning", action="store_true")
    tail.add_argument("--limit", type=positive_int, default=None, help="stop after this many events")
    tail.add_argument(
        "--idle-timeout", type=seconds(), default=None, help="stop after this many seconds without events"
    )

    export = sub.add_parser("export", help="a tenant's whole memory, canonical and sorted")
    export.add_argument("--tenant", default=None)
    export.add_argument("--format", choices=["json", "graphml"], default="json")


def cmd_status(settings: Settings, args) -> int:
    from ops.status import render, status

    tenant = validate_tenant(args.tenant) if args.tenant is not None else None
    report = status(settings, tenant, args.sample)
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0


def cmd_tail(settings: Settings, args) -> int:
    from kafka import KafkaConsumer, TopicPartition

    tenant = validate_tenant(args.tenant) if args.tenant is not None else None
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False)
    topic = settings.topics.indexed_facts
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
    if not partitions:
        print(f"memstream tail: topic {topic} does not exist yet (start a worker first)", file=sys.stderr)
        return 1
    consumer.assign(partitions)
    (consumer.seek_to_beginning if args.from_beginning else consumer.seek_to_end)(*partitions)
    printed, last_event = 0, time.monotonic()
    try:
        while args.limit is None or printed < args.limit:
            batch = consumer.poll(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    last_event = time.monotonic()
                    try:
                        event = decode(FactEvent, record.value)
                    except ContractError as exc:
                        print(f"memstream tail: skipped offset {record.offset}: {exc}", file=sys.stderr)
                        continue
                    if tenant and event.tenant != tenant:
                        continue
                    print(json.dumps(event.to_dict(), ensure_ascii=False), flush=True)
                    printed += 1
                    if args.limit is not None and printed >= args.limit:
                        return 0
            if args.idle_timeout is not None and time.monotonic() - last_event > args.idle_timeout:
                return 0
    finally:
        consumer.close()
    return 0


def cmd_tenants(settings: Settings, args) -> int:
    from store import Memory
    from store.keys import LAYERS

    async def read():
        memory = Memory.from_url(settings.redis_url)
        try:
            return await memory.tenant_counts()
        finally:
            await memory.close()

    counts = asyncio.run(read())
    if args.json:
        print(json.dumps(counts, indent=1))
        return 0
    print(f"{'tenant':<40}" + "".join(f" {layer:>10}" for layer in LAYERS))
    for tenant, per_layer in counts.items():
        print(f"{tenant:<40}" + "".join(f" {per_layer[layer]:>10}" for layer in LAYERS))
    return 0


def cmd_export(settings: Settings, args) -> int:
    from ops.export import export_tenant, to_graphml

    tenant = tenant_or_default(args.tenant, settings.tenant)
    memory, known = export_tenant(settings, tenant)
    if not known:  # as `query` and `status` warn: an empty export of a misspelt tenant said nothing
        print(
            f"memstream export: warning: tenant {tenant!r} holds no memory (nothing was ever indexed for it)",
            file=sys.stderr,
        )
    if args.format == "graphml":
        print(to_graphml(memory))
    else:
        print(json.dumps(memory, ensure_ascii=False, indent=1, sort_keys=True))
    return 0


COMMANDS = {
    "status": cmd_status,
    "tail": cmd_tail,
    "tenants": cmd_tenants,
    "export": cmd_export,
}
