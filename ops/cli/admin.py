"""`memstream tenant delete`, `migrate`, `keys`, `settings-table` and `stage-table`: a tenant
erased, the store's formats migrated, the query worker's API keys, and the generated tables of
the docs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from topics import BadInput, validate_tenant
from workers.settings import Settings


def add_parsers(sub) -> None:
    """Its commands' parsers, on the `memstream` parser's subparsers."""
    tenant_cmd = sub.add_parser("tenant", help="one tenant: delete it")
    tenant_cmd.add_argument("action", choices=["delete"])
    tenant_cmd.add_argument("name", metavar="TENANT")
    tenant_cmd.add_argument(
        "--purge",
        action="store_true",
        help="required: erase every key of the tenant, its indexes and the model-cache entries of its texts, "
        "and tombstone its documents on memstream.documents",
    )

    migrate = sub.add_parser(
        "migrate",
        help="move tenants made before shared indexes onto them, and float32 vectors to float16 (idempotent; stop the workers first)",
    )
    migrate.add_argument("--dry-run", action="store_true", help="only list the tenants still to move")
    migrate.add_argument("--tenant", action="append", default=None, help="move only this tenant (repeatable)")

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


def cmd_tenant(settings: Settings, args) -> int:
    from ops.erase import publish_event, purge_tenant, tenant_purged_event
    from ops.publish import delete
    from ops.rebuild import current_documents
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

    # the log's current documents of the tenant, read before anything is erased (a Kafka away
    # stops the command here): erased from Redis alone, they came back with `memstream rebuild`
    # or a recovery from the log, and the log kept their texts (an audit)
    documents = current_documents(settings, tenant)[0].get(tenant, [])
    gone = asyncio.run(purge())
    print(f"tenant {tenant} erased: " + ", ".join(f"{n} {what}" for what, n in gone.items()))
    code = 0
    try:
        # each erased on the log as `delete --purge` erases it: an erasure, then a tombstone. The
        # compacted log forgets them; a chunker meeting them finds no record (the tenant is
        # erased) and writes nothing, or erases one a stopped worker had not read yet — indexed
        # and then erased, not merely retired, as a plain tombstone would leave it (a review)
        if documents:
            delete(settings, tenant, [doc.doc_id for doc in documents], quiet=True, purge=True)
            print(
                f"{len(documents)} documents erased on {settings.topics.documents} (an erasure and a tombstone "
                "each): `rebuild` no longer brings them back, and the log drops their texts when it compacts"
            )
    except Exception as exc:
        print(
            f"memstream tenant delete: erased from Redis, but the erasures of its {len(documents)} documents on "
            f"{settings.topics.documents} were not published ({type(exc).__name__}: {exc}); `memstream rebuild` would "
            "index them again: run this command again once Kafka answers",
            file=sys.stderr,
        )
        code = 1
    try:  # told either way: a second run would count nothing erased
        publish_event(settings, tenant_purged_event(tenant, gone))
    except Exception as exc:  # the erasure is done; only its announcement is missing
        print(
            f"memstream tenant delete: erased, but the `purged` event was not published ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
    return code


def cmd_migrate(settings: Settings, args) -> int:
    """Every tenant still on indexes of its own moved onto the shared ones, one at a time, each
    line printed as it is done; running it again finds nothing left."""
    from store import Memory

    async def run() -> int:
        memory = Memory.from_url(settings.redis_url, vector_index=settings.vector_index)
        try:
            tenants = await memory.legacy_tenants()
            if args.tenant:  # only those asked for; an asked one with nothing to move is said so, not listed as moving
                asked = list(dict.fromkeys(validate_tenant(t) for t in args.tenant))
                left = set(tenants)
                tenants = [t for t in asked if t in left]
                if done := [t for t in asked if t not in left]:
                    print(
                        f"nothing to move for {', '.join(done)}: on the shared indexes already, or no such tenant",
                        flush=True,
                    )
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


COMMANDS = {
    "tenant": cmd_tenant,
    "migrate": cmd_migrate,
    "keys": cmd_keys,
    "settings-table": cmd_settings_table,
    "stage-table": cmd_stage_table,
}
