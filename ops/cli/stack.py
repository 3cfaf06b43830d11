"""`memstream stack`, `topics`, `worker` and `demo`: the local services (ops.stack), the topics
and the worker processes on them."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from ops.cli.numbers import positive_int
from topics import BadInput
from workers.retry import backoff
from workers.roles import EMBEDDING_ROLES, parse_roles
from workers.settings import Settings


def add_parsers(sub) -> None:
    """Its commands' parsers, on the `memstream` parser's subparsers."""
    stack = sub.add_parser("stack", help="local Kafka + Redis")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="up: Kafka brokers (default MEMSTREAM_KAFKA_BROKERS, 1); 3: topics replicated 3 times, min.insync.replicas 2",
    )
    stack.add_argument(
        "--redis-cluster",
        type=int,
        default=None,
        metavar="SHARDS",
        help="up: Redis as a cluster of SHARDS shards (default MEMSTREAM_REDIS_SHARDS, 1: one server), printed as "
        "a redis+cluster:// URL; the store runs on it, each tenant on its slot's shard",
    )

    topics = sub.add_parser("topics", help="create the topics before workers start")
    topics.add_argument("action", choices=["create"])
    topics.add_argument(
        "--partitions", type=positive_int, default=None, help="partitions per topic (default MEMSTREAM_PARTITIONS)"
    )

    worker = sub.add_parser(
        "worker", help="run workers (indexing roles: one faust app; query alone: an HTTP server on Redis only)"
    )
    worker.add_argument("--role", default="all", help="all|chunker|extractor|detector|resolver|query (comma-separated)")

    sub.add_parser("demo", help="stack up, workers, sample corpus, sample queries")


def cmd_stack(settings: Settings, args) -> int:
    from ops.stack.services import Stack, StackError, stderr

    if args.brokers is not None:
        if args.brokers < 1:
            raise BadInput("--brokers: at least 1")
        settings = dataclasses.replace(settings, kafka_brokers=args.brokers, kafka_bootstrap="")
    if args.redis_cluster is not None:
        if args.redis_cluster < 1:
            raise BadInput("--redis-cluster: at least 1 shard")
        settings = dataclasses.replace(settings, redis_shards=args.redis_cluster)
    stack = Stack(settings)
    try:
        if args.action == "up":
            stack.up(stderr)
            print("\n".join(stack.exports()))
        elif args.action == "down":
            stack.down(stderr)
        else:
            for name, state in stack.status().items():
                print(f"{name}: {state}")
    except StackError as exc:
        print(f"memstream stack: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_topics(settings: Settings, args) -> int:
    from ops.stack.kafka_admin import ensure_topics

    created = ensure_topics(settings, args.partitions)
    print(f"created: {', '.join(created) or 'none (all exist)'}")
    return 0


def cmd_worker(settings: Settings, args) -> int:
    logging.basicConfig(level=settings.log_level_name, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    roles = parse_roles(args.role)
    if (
        roles & EMBEDDING_ROLES and settings.embedder == "local"
    ):  # an install without the extra fails now, not after Kafka is up
        from workers.models.embedding import require_local_extra

        require_local_extra()
    if roles == {"query"}:
        # The HTTP API alone needs only Redis: no Kafka client, and workers.app (faust) is not
        # even imported. Indexing roles, with or without query, are one faust worker.
        from workers.query.server import run_query_server

        run_query_server(settings)
        return 0
    if "query" in roles:  # refused keys or an unprotected address fail now, not after waiting for Kafka
        from workers.query.auth import check_listener
        from workers.query.server import settings_keys

        check_listener(settings.http_host, settings.http_port, settings_keys(settings))
    from ops.stack.kafka_admin import ensure_topics
    from workers.app import run_worker

    # A worker (re)started while the broker restarts waits for it, up to the outage deadline,
    # instead of exiting; a fresh admin client each try (kafka-python's reconnect backoff grows
    # to 30 s and outlasted a broker that was back after 20 s)
    started, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        try:
            # one try never outlasts the deadline (kafka-python waits 30 s to bootstrap by default)
            ensure_topics(
                settings, connect_timeout_s=min(30.0, settings.outage_deadline - (time.monotonic() - started))
            )
            break
        except Exception as exc:  # NoBrokersAvailable, KafkaTimeoutError, topics not visible yet
            waited = time.monotonic() - started
            if waited >= settings.outage_deadline:
                logging.getLogger("memstream.worker").error(
                    "gave up waiting for Kafka at %s after %.0fs (MEMSTREAM_OUTAGE_DEADLINE)",
                    settings.kafka_bootstrap,
                    waited,
                )
                raise
            logging.getLogger("memstream.worker").warning(
                "waiting for Kafka at %s, %.0fs so far (%s: %s)",
                settings.kafka_bootstrap,
                waited,
                type(exc).__name__,
                exc,
            )
            time.sleep(backoff(attempt, 0.5, 5.0))
    run_worker(settings, roles)
    return 0


def cmd_demo(settings: Settings, args) -> int:
    from ops.demo import run_demo

    return run_demo(settings)


COMMANDS = {
    "stack": cmd_stack,
    "topics": cmd_topics,
    "worker": cmd_worker,
    "demo": cmd_demo,
}
