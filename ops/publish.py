"""`memstream publish`: read documents from files or stdin, validate them against the contract,
publish them to `memstream.documents`, and optionally wait until they are fully indexed.

Conversations too (topics.conversations): a `.json` in the LoCoMo layout (a sample or a list of
samples) becomes one document per turn, and a `.jsonl` line that is a turn (`session_id`,
`turn`, `speaker`, `ts`, `text`) one document, among ordinary document lines. Standard input
starting with `{` or `[` is JSON (or JSONL) and must parse; any other is one text document.

Input is read as the bytes it is (no newline translation: a CRLF stays a CRLF), so a passage
comes back exactly as published. A document is refused here for anything the workers would
refuse (topics.records: control characters such as NUL, lone surrogates, NaN, oversized text,
...), named with its file (line, turn) and reason; the other documents are still published."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence, TextIO

from store import Memory
from store.base import MemoryStore
from topics import BadInput, ContractError, Document, parse_json
from topics.conversations import Turn, is_locomo, is_turn, locomo_turns, turn_from_json
from topics.records import publication_version
from workers.algorithms.normalize import content_hash
from workers.derived import left_to_erase
from workers.publisher import ClientPublisher, check_reason
from workers.settings import Settings

if TYPE_CHECKING:
    from ops.stack.processes import WorkerProcess

TEXT_SUFFIXES = {".txt", ".md"}
READ_SUFFIXES = TEXT_SUFFIXES | {".json", ".jsonl"}


@dataclass
class Loaded:
    documents: list[Document]
    errors: list[str]  # one line per rejected document: where and why
    # the version given to every document that names none (None: the contract's default, 1)
    version: int | None = None
    sources: list[str] = field(default_factory=list)  # where each document was read, in order


def publish_version() -> int:
    """The version `memstream publish` gives a document that names none
    (topics.records.publication_version); `--version` overrides it."""
    return publication_version()


def folder_files(folder: Path) -> list[Path]:
    """The files `publish DIR` reads: every .txt .md .json .jsonl under the folder, in path
    order; hidden files and folders (a name starting with '.') are skipped."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix.lower() in READ_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def load_documents(
    paths: Iterable[str], tenant: str, max_text_bytes: int, stdin: TextIO = sys.stdin, version: int | None = None
) -> Loaded:
    """The documents of `paths` (files, folders, '-' for stdin), each checked against the
    contract; `version`: the version of those that name none. A text file's doc id is its name
    without the suffix; in a folder given, its path relative to the folder ('a/README'). Two
    documents of one id (and tenant) in one call are refused, both, with where each was read."""
    loaded = Loaded([], [], version)
    for path in paths:
        if path != "-" and Path(path).is_dir():
            folder = Path(path)
            files = folder_files(folder)
            if not files:
                loaded.errors.append(f"{path}: no .txt, .md, .json or .jsonl file in this folder")
            for file in files:
                _load_file(
                    loaded, str(file), file, file.relative_to(folder).with_suffix("").as_posix(), tenant, max_text_bytes
                )
            continue
        if path == "-":
            try:
                raw = _read_stdin(stdin)
            except UnicodeDecodeError as exc:
                loaded.errors.append(f"<stdin>: not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            _load_text_or_json("<stdin>", raw, "stdin", tenant, max_text_bytes, loaded)
            continue
        p = Path(path)
        if not p.is_file():
            loaded.errors.append(f"{path}: no such file or folder")
            continue
        _load_file(loaded, path, p, p.stem, tenant, max_text_bytes)
    _refuse_collisions(loaded)
    return loaded


def _load_file(loaded: Loaded, path: str, p: Path, text_doc_id: str, tenant: str, max_text_bytes: int) -> None:
    """One file; `text_doc_id`: the doc id of a .txt or .md."""
    suffix = p.suffix.lower()
    if suffix not in READ_SUFFIXES:
        loaded.errors.append(f"{path}: unsupported file type {suffix!r} (use .txt, .md, .json, .jsonl, a folder or -)")
        return
    try:
        raw = p.read_bytes().decode("utf-8")  # not read_text: it would turn CRLF into LF
    except UnicodeDecodeError as exc:
        loaded.errors.append(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return
    if suffix in TEXT_SUFFIXES:
        _add(loaded, path, {"doc_id": text_doc_id, "text": raw, "metadata": {"path": str(p)}}, tenant, max_text_bytes)
    elif suffix == ".json":
        _load_json(path, raw, tenant, max_text_bytes, loaded)
    else:
        _load_jsonl(path, raw, tenant, max_text_bytes, loaded)


def _refuse_collisions(loaded: Loaded) -> None:
    """Two documents of one (tenant, doc id) in one call: each would replace the other as the
    current version, so neither is published; the error names where each was read."""
    places: dict[tuple[str, str], list[str]] = {}
    for doc, where in zip(loaded.documents, loaded.sources):
        places.setdefault((doc.tenant, doc.doc_id), []).append(where)
    clashes = {key for key, found in places.items() if len(found) > 1}
    if not clashes:
        return
    for doc, where in zip(loaded.documents, loaded.sources):  # one error per document refused
        found = places.get((doc.tenant, doc.doc_id), [])
        if len(found) > 1:
            others = [w for w in found if w != where] or found[1:]
            loaded.errors.append(
                f"{where}: doc id {doc.doc_id!r} (tenant {doc.tenant}) is given {len(found)} times in one publish, also at "
                f"{'; '.join(others)}: rename one, or publish them separately (the later replaces the earlier)"
            )
    kept = [(d, w) for d, w in zip(loaded.documents, loaded.sources) if (d.tenant, d.doc_id) not in clashes]
    loaded.documents, loaded.sources = [d for d, _ in kept], [w for _, w in kept]


def _read_stdin(stdin: TextIO) -> str:
    """Standard input as its bytes say (a text stream without a byte buffer, as tests give, as is)."""
    buffer = getattr(stdin, "buffer", None)
    return buffer.read().decode("utf-8") if buffer is not None else stdin.read()


def _add(loaded: Loaded, where: str, obj, tenant: str, max_text_bytes: int) -> None:
    """One JSON object: a turn (topics.conversations.is_turn) or a document. One that names a
    tenant other than `tenant` is refused: a publish writes one tenant, the one it was given."""
    if is_turn(obj):
        try:
            turn = turn_from_json(obj, where)
        except ContractError as exc:
            loaded.errors.append(str(exc))
            return
        if _refuse_other_tenant(loaded, where, turn.document_id, obj, tenant):
            return
        _add_turn(loaded, where, turn, tenant, max_text_bytes)
        return
    if isinstance(obj, dict) and _refuse_other_tenant(loaded, where, obj.get("doc_id"), obj, tenant):
        return
    if isinstance(obj, dict):
        obj = {**obj, "tenant": tenant}
    if isinstance(obj, dict) and loaded.version is not None and "version" not in obj:
        obj = {**obj, "version": loaded.version}
    try:
        loaded.documents.append(
            Document.from_dict(obj, max_text_bytes=max_text_bytes, where=where, fields_at=f"{where}: ")
        )
        loaded.sources.append(where)
    except ContractError as exc:
        loaded.errors.append(str(exc))


def _refuse_other_tenant(loaded: Loaded, where: str, doc_id, obj: dict, tenant: str) -> bool:
    """A document whose own `tenant` is not the publish's went there silently, whatever --tenant said."""
    own = obj.get("tenant")
    if own is None or own == tenant:
        return False
    loaded.errors.append(
        f"{where}: document {doc_id!r} names tenant {own!r}, but this publish writes tenant {tenant!r} "
        "(--tenant, default MEMSTREAM_TENANT): drop its 'tenant' or publish it with its own --tenant"
    )
    return True


def _add_turn(loaded: Loaded, where: str, turn: Turn, tenant: str, max_text_bytes: int) -> None:
    """A turn's document, checked against the contract as any other (text size, control
    characters, tenant)."""
    data = turn.document(tenant).to_dict()
    if loaded.version is not None:
        data["version"] = loaded.version
    try:
        loaded.documents.append(
            Document.from_dict(data, max_text_bytes=max_text_bytes, where=where, fields_at=f"{where}: ")
        )
        loaded.sources.append(where)
    except ContractError as exc:
        loaded.errors.append(str(exc))


def _load_json(
    where: str, raw: str, tenant: str, max_text_bytes: int, loaded: Loaded, invalid: str = "invalid JSON"
) -> None:
    """`invalid`: what a parse error's message says before the parser's reason (line, column)."""
    try:
        data = parse_json(raw, where, invalid=invalid)
    except ContractError as exc:
        loaded.errors.append(str(exc))
        return
    if is_locomo(data):
        turns = locomo_turns(data, where, loaded.errors)
        for turn in turns:
            # the position too: two turns of one dia_id are told apart (_refuse_collisions names the other)
            at = f"{where}: turn {turn.turn_id} of {turn.session_id}, position {turn.turn}"
            _add_turn(loaded, at, turn, tenant, max_text_bytes)
        return
    if data == []:  # as an empty .txt is: nothing published is an error, not a success
        loaded.errors.append(f"{where}: an empty list, no document to publish")
        return
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
        _add(loaded, f"{where}[{i}]" if isinstance(data, list) else where, item, tenant, max_text_bytes)


def _load_jsonl(where: str, raw: str, tenant: str, max_text_bytes: int, loaded: Loaded) -> None:
    # lines end at "\n" only: str.splitlines would also cut at U+2028, U+0085 and the like, which
    # JSON strings may hold unescaped
    if not raw.strip():
        loaded.errors.append(f"{where}: no line holds a document, nothing to publish")
        return
    for number, line in enumerate(raw.split("\n"), 1):
        if not line.strip():
            continue
        try:
            item = parse_json(line, f"{where}:{number}", invalid="invalid JSON")
        except ContractError as exc:
            loaded.errors.append(str(exc))
            continue
        _add(loaded, f"{where}:{number}", item, tenant, max_text_bytes)


def _load_text_or_json(where: str, raw: str, stem: str, tenant: str, max_text_bytes: int, loaded: Loaded) -> None:
    """Standard input: JSON when its first non-blank character is `{` or `[` — one value (a
    document, a list of them, a LoCoMo conversation), or JSONL when it is not one value but any
    of its lines is a whole object (each line then stands alone: a broken one is named, the
    others published, as from a .jsonl file) — and then it must parse; any other input is one
    text document."""
    stripped = raw.strip()
    if not stripped.startswith(("{", "[")):
        _add(loaded, where, {"doc_id": f"{stem}-{content_hash(raw)[:12]}", "text": raw}, tenant, max_text_bytes)
        return
    lines = [line for line in stripped.split("\n") if line.strip()]
    if stripped.startswith("{") and len(lines) > 1 and not _parses(stripped) and any(map(_is_object, lines)):
        _load_jsonl(where, stripped, tenant, max_text_bytes, loaded)
        return
    # a broken JSON is refused with its line and column, not published as the text of a document
    _load_json(where, stripped, tenant, max_text_bytes, loaded, invalid="starts with { or [ but is not valid JSON")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _is_object(line: str) -> bool:
    return line.lstrip().startswith("{") and _parses(line)


class Progress:
    """A one-line progress bar on a terminal; a single summary line otherwise."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, quiet: bool = False):
        # sys.stderr as it is now (a default argument kept the one of the import: a caller that
        # swapped it, as pytest's capture does, wrote to a closed stream)
        self.stream = stream if stream is not None else sys.stderr
        self.label, self.total, self.quiet = label, total, quiet
        self.tty = self.stream.isatty() and not quiet

    def update(self, done: int) -> None:
        if self.tty:
            width = 30
            filled = width * done // max(self.total, 1)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}")
            self.stream.flush()

    def close(self, done: int, suffix: str = "") -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"{self.label}: {done}/{self.total}{suffix}\n")
        self.stream.flush()


def publish(settings: Settings, documents: list[Document], quiet: bool = False) -> None:
    """`memstream publish`: the documents onto `memstream.documents` (workers.publisher), with
    progress; PublishError when Kafka does not take one."""
    publisher = ClientPublisher(settings, timeout_s=30.0, linger_ms=5)
    progress = Progress("publish", len(documents), quiet=quiet)
    try:
        publisher.send(publisher.document_messages(documents), progress.update)
        progress.close(len(documents), " published")
    finally:
        publisher.close()


def wait_indexed(
    settings: Settings,
    documents: list[Document],
    timeout_s: float,
    quiet: bool = False,
    workers: Sequence[WorkerProcess] = (),
) -> list[str]:
    """Poll the memory until every document (this text, this version) has all its chunks
    through the resolver. Returns the ids still pending at the deadline (empty: all done).
    `workers`: the processes doing the work, supervised at each poll (WorkerProcess.supervise:
    one that asks to be started again is; any other exit fails the wait at once)."""
    return asyncio.run(_wait_indexed(settings, documents, timeout_s, quiet, workers=workers))


# Waiting reads the progress of all the pending documents in one round trip per poll
# (store.MemoryStore.document_statuses), every POLL_PER_DOCUMENT_S per pending document, within
# [POLL_MIN_S, POLL_MAX_S]: a read costs 1.5–3.5 µs of the client's CPU and 1.5–5 µs of Redis's
# per document (measured on 5,000, unseen / seen by the chunker), so polling takes about 1% of a
# core at most however many are pending, and a small publish still returns promptly.
POLL_PER_DOCUMENT_S, POLL_MIN_S, POLL_MAX_S = 0.001, 0.05, 5.0


def poll_interval(pending: int) -> float:
    return min(POLL_MAX_S, max(POLL_MIN_S, pending * POLL_PER_DOCUMENT_S))


async def unindexed(memory: MemoryStore, pending: dict[tuple[str, str], str]) -> set[tuple[str, str]]:
    """Of the pending documents ((tenant, doc_id) → content hash of the text waited for; '':
    deleted), those not there yet: one round trip per tenant."""
    by_tenant: dict[str, list[str]] = {}
    for tenant, doc_id in pending:
        by_tenant.setdefault(tenant, []).append(doc_id)
    left = set()
    for tenant, doc_ids in by_tenant.items():
        for doc_id, status in zip(doc_ids, await memory.document_statuses(tenant, doc_ids)):
            wanted = pending[(tenant, doc_id)]
            if wanted == ERASED:
                if status is not None and (not status.indexed("") or await left_to_erase(memory, None, tenant, doc_id)):
                    left.add((tenant, doc_id))
            elif not (status.indexed(wanted) if status else wanted == ""):  # '' (deleted): never seen counts as out
                left.add((tenant, doc_id))
    return left


async def _wait_indexed(
    settings: Settings,
    documents: list[Document],
    timeout_s: float,
    quiet: bool,
    memory: MemoryStore | None = None,
    workers: Sequence[WorkerProcess] = (),
) -> list[str]:
    """`memory`: the store to read (default: Redis at settings.redis_url, closed at the end)."""
    pending = {(d.tenant, d.doc_id): content_hash(d.text) for d in documents}
    return await _wait_for(settings, pending, "indexed", timeout_s, quiet, memory, workers)


def meant_ids(doc_id: str) -> list[str]:
    """The ids a document given as `doc_id` may have been published under, nearest first: the id
    without its file suffix, then the path's last parts, each as given and without its suffix —
    a folder's file `notes/ilse.md` is `ilse` when the folder was what `publish` was given
    (`notes/ilse.md` → `notes/ilse`, `ilse.md`, `ilse`)."""
    parts = doc_id.split("/")
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    out = []
    for tail in tails:
        out += [tail, tail.rsplit(".", 1)[0] if "." in tail.rsplit("/", 1)[-1] else tail]
    return [name for name in dict.fromkeys(out[1:]) if name and name != doc_id]


async def unrecorded(memory: MemoryStore, tenant: str, doc_ids: list[str]) -> dict[str, str | None]:
    """Of `doc_ids`, those the tenant's memory holds no record of (never published, or not yet
    through the chunker) → the recorded id nearest to it (meant_ids), or None: two round trips."""
    unknown = [
        doc_id for doc_id, status in zip(doc_ids, await memory.document_statuses(tenant, doc_ids)) if status is None
    ]
    guesses = {doc_id: meant_ids(doc_id) for doc_id in unknown}
    asked = list(dict.fromkeys(name for names in guesses.values() for name in names))
    known = {
        name for name, status in zip(asked, await memory.document_statuses(tenant, asked) if asked else []) if status
    }
    return {doc_id: next((name for name in names if name in known), None) for doc_id, names in guesses.items()}


def refuse_unrecorded(settings: Settings, tenant: str, doc_ids: list[str]) -> None:
    """BadInput naming each id the tenant's memory has no record of (with the recorded id it may
    mean): a tombstone for an id never published changes nothing, and `delete` said it deleted
    it — README's own example gave a folder's file by its path, which is not its doc id."""

    async def read() -> dict[str, str | None]:
        memory = Memory.from_url(settings.redis_url)
        try:
            return await unrecorded(memory, tenant, doc_ids)
        finally:
            await memory.close()

    unknown = asyncio.run(read())
    if unknown:
        named = "; ".join(
            f"{doc_id!r}" + (f" (did you mean {meant!r}?)" if meant else "") for doc_id, meant in unknown.items()
        )
        raise BadInput(
            f"tenant {tenant!r} holds no document {named}: nothing was deleted. A document published moments ago "
            "is known once the chunker has taken it (`publish --wait`); --force publishes the deletion anyway (a "
            "document not through the chunker yet, or one it dead-lettered)"
        )


def delete(settings: Settings, tenant: str, doc_ids: list[str], quiet: bool = False, purge: bool = False) -> None:
    """`memstream delete`: a tombstone (no value) per document on `memstream.documents`, keyed
    tenant/doc id as its versions are (topics.document_key), so a compacted topic drops them.
    With `purge`, the document's erasure (topics.DocumentDeletion.erasure_value) before its
    tombstone, under the same key: the chunker erases it from Redis."""
    publisher = ClientPublisher(settings, timeout_s=30.0)
    try:
        publisher.send(publisher.deletion_messages(tenant, doc_ids, purge))
    finally:
        publisher.close()
    Progress("delete", len(doc_ids), quiet=quiet).close(
        len(doc_ids), " erasures published" if purge else " tombstones published"
    )


def retract(settings: Settings, tenant: str, fact_id: str, reason: str) -> str:
    """`memstream retract`: the fact's retraction onto `memstream.conflict-sets` for the resolver,
    as POST /v1/facts/{id}/retract and the MCP tool send it (ClientPublisher.retract). Returns
    the request's work id; BadInput when the tenant holds no such fact or the reason is one the
    resolver would refuse (publisher.check_reason, as the HTTP route and the tool check it);
    PublishError when Kafka does not take it."""
    check_reason(reason)  # before Redis or Kafka: a NUL in it was queued and dead-lettered

    async def queue() -> str:
        memory = Memory.from_url(settings.redis_url)
        try:
            fact = await memory.fact(tenant, fact_id)
        finally:
            await memory.close()
        if fact is None:
            raise BadInput(f"no fact {fact_id!r} in tenant {tenant!r}")
        publisher = ClientPublisher(settings, timeout_s=30.0)
        try:
            return await publisher.retract(tenant, fact, reason)
        finally:
            publisher.close()

    return asyncio.run(queue())


ERASED = "erased"  # what _wait_for waits for after an erasure (a content hash is 64 hex digits)


def wait_deleted(
    settings: Settings, tenant: str, doc_ids: list[str], timeout_s: float, quiet: bool = False, purge: bool = False
) -> list[str]:
    """Poll until the chunker has taken each document out (its record holds no chunk: the text
    hash of nothing, all of its zero chunks done) — with `purge`, and erased what is left of it
    (workers.derived.left_to_erase finds nothing). Returns the ids not yet out at the deadline."""
    wanted = ERASED if purge else ""
    return asyncio.run(
        _wait_for(
            settings,
            {(tenant, doc_id): wanted for doc_id in doc_ids},
            "erased" if purge else "deleted",
            timeout_s,
            quiet,
        )
    )


async def _wait_for(
    settings: Settings,
    pending: dict[tuple[str, str], str],
    what: str,
    timeout_s: float,
    quiet: bool,
    memory: MemoryStore | None = None,
    workers: Sequence[WorkerProcess] = (),
) -> list[str]:
    """Poll until each (tenant, doc id) holds the text of its content hash, fully indexed ('':
    nothing: deleted); `workers` supervised at each poll (wait_indexed)."""
    own = memory is None
    if memory is None:
        memory = Memory.from_url(settings.redis_url)
    total = len(pending)
    progress = Progress(what, total, quiet=quiet)
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            for worker in workers:
                worker.supervise()
            left = await unindexed(memory, pending)
            pending = {key: doc_hash for key, doc_hash in pending.items() if key in left}
            progress.update(total - len(pending))
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                break
            # poll gently when much is left (the workers need the CPU); the last read at the deadline
            await asyncio.sleep(min(poll_interval(len(pending)), remaining))
    finally:
        if own:
            await memory.close()
    progress.close(total - len(pending), f" {what}" if not pending else f" {what} before the timeout")
    return [doc_id for _, doc_id in pending]
