"""The `memstream` command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ops.answer_format import format_answer, query_endpoint, read_answer
from store.errors import RedisClusterNode
from topics import BadInput, ContractError, FactEvent, decode, tenant_or_default, validate_tenant
from workers.query.modes import DEFAULT_MODE, MAX_TOP_K, mode_names, registered
from workers.retry import backoff
from workers.roles import EMBEDDING_ROLES, parse_roles
from workers.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memstream", description="Streaming graph memory on Kafka and Redis.")
    sub = parser.add_subparsers(dest="command", required=True)

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
        help="up: Redis as a cluster of SHARDS shards (default MEMSTREAM_REDIS_SHARDS, 1: one server); "
        "the store does not run on a cluster yet",
    )

    topics = sub.add_parser("topics", help="create the topics before workers start")
    topics.add_argument("action", choices=["create"])
    topics.add_argument("--partitions", type=int, default=None)

    worker = sub.add_parser(
        "worker", help="run workers (indexing roles: one faust app; query alone: an HTTP server on Redis only)"
    )
    worker.add_argument("--role", default="all", help="all|chunker|extractor|detector|resolver|query (comma-separated)")

    pub = sub.add_parser(
        "publish", help="publish documents (and conversation turns: one document each) to memstream.documents"
    )
    pub.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help=".txt .md .json (documents, or a LoCoMo-layout conversation) .jsonl (documents and turns) file, a folder of them, or - for stdin",
    )
    pub.add_argument("--tenant", default=None)
    pub.add_argument(
        "--version",
        type=int,
        default=None,
        help="the version of documents that name none (default: the time now in ms, so a file published again replaces its last version)",
    )
    pub.add_argument("--wait", action="store_true", help="return once every document is fully indexed")
    pub.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    delete = sub.add_parser("delete", help="take documents out of memory: a tombstone each on memstream.documents")
    delete.add_argument("doc_ids", nargs="+", metavar="DOC_ID")
    delete.add_argument("--tenant", default=None)
    delete.add_argument(
        "--purge",
        action="store_true",
        help="erase: every version's text, vectors and passages, and the facts and entities only they gave, "
        "leave Redis with their model-cache entries (a `purged` event says what went)",
    )
    delete.add_argument(
        "--wait",
        action="store_true",
        help="return once the pipeline has taken every document out (with --purge: erased it)",
    )
    delete.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")

    retract = sub.add_parser("retract", help="take a fact out of memory (a passage that says it again brings it back)")
    retract.add_argument("fact_id", metavar="FACT_ID")
    retract.add_argument("--tenant", default=None)
    retract.add_argument("--reason", default="", help="kept with the fact and told in its `retracted` event")

    tenant_cmd = sub.add_parser("tenant", help="one tenant: delete it")
    tenant_cmd.add_argument("action", choices=["delete"])
    tenant_cmd.add_argument("name", metavar="TENANT")
    tenant_cmd.add_argument(
        "--purge",
        action="store_true",
        help="required: erase every key of the tenant, its indexes and the model-cache entries of its texts",
    )

    rebuild = sub.add_parser(
        "rebuild",
        help="build a tenant's memory (or every tenant's) again from memstream.documents: its memory erased, its "
        "current documents published again (workers catch up a Redis that lost writes on their own)",
    )
    rebuild.add_argument("--tenant", default=None, help="only this tenant (default: every tenant with documents)")
    rebuild.add_argument("--wait", action="store_true", help="return once every document is indexed again")
    rebuild.add_argument("--timeout", type=float, default=600.0, help="--wait: seconds at most (default 600)")

    tenants = sub.add_parser("tenants", help="the tenants in Redis, with their passages, facts, entities and schemas")
    tenants.add_argument("--json", action="store_true")

    migrate = sub.add_parser(
        "migrate",
        help="move tenants made before shared indexes onto them, and float32 vectors to float16 (idempotent; stop the workers first)",
    )
    migrate.add_argument("--dry-run", action="store_true", help="only list the tenants still to move")
    migrate.add_argument("--tenant", action="append", default=None, help="move only this tenant (repeatable)")

    status_cmd = sub.add_parser(
        "status",
        help="where the pipeline stands: lag and throughput per stage, dead letters; a tenant's documents and facts",
    )
    status_cmd.add_argument("--tenant", default=None)
    status_cmd.add_argument("--json", action="store_true")
    status_cmd.add_argument(
        "--sample", type=float, default=2.0, help="seconds over which throughput is measured (default 2)"
    )
    tail = sub.add_parser("tail", help="print memstream.indexed-facts events as JSON lines")
    tail.add_argument("--tenant", default=None)
    tail.add_argument("--from-beginning", action="store_true")
    tail.add_argument("--limit", type=int, default=None)
    tail.add_argument("--idle-timeout", type=float, default=None, help="stop after this many seconds without events")

    query = sub.add_parser("query", help="query the memory over HTTP")
    query.add_argument("text")
    query.add_argument("--tenant", default=None)
    query.add_argument("--top-k", type=_top_k, default=None, help=f"passages to return, 1 to {MAX_TOP_K}")
    query.add_argument(
        "--mode",
        choices=mode_names(),
        default=DEFAULT_MODE,
        help="; ".join(f"{mode.name}: {mode.hint}" for mode in registered()),
    )
    query.add_argument(
        "--as-of",
        default=None,
        metavar="TIME",
        help="answer from the memory as it was at this ISO 8601 time (e.g. 2026-05-01T12:00:00Z)",
    )
    query.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a retrieval parameter for this query (repeatable; VALUE as JSON: 0.5, false, 10), e.g. --param damping=0.7",
    )
    query.add_argument(
        "--answer", action="store_true", help="generate an answer with citations (the query worker needs an LLM)"
    )
    query.add_argument("--json", action="store_true", help="print the response body unchanged")
    query.add_argument(
        "--url", default=None, help="query endpoint base URL (default http://MEMSTREAM_HTTP_HOST:MEMSTREAM_HTTP_PORT)"
    )

    alias = sub.add_parser("alias", help="entity aliases of a tenant (applied to what is extracted afterwards)")
    alias.add_argument("action", choices=["add", "list"])
    alias.add_argument("names", nargs="*", metavar="NAME", help="add: ALIAS CANONICAL")
    alias.add_argument("--tenant", default=None)

    export = sub.add_parser("export", help="a tenant's whole memory, canonical and sorted")
    export.add_argument("--tenant", default=None)
    export.add_argument("--format", choices=["json", "graphml"], default="json")

    bench = sub.add_parser("bench", help="benchmarks (run on the local stack)")
    bench.add_argument(
        "kind",
        choices=["index", "recall", "ppr", "load", "conversation", "memory-tax", "wait", "tenants", "graph", "scale"],
    )
    bench.add_argument("--dataset", choices=["musique", "hotpotqa"], default="musique", help="recall/load: the QA set")
    bench.add_argument(
        "--extractor", choices=["replay", "rules"], default="replay", help="recall: how the corpus is extracted"
    )
    bench.add_argument(
        "--data", default=None, help="recall/ppr/load: folder holding <dataset>_train_100/ (default ../shared/data)"
    )
    bench.add_argument(
        "--tenant", default=None, help="recall/ppr/load: index into (or reuse) this tenant instead of a fresh one"
    )
    bench.add_argument(
        "--no-index-ablations", action="store_true", help="recall: skip ablations that index the corpus again"
    )
    bench.add_argument("--edges", default="10000,100000,1000000", help="ppr: synthetic graph sizes in edges")
    bench.add_argument(
        "--queries",
        type=int,
        default=100,
        help="ppr: queries per measurement; tenants: per tenant and round; scale: per mode and round",
    )
    bench.add_argument(
        "--sizes",
        default=None,
        help="index: memory sizes in passages (default 1000,5000,20000); graph, scale: the tenant sizes, as --passages",
    )
    bench.add_argument("--probe", type=int, default=20, help="documents timed one by one at each size")
    bench.add_argument("--burst", type=int, default=200, help="documents published at once for throughput")
    bench.add_argument("--latency-ms", type=int, default=200, help="the fake LLM's fixed latency")
    bench.add_argument("--concurrency", type=int, default=8, help="LLM calls in flight per extractor process")
    bench.add_argument(
        "--extractors",
        default="1",
        help="index: extractor processes, comma-separated counts measured side by side (e.g. 1,2)",
    )
    bench.add_argument("--partitions", type=int, default=4, help="index: partitions per topic")
    bench.add_argument(
        "--embedder",
        choices=["local", "fake"],
        default="local",
        help="index: the local model, or a fake embeddings endpoint (CPU not the bound)",
    )
    bench.add_argument("--clients", default="1,16,64", help="load: concurrent clients, one level each")
    bench.add_argument("--seconds", type=float, default=10.0, help="load: seconds per client level")
    bench.add_argument(
        "--passages",
        default=None,
        help="load: passages indexed into a fresh tenant when --tenant is not given (default 50); tenants: per tenant (default 20); graph, scale: the tenant sizes, comma-separated (default 5000,50000,200000)",
    )
    bench.add_argument("--url", default=None, help="load: the query worker to load (default: one started here)")
    bench.add_argument("--json", action="store_true")
    # bench index --rules (ops/bench/rules.py)
    bench.add_argument(
        "--rules",
        action="store_true",
        help="index: the rules pipeline on HotpotQA-100 against the embedding-bound limit",
    )
    bench.add_argument(
        "--docs", type=int, default=None, help="index --rules: the first N documents of HotpotQA-100 (default 100)"
    )
    # bench conversation (ops/bench/conversation.py)
    bench.add_argument(
        "file", nargs="?", metavar="FILE", help="conversation: a LoCoMo-layout file (default: the sample conversation)"
    )
    bench.add_argument(
        "--modes",
        default=None,
        help="conversation: query modes, comma-separated (default: every mode of the query engine)",
    )
    bench.add_argument(
        "--redis-url",
        default=None,
        help="conversation: index into fresh tenants of this Redis instead of an in-memory store; graph: write the graphs there (kept, reused) instead of a Redis of its own",
    )
    bench.add_argument(
        "--ablations",
        action="store_true",
        help="conversation: also ask each ablation of the graph modes (ops/bench/conversation.py ABLATIONS)",
    )
    # bench wait (ops/bench/wait.py)
    bench.add_argument("--pending", type=int, default=5000, help="wait: documents published that no worker consumes")
    bench.add_argument("--window", type=float, default=30.0, help="wait: seconds of --wait measured")
    bench.add_argument(
        "--baseline-tree",
        default=None,
        metavar="DIR",
        help="wait: also measure the CLI of this checkout; index --rules: also run its workers (e.g. a git worktree of an older commit), side by side; tenants, graph: measure it too, interleaved",
    )
    # bench tenants (ops/bench/tenants.py)
    bench.add_argument("--tenants", type=int, default=10_000, help="tenants: how many small tenants")
    bench.add_argument("--large", type=int, default=5_000, help="tenants: passages of the one large tenant")
    bench.add_argument(
        "--dims",
        type=int,
        default=384,
        help="tenants: the vectors' size (384: the local embedder's; 1536: OpenAI's text-embedding-3-small)",
    )
    bench.add_argument("--idle", type=float, default=60.0, help="tenants: seconds of idle Redis CPU measured")
    bench.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="tenants: query rounds, alternating between this tree and the baseline (--queries each; default 5); graph: measurements per tree and size, alternating (default 2)",
    )
    bench.add_argument(
        "--baseline-tenants",
        type=int,
        default=None,
        help="tenants: how many small tenants the baseline tree writes (default --tenants)",
    )
    bench.add_argument(
        "--seen",
        action="store_true",
        help="wait: each document's status recorded as the chunker does (no chunk done), as in a busy pipeline",
    )

    sub.add_parser("demo", help="stack up, workers, sample corpus, sample queries")

    add_drilldown_commands(sub)

    keys = sub.add_parser("keys", help="API keys of the query worker: make one, or check and list the configured ones")
    keys.add_argument(
        "action", choices=["new", "list"], help="new: a fresh key and its entry; list: the configured keys (no hashes)"
    )
    keys.add_argument(
        "--tenant",
        action="append",
        default=None,
        help="new: a tenant the key may use (repeat, or comma-separated; * = every tenant)",
    )
    keys.add_argument("--scope", default="read", help="new: comma-separated, of read,write,answer,admin (default read)")
    keys.add_argument(
        "--name",
        default=None,
        help="new: the key's name in logs and 403 messages (default: key-<first hex of its hash>)",
    )

    for name, what, doc in (
        ("settings-table", "the MEMSTREAM_* settings as markdown tables, from workers/settings.py", "configuration"),
        ("stage-table", "each stage's module and topics as a markdown table, from topics/graph.py", "architecture"),
    ):
        table = sub.add_parser(name, help=f"{what} (docs/{doc}.md holds it)")
        table.add_argument(
            "--write",
            metavar="PATH",
            default=None,
            help=f"rewrite the generated table in this markdown file (docs/{doc}.md) instead of printing it",
        )

    mcp = sub.add_parser(
        "mcp",
        help="an MCP server of one tenant's memory on stdio, for agent frameworks (HTTP: /mcp of the query worker)",
    )
    mcp.add_argument(
        "--tenant", default=None, help="the one tenant this server reads and writes (default MEMSTREAM_TENANT)"
    )

    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        return COMMANDS[args.command](settings, args)
    # bad input (topics.BadInput: a flag, a setting, a file, a message) is said in one line, exit 2;
    # any other exception — a ValueError raised for a broken invariant too — is a bug: its traceback
    except (BadInput, FileNotFoundError, NotImplementedError) as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    # the stack or a worker failed to come up; a Redis the store refuses
    except (RuntimeError, RedisClusterNode) as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


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


def cmd_publish(settings: Settings, args) -> int:
    from ops.publish import load_documents, publish, publish_version, wait_indexed

    tenant = tenant_or_default(args.tenant, settings.tenant)
    if args.version is not None and args.version < 1:
        raise BadInput(f"--version must be at least 1, not {args.version}")
    loaded = load_documents(
        args.paths, tenant, settings.max_text_bytes, version=publish_version() if args.version is None else args.version
    )
    for error in loaded.errors:
        print(f"memstream publish: rejected {error}", file=sys.stderr)
    if loaded.documents:
        publish(settings, loaded.documents)
        if args.wait:
            pending = wait_indexed(settings, loaded.documents, args.timeout)
            if pending:
                print(
                    f"memstream publish: timed out after {args.timeout:g}s; not yet indexed: {', '.join(pending)}",
                    file=sys.stderr,
                )
                return 1
    return 2 if loaded.errors else 0


def cmd_delete(settings: Settings, args) -> int:
    from ops.publish import delete, wait_deleted

    tenant = tenant_or_default(args.tenant, settings.tenant)
    blank = [doc_id for doc_id in args.doc_ids if not doc_id.strip()]
    if blank:
        raise BadInput("a doc id to delete must not be empty")
    delete(settings, tenant, args.doc_ids, purge=args.purge)
    if args.wait:
        pending = wait_deleted(settings, tenant, args.doc_ids, args.timeout, purge=args.purge)
        if pending:
            print(
                f"memstream delete: timed out after {args.timeout:g}s; still in memory: {', '.join(pending)}",
                file=sys.stderr,
            )
            return 1
    return 0


def cmd_retract(settings: Settings, args) -> int:
    from ops.publish import retract

    work_id = retract(settings, tenant_or_default(args.tenant, settings.tenant), args.fact_id, args.reason)
    print(f"retraction of {args.fact_id} queued ({work_id}); `memstream tail` shows its event")
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


def cmd_migrate(settings: Settings, args) -> int:
    """Every tenant still on indexes of its own moved onto the shared ones, one at a time, each
    line printed as it is done; running it again finds nothing left."""
    from store import Memory

    async def run() -> int:
        memory = Memory.from_url(settings.redis_url, vector_index=settings.vector_index)
        try:
            tenants = [validate_tenant(t) for t in args.tenant] if args.tenant else await memory.legacy_tenants()
            print(
                f"{len(tenants)} tenant(s) on indexes of their own"
                + (": " + ", ".join(tenants) if args.dry_run and tenants else ""),
                flush=True,
            )
            float32 = [] if args.tenant else await memory.float32_indexes()
            print(
                f"{len(float32)} shared index(es) of float32 vectors"
                + (": " + ", ".join(float32) if args.dry_run and float32 else ""),
                flush=True,
            )
            if args.dry_run:
                return 0
            for n, tenant in enumerate(tenants, 1):
                started = time.monotonic()
                moved = await memory.migrate_tenant(tenant)
                print(
                    f"[{n}/{len(tenants)}] {tenant}: "
                    + ", ".join(f"{count} {layer}" for layer, count in moved.items())
                    + f" moved ({time.monotonic() - started:.1f} s)",
                    flush=True,
                )
            for name in float32:
                started = time.monotonic()
                count = await memory.migrate_vectors(name)
                print(
                    f"{name}: {count} records re-encoded as float16, index dropped ({time.monotonic() - started:.1f} s)",
                    flush=True,
                )
            return 0
        finally:
            await memory.close()

    return asyncio.run(run())


def cmd_tenant(settings: Settings, args) -> int:
    from ops.erase import publish_event, purge_tenant, tenant_purged_event
    from store import Memory

    tenant = validate_tenant(args.name)
    if not args.purge:
        raise BadInput(
            "memstream tenant delete erases the tenant for good: say so with --purge (stop the workers writing it first)"
        )

    async def purge():
        memory = Memory.from_url(settings.redis_url)
        try:
            return await purge_tenant(settings, memory, tenant)
        finally:
            await memory.close()

    gone = asyncio.run(purge())
    print(f"tenant {tenant} erased: " + ", ".join(f"{n} {what}" for what, n in gone.items()))
    try:
        publish_event(settings, tenant_purged_event(tenant, gone))
    except Exception as exc:  # the erasure is done; only its announcement is missing
        print(
            f"memstream tenant delete: erased, but the `purged` event was not published ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
    return 0


def cmd_rebuild(settings: Settings, args) -> int:
    from ops.rebuild import rebuild

    tenant = validate_tenant(args.tenant) if args.tenant is not None else None
    if not args.timeout > 0:
        raise BadInput("--timeout must be > 0 seconds")
    return rebuild(settings, tenant, args.timeout if args.wait else None)


def cmd_status(settings: Settings, args) -> int:
    from ops.status import render, status

    tenant = validate_tenant(args.tenant) if args.tenant is not None else None
    if not args.sample >= 0:
        raise BadInput("--sample must be >= 0 seconds")
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


def query_params(pairs: list[str]) -> dict:
    """`--param NAME=VALUE` pairs as the request's "params": each VALUE read as JSON, else as a
    string (the query worker checks names and types)."""
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise BadInput(f"--param {pair!r}: expected NAME=VALUE, e.g. --param damping=0.7")
        try:
            params[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[name.strip()] = value
    return params


def _top_k(value: str) -> int:
    """--top-k: an integer from 1 to MAX_TOP_K, as POST /v1/query takes it (0 asked the default)."""
    try:
        top_k = int(value)
    except ValueError:
        top_k = 0
    if not 1 <= top_k <= MAX_TOP_K:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_TOP_K}, not {value!r}")
    return top_k


def cmd_query(settings: Settings, args) -> int:
    body = {
        "query": args.text,
        "tenant": tenant_or_default(args.tenant, settings.tenant),
        "top_k": settings.top_k if args.top_k is None else args.top_k,
        "mode": args.mode,
        "answer": args.answer,
    }
    if args.as_of is not None:
        body["as_of"] = args.as_of  # checked by the query worker, which says what is wrong
    if args.param:
        body["params"] = query_params(args.param)
    headers = {"Content-Type": "application/json"}
    if settings.api_key:  # MEMSTREAM_API_KEY: a query worker with keys configured needs one
        headers["Authorization"] = f"Bearer {settings.api_key}"
    request = urllib.request.Request(
        query_endpoint(settings, args.url), data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        print(f"memstream query: HTTP {exc.code}: {exc.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(
            f"memstream query: cannot reach the query worker at {request.full_url} ({exc.reason}); is `memstream worker` running?",
            file=sys.stderr,
        )
        return 1
    result = read_answer(raw)
    if result.warning:
        print(f"memstream query: warning: {result.warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(raw.decode("utf-8"))
        return 0
    print(format_answer(result))
    return 0


def cmd_alias(settings: Settings, args) -> int:
    import asyncio

    from store import Memory
    from workers.algorithms.normalize import entity_id

    tenant = tenant_or_default(args.tenant, settings.tenant)
    if args.action == "add" and len(args.names) != 2:
        raise BadInput("usage: memstream alias add ALIAS CANONICAL [--tenant T]")

    async def run() -> None:
        memory = Memory.from_url(settings.redis_url)
        try:
            if args.action == "add":
                await memory.add_alias(tenant, entity_id(args.names[0]), entity_id(args.names[1]))
            for alias_id, canonical in sorted((await memory.alias_map(tenant)).items()):
                print(f"{alias_id} -> {canonical}")
        finally:
            await memory.close()

    asyncio.run(run())
    return 0


def cmd_export(settings: Settings, args) -> int:
    from ops.export import export_tenant, to_graphml

    memory = export_tenant(settings, tenant_or_default(args.tenant, settings.tenant))
    if args.format == "graphml":
        print(to_graphml(memory))
    else:
        print(json.dumps(memory, ensure_ascii=False, indent=1, sort_keys=True))
    return 0


def _counts(text: str, flag: str = "--sizes") -> list[int]:
    """A flag's comma-separated counts (passages, edges, clients, processes); ValueError naming
    the flag and the part that is not one. `--extractors 1,x` read int("x") and said only
    "invalid literal for int()", and `--clients 0` measured no client at all."""
    counts = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            raise BadInput(f"bench: {flag} takes counts, comma-separated; {part!r} is not one")
        counts.append(int(part))
    if flag != "--sizes" and (not counts or min(counts) < 1):  # a size of 0 is refused by its bench
        raise BadInput(f"bench: {flag} takes counts of at least 1, comma-separated, not {text!r}")
    return counts


def cmd_bench(settings: Settings, args) -> int:
    data = Path(args.data) if args.data else Path("..") / "shared" / "data"
    if args.kind == "memory-tax":  # offline: its own in-memory store, no stack
        from ops.bench.memory_tax import run_memory_tax_bench

        return run_memory_tax_bench(args.json)
    if args.kind == "conversation":
        from ops.bench.conversation import run_conversation_bench

        return run_conversation_bench(
            settings, Path(args.file) if args.file else None, args.modes, args.redis_url, args.json, args.ablations
        )
    if (args.rules or args.docs) and args.kind != "index":
        raise BadInput(f"--rules and --docs are options of bench index, not bench {args.kind}")
    if args.baseline_tree and args.kind not in ("index", "wait", "tenants", "graph", "scale"):
        raise BadInput(
            f"--baseline-tree is an option of bench index --rules, wait, tenants, graph and scale, not bench {args.kind}"
        )
    if args.file:
        raise BadInput(f"bench {args.kind} takes no FILE (only bench conversation does)")
    if args.sizes and (args.kind not in ("index", "graph", "scale") or args.rules):
        kind = f"{args.kind} --rules" if args.rules else args.kind
        raise BadInput(f"--sizes is an option of bench index (without --rules), graph and scale, not bench {kind}")
    if args.sizes and args.passages and args.kind in ("graph", "scale"):
        raise BadInput(f"bench {args.kind}: give the tenant sizes once, as --sizes or as --passages")
    if args.kind == "tenants":
        from ops.bench.tenants import run_tenant_bench

        return run_tenant_bench(
            settings,
            args.tenants,
            int(args.passages or 20),
            args.large,
            args.idle,
            args.queries,
            args.baseline_tree,
            args.baseline_tenants,
            args.json,
            dims=args.dims,
            rounds=args.rounds or 5,
        )
    if args.kind == "graph":
        from ops.bench.graph import run_graph_bench

        sizes = _counts(args.sizes or args.passages or "5000,50000,200000")
        return run_graph_bench(
            settings, sizes, args.queries, args.rounds or 2, args.baseline_tree, args.redis_url, args.json
        )
    if args.kind == "scale":
        from ops.bench.scale import run_scale_bench

        sizes = _counts(args.sizes or args.passages or "5000,50000,200000")
        return run_scale_bench(sizes, args.queries, args.rounds or 3, args.baseline_tree, data, args.json)
    if args.kind == "wait":
        from ops.bench.wait import run_wait_bench

        return run_wait_bench(settings, args.pending, args.window, args.baseline_tree, args.seen, args.json)
    if args.kind == "recall":
        from ops.bench.recall import run_recall_bench

        return run_recall_bench(
            settings, args.dataset, args.extractor, data, args.json, args.tenant, not args.no_index_ablations
        )
    if args.kind == "ppr":
        from ops.bench.ppr import run_ppr_bench

        return run_ppr_bench(settings, _counts(args.edges, "--edges"), args.queries, data, args.tenant, args.json)
    if args.kind == "load":
        from ops.bench.load import run_load_bench

        clients = _counts(args.clients, "--clients")
        return run_load_bench(
            settings,
            clients,
            args.seconds,
            args.tenant,
            args.url,
            args.dataset,
            data,
            int(args.passages or 50),
            args.json,
        )
    if args.rules:
        from ops.bench.rules import DEFAULT_DOCS, run_rules_bench

        return run_rules_bench(
            settings,
            data,
            args.docs or DEFAULT_DOCS,
            Path(args.baseline_tree) if args.baseline_tree else None,
            args.json,
        )
    from ops.bench.index import run_index_bench

    sizes = sorted(_counts(args.sizes or "1000,5000,20000"))
    extractors = _counts(args.extractors, "--extractors")
    return run_index_bench(
        settings,
        sizes,
        args.probe,
        args.burst,
        args.latency_ms,
        args.concurrency,
        args.json,
        extractors,
        args.partitions,
        args.embedder,
    )


# ---- drill-down: a fact, its evidence, a passage, the standing facts — what GET
# /v1/facts/{id}[/evidence], /v1/passages/{id} and /v1/facts?category= answer (workers.query.drilldown), read from Redis directly ---------------------
def add_drilldown_commands(sub) -> None:
    fact = sub.add_parser("fact", help="a fact of a tenant as JSON; --evidence: with the passages it came from")
    fact.add_argument("id", metavar="FACT_ID")
    fact.add_argument("--tenant", default=None)
    fact.add_argument("--evidence", action="store_true", help="also its passages, as published")
    facts = sub.add_parser(
        "facts", help="a tenant's standing facts as JSON (GET /v1/facts): constraints, rejected options, tool failures"
    )
    facts.add_argument("--tenant", default=None)
    facts.add_argument(
        "--category",
        default=None,
        help="comma-separated categories (default: HARD_CONSTRAINT,REJECTED_OPTION,TOOL_FAILURE)",
    )
    facts.add_argument("--limit", default=None, help="at most this many facts, 1 to 500 (default 50)")
    passage = sub.add_parser("passage", help="a passage of a tenant as JSON (text, doc_id, metadata, context)")
    passage.add_argument("id", metavar="PASSAGE_ID")
    passage.add_argument("--tenant", default=None)
    passage.add_argument(
        "--text", action="store_true", help="write only its text: the published bytes, nothing appended"
    )


def cmd_fact(settings: Settings, args) -> int:
    from workers.query import drilldown

    load = drilldown.fact_evidence if args.evidence else drilldown.fact_record
    return _drill(
        settings,
        args,
        "fact",
        lambda memory, tenant: load(memory, tenant, args.id),
        lambda found: _json_bytes(found.to_json()),
    )


def cmd_facts(settings: Settings, args) -> int:
    from workers.query import drilldown

    categories, limit = drilldown.fact_filter(args.category, args.limit)  # ContractError: exit 2 with its message
    return _drill(
        settings,
        args,
        "facts",
        lambda memory, tenant: drilldown.standing_facts(memory, tenant, categories, limit),
        lambda found: _json_bytes(found.to_json()),
    )


def cmd_passage(settings: Settings, args) -> int:
    from workers.query import drilldown

    return _drill(
        settings,
        args,
        "passage",
        lambda memory, tenant: drilldown.passage_record(memory, tenant, args.id),
        lambda found: found.text.encode("utf-8") if args.text else _json_bytes(found.to_json()),
    )


def _drill(settings: Settings, args, what: str, load, render) -> int:
    """Load a record from Redis (`load(memory, tenant)`: a workers.query.drilldown record) and
    write `render(record)` to stdout as bytes; a missing record or an unreachable Redis: a
    message on stderr, exit 1."""
    import asyncio

    from store import Memory
    from store.errors import redis_unavailable
    from workers.query import drilldown

    tenant = tenant_or_default(args.tenant, settings.tenant)

    async def run():
        memory = Memory.from_url(settings.redis_url)
        try:
            return await load(memory, tenant)
        finally:
            await memory.close()

    try:
        found = asyncio.run(run())
    except Exception as exc:
        if redis_unavailable(exc) is None:
            raise
        print(f"memstream {what}: cannot reach Redis at {settings.redis_url} ({exc})", file=sys.stderr)
        return 1
    if found is None:
        print(f"memstream {what}: {drilldown.missing(f'{what} {args.id!r}', tenant)}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(render(found))
    sys.stdout.buffer.flush()
    return 0


def _json_bytes(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False, indent=1) + "\n").encode("utf-8")


def cmd_demo(settings: Settings, args) -> int:
    from ops.demo import run_demo

    return run_demo(settings)


def cmd_keys(settings: Settings, args) -> int:
    from workers.query import auth
    from workers.query.server import settings_keys

    if args.action == "list":
        ring = settings_keys(settings)  # KeyConfigError (exit 2) names the entry and the problem
        if ring is None:
            print(
                "no API keys configured (MEMSTREAM_API_KEYS_FILE, MEMSTREAM_API_KEYS): the query worker serves loopback only",
                file=sys.stderr,
            )
            return 1
        for key in ring.keys:
            entry = key.entry()
            print(f"{entry['name']}: tenants {','.join(entry['tenants'])}; scopes {','.join(entry['scopes'])}")
        return 0
    tenants = [t.strip() for given in (args.tenant or []) for t in given.split(",") if t.strip()]
    if not tenants:
        raise BadInput("memstream keys new needs --tenant T (repeat it, or T1,T2; * for every tenant)")
    scopes = [s.strip() for s in args.scope.split(",") if s.strip()]
    token, entry = auth.new_key(args.name, tenants, scopes)  # KeyConfigError for a bad tenant or scope: exit 2
    print(
        "memstream keys: the key below is shown once; give it to the client (MEMSTREAM_API_KEY, or 'Authorization: Bearer <key>'),\n"
        "and add the JSON entry after it to the list in MEMSTREAM_API_KEYS_FILE (only its sha256 is stored):",
        file=sys.stderr,
    )
    print(token)
    print(json.dumps(entry))
    return 0


def cmd_settings_table(settings: Settings, args) -> int:
    from workers.settings import settings_table, with_settings_table

    return _generated_table("settings", settings_table, with_settings_table, args.write)


def cmd_stage_table(settings: Settings, args) -> int:
    from topics.graph import stage_table, with_stage_table

    return _generated_table("stage", stage_table, with_stage_table, args.write)


def _generated_table(what: str, table, with_table, write: str | None) -> int:
    """Print a generated table, or rewrite it in the markdown file `write`."""
    if write is None:
        print(table(), end="")
        return 0
    path = Path(write)
    document = path.read_text(encoding="utf-8")
    updated = with_table(document)
    if updated != document:
        path.write_text(updated, encoding="utf-8")
    print(f"memstream: {path}: the {what} table {'rewritten' if updated != document else 'was up to date'}")
    return 0


def cmd_mcp(settings: Settings, args) -> int:
    # stdout carries the protocol: every log line goes to stderr, configured before the SDK's own
    logging.basicConfig(
        level=settings.log_level_name, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from workers.query.mcp_server import run_stdio

    run_stdio(settings, tenant_or_default(args.tenant, settings.tenant))
    return 0


COMMANDS = {
    "stack": cmd_stack,
    "topics": cmd_topics,
    "worker": cmd_worker,
    "publish": cmd_publish,
    "delete": cmd_delete,
    "status": cmd_status,
    "retract": cmd_retract,
    "tenants": cmd_tenants,
    "migrate": cmd_migrate,
    "tenant": cmd_tenant,
    "rebuild": cmd_rebuild,
    "tail": cmd_tail,
    "query": cmd_query,
    "alias": cmd_alias,
    "export": cmd_export,
    "bench": cmd_bench,
    "demo": cmd_demo,
    "fact": cmd_fact,
    "facts": cmd_facts,
    "passage": cmd_passage,
    "mcp": cmd_mcp,
    "settings-table": cmd_settings_table,
    "stage-table": cmd_stage_table,
    "keys": cmd_keys,
}

if __name__ == "__main__":
    sys.exit(main())
