"""`memstream publish`, `delete`, `retract` and `rebuild`: what goes into memory and what is taken
out, as messages on the topics (ops.publish, ops.rebuild)."""

from __future__ import annotations

import sys

from ops.cli.numbers import seconds
from topics import BadInput, tenant_or_default, validate_tenant
from workers.settings import Settings


def add_parsers(sub) -> None:
    """Its commands' parsers, on the `memstream` parser's subparsers."""
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
    pub.add_argument("--timeout", type=seconds(), default=600.0, help="seconds --wait waits (default 600)")

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
    delete.add_argument(
        "--force",
        action="store_true",
        help="publish even for an id the tenant holds no record of (a document not through the chunker yet, or "
        "one it dead-lettered), without asking Redis",
    )
    delete.add_argument("--timeout", type=seconds(), default=600.0, help="seconds --wait waits (default 600)")

    retract = sub.add_parser("retract", help="take a fact out of memory (a passage that says it again brings it back)")
    retract.add_argument("fact_id", metavar="FACT_ID")
    retract.add_argument("--tenant", default=None)
    retract.add_argument("--reason", default="", help="kept with the fact and told in its `retracted` event")

    rebuild = sub.add_parser(
        "rebuild",
        help="build a tenant's memory (or every tenant's) again from memstream.documents: its memory erased, its "
        "current documents published again (workers catch up a Redis that lost writes on their own)",
    )
    rebuild.add_argument("--tenant", default=None, help="only this tenant (default: every tenant with documents)")
    rebuild.add_argument("--wait", action="store_true", help="return once every document is indexed again")
    rebuild.add_argument("--timeout", type=seconds(), default=600.0, help="--wait: seconds at most (default 600)")


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
    from ops.publish import delete, refuse_unrecorded, wait_deleted

    tenant = tenant_or_default(args.tenant, settings.tenant)
    blank = [doc_id for doc_id in args.doc_ids if not doc_id.strip()]
    if blank:
        raise BadInput("a doc id to delete must not be empty")
    if not args.force:
        refuse_unrecorded(settings, tenant, args.doc_ids)
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


def cmd_rebuild(settings: Settings, args) -> int:
    from ops.rebuild import rebuild

    tenant = validate_tenant(args.tenant) if args.tenant is not None else None
    return rebuild(settings, tenant, args.timeout if args.wait else None)


COMMANDS = {
    "publish": cmd_publish,
    "delete": cmd_delete,
    "retract": cmd_retract,
    "rebuild": cmd_rebuild,
}
