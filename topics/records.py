"""Versioned JSON records of every topic, declared as dataclasses and validated from them.

A record's dataclass *is* its schema: field names, types (str, int, float, bool, dict, list,
Optional[...], nested records) and defaults. `decode` turns bytes into a record or raises
`ContractError` naming the topic, the field and what was wrong, so a bad message can be sent to
the dead-letter topic with a reason a person can act on.

Hygiene, enforced for every record whatever its producer: the bytes are strict UTF-8 JSON with no
NaN or Infinity, integers fit in 64 bits, values nest at most MAX_DEPTH levels, and no string
holds a lone surrogate (it could not be encoded again) or a control character (Unicode Cc) —
except tab, newline and carriage return in free text (TEXT_FIELDS and FREE_TEXT_FIELDS).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from topics.contract import CATEGORY_PRECEDENCE, FACT_CATEGORIES, SYMMETRIC_RELATIONS, ContractError, quoted  # noqa: F401  (re-exported)
from topics.times import document_ttls, epoch_seconds

SCHEMA_VERSION = 1
DEFAULT_MAX_TEXT_BYTES = 1 << 20  # 1 MiB
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_DEPTH = 32  # nesting of arrays and objects inside a field (metadata); deeper data is refused
_INT64 = (-(1 << 63), (1 << 63) - 1)  # what other languages' consumers and Redis can hold
# Characters refused in strings: lone surrogates always; control characters (Cc) except that free
# text may hold tab, newline and carriage return; raw fields (a dead letter's payload) keep them.
_REFUSED_STRICT = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_REFUSED_FREE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_REFUSED_RAW = re.compile(r"[\ud800-\udfff]")


def validate_tenant(tenant: Any) -> str:
    # Tenants become part of Redis keys and index names: keep them to a safe alphabet.
    if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):  # fullmatch: "$" alone lets "acme\n" through
        raise ContractError(
            f"invalid tenant {quoted(tenant)}: 1-64 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return tenant


def publication_version() -> int:
    """The version a publisher gives a document that names none (`memstream publish`, the MCP
    tool `remember`): the time of publishing in milliseconds, so a document published again is
    a newer version — also after its deletion, which blocks every version up to the deleted one
    — without reading the memory first."""
    return int(time.time() * 1000)


def passage_mark(passage_id: str, incarnation: int) -> str:
    """How done marks and work ids name a passage: its id, and after it came back into memory
    (Chunk.incarnation > 0) which time, so a passage extracted again is not taken for done."""
    return f"{passage_id}~{incarnation}" if incarnation else passage_id


def tenant_or_default(given: Any, default: str) -> str:
    """The tenant a caller named, else (None: not named) `default` — validated either way. An
    empty or blank name is an error, not the default: an unset shell variable (`--tenant
    "$T"`) must not write into another tenant."""
    return validate_tenant(default if given is None else given)


@dataclass
class Record:
    """Base of all records. Subclasses set TOPIC (the topic suffix) and TEXT_FIELDS
    (string fields that must be non-empty and within the size limit)."""

    TOPIC: ClassVar[str] = ""
    TEXT_FIELDS: ClassVar[tuple[str, ...]] = ()
    NONEMPTY_FIELDS: ClassVar[tuple[str, ...]] = ()
    # prose besides TEXT_FIELDS: its strings may hold tab, newline and carriage return
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ()
    # kept as they came (a dead letter's payload and error): only lone surrogates are refused
    RAW_FIELDS: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(
        cls, data: Any, *, max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES, where: str = "", fields_at: str = ""
    ):
        """The record `data` holds, checked: a ContractError says where (`where`: the topic by
        default) and what. A field's path is `fields_at` and its name — "documents.text" by
        default; a file's loader gives "ctrl.txt: " (as "ctrl.txt.text" it read as a file name)."""
        where = where or cls.TOPIC
        fields_at = fields_at or f"{where}."
        if not isinstance(data, dict):
            raise ContractError(f"{where}: expected a JSON object, got {_json_type(data)}")
        # a class is hashable: mypy checks type[X] against Hashable by X's own __hash__ (python/mypy#11470)
        hints = _type_hints(cls)  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                values[f.name] = _check(data[f.name], hints[f.name], f"{fields_at}{f.name}", max_text_bytes)
                _check_nested(values[f.name], f"{fields_at}{f.name}", cls._refused(f.name))
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ContractError(f"{where}: missing required field '{f.name}'")
        for name in cls.NONEMPTY_FIELDS + cls.TEXT_FIELDS:
            if name in values and isinstance(values[name], str) and not values[name].strip():
                raise ContractError(f"{where}: field '{name}' is empty")
        for name in cls.TEXT_FIELDS:
            size = len(values.get(name, "").encode("utf-8"))
            if size > max_text_bytes:
                raise ContractError(
                    f"{where}: field '{name}' is {size} bytes, over the limit of {max_text_bytes} bytes"
                )
        if values.get("tenant") is not None:  # optional only on the dead-letter topic
            try:
                validate_tenant(values["tenant"])
            except ContractError as exc:
                raise ContractError(f"{where}: {exc}") from None
        return cls(**values)

    @classmethod
    def check_field(cls, name: str, value: Any, where: str) -> None:
        """`value` for the field `name`, its strings and numbers checked by the rule `from_dict`
        applies to that field (lone surrogates, control characters but what free text allows,
        64-bit integers); a ContractError naming `where`. For a caller's input taken before the
        record is made: refused then, not dead-lettered by the consumer after the caller was
        told it was queued."""
        _check_nested(value, where, cls._refused(name))

    @classmethod
    def _refused(cls, name: str) -> re.Pattern:
        if name in cls.RAW_FIELDS:
            return _REFUSED_RAW
        return _REFUSED_FREE if name in cls.TEXT_FIELDS + cls.FREE_TEXT_FIELDS else _REFUSED_STRICT


@functools.cache
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _check(value: Any, hint: Any, where: str, max_text_bytes: int) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _check(value, args[0], where, max_text_bytes)
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value, max_text_bytes=max_text_bytes, where=where)
    base = origin or hint
    if base is list:
        if not isinstance(value, list):
            raise ContractError(f"{where}: expected array, got {_json_type(value)}")
        (item,) = typing.get_args(hint) or (Any,)
        return [_check(v, item, f"{where}[{i}]", max_text_bytes) for i, v in enumerate(value)]
    if base is Any:
        return value
    ok = {
        str: lambda v: isinstance(v, str),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        bool: lambda v: isinstance(v, bool),
        dict: lambda v: isinstance(v, dict),
    }[base](value)
    if not ok:
        expected = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}[base]
        raise ContractError(f"{where}: expected {expected}, got {_json_type(value)}")
    if base is int and not _INT64[0] <= value <= _INT64[1]:
        raise ContractError(f"{where}: integer out of the 64-bit range")
    if base is float:
        try:
            number = float(value)
        except OverflowError:  # an integer past the double range
            number = math.inf
        if not math.isfinite(number):
            raise ContractError(f"{where}: {value!r:.40} is not a finite number")
        return number
    return value


def _check_nested(value: Any, where: str, refused: re.Pattern) -> None:
    """Every string in value (nested arrays and objects too, keys included) free of `refused`
    characters; every number one JSON carries: integers within 64 bits, no NaN or infinity (a
    record built in Python can hold them; encoded, the workers' decode would refuse it).
    Iterative, so no input can exhaust the stack; a nested record has checked its own."""
    stack = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            bad = refused.search(item)
            if bad:
                raise ContractError(f"{path}: {_describe(bad.group(), bad.start(), refused)}")
        elif isinstance(item, int) and not isinstance(item, bool) and not _INT64[0] <= item <= _INT64[1]:
            raise ContractError(f"{path}: integer out of the 64-bit range")
        elif isinstance(item, float) and not math.isfinite(item):
            raise ContractError(f"{path}: {item} is not a JSON number")
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise ContractError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    stack.append((key, f"{path} (a key)", depth + 1))
                stack.append((child, f"{path}[{key if isinstance(key, int) else repr(key[:40])}]", depth + 1))


def _describe(char: str, index: int, refused: re.Pattern) -> str:
    found = f"U+{ord(char):04X} at index {index}"
    if "\ud800" <= char <= "\udfff":
        return f"lone surrogate {found} (not valid Unicode text)"
    if refused is _REFUSED_FREE:
        return f"control character {found} (free text allows only tab, newline and carriage return)"
    return f"control character {found} (no control characters are allowed in this field)"


@dataclass
class Document(Record):
    """A document (or an agent/conversation turn) to index. Key: tenant/doc id (document_key)."""

    TOPIC: ClassVar[str] = "documents"
    TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("text",)
    NONEMPTY_FIELDS: ClassVar[tuple[str, ...]] = ("doc_id",)
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("metadata",)

    tenant: str
    doc_id: str
    text: str
    metadata: dict = field(default_factory=dict)
    version: int = 1
    session_id: Optional[str] = None
    turn: Optional[int] = None
    speaker: Optional[str] = None
    ts: Optional[float] = None
    # What the document is about (a Wikipedia page's or a note's title): the subject entity every
    # passage of it holds, so a passage elsewhere naming it links to it (workers.algorithms.subjects).
    # Optional: a message without it decodes as before, its passages with no subject.
    title: Optional[str] = None

    # A title is a name, not a text: every passage of the document holds it (its subject and the
    # entity it names), so past this length it is refused. Wikipedia's titles stop at 255 bytes.
    MAX_TITLE_CHARS: ClassVar[int] = 512

    @property
    def key(self) -> str:
        """Its tenant and doc id (document_key): every version of one document, and its
        deletion (a tombstone), share the key — one partition, in order, and a topic compacted
        by key keeps the latest of each."""
        return document_key(self.tenant, self.doc_id)

    @classmethod
    def tombstone(cls, key: bytes | str | None) -> "DocumentDeletion":
        """What a message of no value on `documents` means: delete the document its key names."""
        return DocumentDeletion.from_key(key)

    @classmethod
    def decode_value(
        cls, data: Any, *, max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES, where: str = ""
    ) -> "Document | DocumentDeletion":
        """A value on `documents`: a version of a document, or — an object with `"erase": true`
        and no text — the erasure of one (DocumentDeletion with `purge`)."""
        if isinstance(data, dict) and "erase" in data:
            return DocumentDeletion.from_erasure(data, where or cls.TOPIC)
        return cls.from_dict(data, max_text_bytes=max_text_bytes, where=where)

    @property
    def is_turn(self) -> bool:
        """A conversation turn: `turn` is set. The one rule (the chunker, `memstream publish`, the
        MCP `remember`): a turn is one immutable passage with its speaker's context line; a
        document with only a session_id (a note of the session) is chunked in windows like any."""
        return self.turn is not None

    @classmethod
    def from_dict(cls, data, *, max_text_bytes=DEFAULT_MAX_TEXT_BYTES, where="", fields_at=""):
        """Also time (topics.times): `ts` seconds since the epoch a worker can read as a date,
        `metadata.ttl_seconds` TTLs the extractor can apply."""
        doc = super().from_dict(data, max_text_bytes=max_text_bytes, where=where, fields_at=fields_at)
        if doc.title is not None and len(doc.title) > cls.MAX_TITLE_CHARS:
            raise ContractError(
                f"{where or cls.TOPIC}: field 'title' is {len(doc.title)} characters, over the limit of "
                f"{cls.MAX_TITLE_CHARS} (a title names what the document is about; its words go in 'text')"
            )
        try:
            if doc.ts is not None:
                epoch_seconds(doc.ts)
            document_ttls(doc.metadata)
        except ContractError as exc:
            raise ContractError(f"{where or cls.TOPIC}: {exc}") from None
        return doc


def document_key(tenant: str, doc_id: str) -> str:
    """The key of a document's messages on `documents`: 'tenant/doc id' (a tenant has no '/')."""
    return f"{tenant}/{doc_id}"


@dataclass(frozen=True)
class DocumentDeletion:
    """A document taken out of memory: a tombstone (no value) on `documents`, its key naming the
    tenant and doc id (document_key). Not a record of its own: nothing but the key is sent.

    With `purge`, its erasure (`memstream delete --purge`): the value `{"v", "tenant", "doc_id",
    "erase": true}` under the same key (erasure_value), followed by a tombstone so a compacted
    topic drops the key. Deleted, then every passage of every version of it that no other
    document holds is erased from Redis with what only they supported (workers.stages.erasure)."""

    tenant: str
    doc_id: str
    purge: bool = False

    @classmethod
    def from_key(cls, key: bytes | str | None) -> "DocumentDeletion":
        if isinstance(key, (bytes, bytearray)):
            try:
                key = bytes(key).decode("utf-8")
            except UnicodeDecodeError:
                raise ContractError("documents: a tombstone's key is not UTF-8") from None
        if not key or "/" not in key:
            raise ContractError(
                f"documents: a message without a value deletes a document, and its key must be 'tenant/doc id'; got {key!r}"
            )
        tenant, doc_id = key.split("/", 1)
        validate_tenant(tenant)
        if not doc_id.strip():
            raise ContractError(f"documents: the tombstone key {key!r} names no doc id")
        return cls(tenant, doc_id)

    @classmethod
    def from_erasure(cls, data: dict, where: str) -> "DocumentDeletion":
        extra = sorted(set(data) - {"v", "tenant", "doc_id", "erase"})
        if data.get("erase") is not True or extra:
            raise ContractError(
                f'{where}: an erasure is {{"v", "tenant", "doc_id", "erase": true}} and nothing else'
                + (
                    f"; got field(s) {', '.join(map(repr, extra))[:200]}"
                    if extra
                    else f"; got erase={data.get('erase')!r}"[:200]
                )
            )
        tenant, doc_id = data.get("tenant"), data.get("doc_id")
        if not isinstance(tenant, str) or not isinstance(doc_id, str) or not doc_id.strip():
            raise ContractError(f"{where}: an erasure names its tenant and doc id (non-empty strings)")
        try:
            validate_tenant(tenant)
            _check_nested(doc_id, f"{where}.doc_id", _REFUSED_STRICT)
        except ContractError as exc:
            raise ContractError(f"{where}: {exc}") from None
        return cls(tenant, doc_id, purge=True)

    def erasure_value(self) -> bytes:
        """The value that asks for this document's erasure (from_erasure reads it)."""
        return json.dumps(
            {"v": SCHEMA_VERSION, "tenant": self.tenant, "doc_id": self.doc_id, "erase": True},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode("utf-8")

    @property
    def key(self) -> str:
        return document_key(self.tenant, self.doc_id)


@dataclass
class Chunk(Record):
    """One passage of a document. chunk_id is the content hash of text. Key: doc_id."""

    TOPIC: ClassVar[str] = "chunks"
    TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("text",)
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("metadata",)

    tenant: str
    chunk_id: str
    doc_id: str
    seq: int
    n_chunks: int
    text: str
    doc_version: int = 1
    doc_hash: str = ""
    # Agent memory: who said a turn and when ("Caroline, 1:56 pm on 8 May, 2023"). Embedded and
    # extracted with the text, never part of it: the passage keeps the published bytes.
    context: str = ""
    # the document's metadata and turn fields (session_id, turn, speaker, ts, turn_id), kept
    # with the passage so a caller can map it back
    metadata: dict = field(default_factory=dict)
    # How many times the passage came back into memory after a version retired it (a revert):
    # the done marks of its extraction and detection name it (passage_mark), so it is extracted
    # again and its facts decided again.
    incarnation: int = 0
    # The decision that sent it, "<mark>@<decision id>" (store.records.cause), stamped by the
    # envelope when it commits: a worker passes over a message whose cause memory does not hold
    # (Redis lost it; workers.recovery). "" from outside the pipeline: decided as it comes.
    cause: str = ""
    # The entity its document's title names (workers.algorithms.subjects.subject_name), held by
    # the passage beside what its text mentions; "" for an untitled document (and older chunks).
    subject: str = ""

    @property
    def key(self) -> str:
        return self.doc_id

    @property
    def indexed_text(self) -> str:
        """What the extractor and the embedder read: the context line, then the text."""
        return indexed_text_of(self.context, self.text)


def indexed_text_of(context: str | None, text: str) -> str:
    """A passage as the extractor and the embedder read it (Chunk.indexed_text, and a stored
    passage's row): its context line, then its text."""
    return f"{context}\n{text}" if context else text


# Entity types that are values — literals that qualify a fact (a constraint's amount, a deadline),
# never nodes a walk passes through: such an entity gets no passage, fact, type or similarity edge,
# and reconstruct takes no cue from it (workers.models.mentions reads them whole).
VALUE_TYPES = frozenset({"MONEY", "DATE", "TIME", "NUMBER", "PERCENT"})
# A conversation turn's tag: a topic word the rules extractor reads in a turn
# (workers.models.mentions.turn_tags), a node that joins turns about the same thing for the PPR
# walk. Reconstruct takes no cue from it either: as cues, tags cost LoCoMo dev's reconstruct
# 1.2 points of R@10 (76.0 → 74.8) and half again its time a query.
TAG_TYPE = "TAG"
NO_CUE_TYPES = VALUE_TYPES | {TAG_TYPE}


@dataclass
class Triple(Record):
    """A fact as extracted: (head, relation, tail) with entity types, category, time span."""

    NONEMPTY_FIELDS: ClassVar[tuple[str, ...]] = ("head", "relation", "tail")
    # surface forms as written in the passage (a name may span a tab or a line break)
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("head", "relation", "tail")

    head: str
    relation: str
    tail: str
    head_type: str = "ENTITY"
    tail_type: str = "ENTITY"
    category: str = "DECLARATIVE"
    valid_from: Optional[str] = None
    valid_to: Optional[str] = None
    # The statement itself of its category — a constraint, refusal or failure as stated (the
    # rules extractor's trigger fact, a fact the LLM categorised) — not a fact that only shares
    # its sentence. A stated fact of the decision trace needs no τ (workers.stages.detector).
    stated: bool = False

    @classmethod
    def from_dict(cls, data, *, max_text_bytes=DEFAULT_MAX_TEXT_BYTES, where="", fields_at=""):
        triple = super().from_dict(data, max_text_bytes=max_text_bytes, where=where, fields_at=fields_at)
        if triple.category not in FACT_CATEGORIES:
            raise ContractError(
                f"{where or 'fact'}: category {triple.category!r} is not one of {', '.join(FACT_CATEGORIES)}"
            )
        return triple


@dataclass
class CandidateFact(Record):
    """One extracted fact of one passage. Key: normalised head entity id (the smaller end of a
    symmetric pair: candidate_key), so all facts about a head are detected in order on one
    partition. `fact_index`/`chunk_fact_count` let the pipeline tell when every fact of a chunk
    is through."""

    TOPIC: ClassVar[str] = "candidate-facts"

    tenant: str
    passage_id: str
    doc_id: str
    fact: Triple
    fact_index: int
    chunk_fact_count: int
    head_id: str
    tail_id: str
    extractor: str = ""
    # True on the re-enqueued activation of a pending fact whose schema became stable; then
    # passage_id/chunk_fact_count name the chunk whose progress waits for it (work_id)
    activation: bool = False
    work_id: str = ""
    incarnation: int = 0  # the passage's (Chunk.incarnation)
    cause: str = ""  # the decision that sent it (Chunk.cause)

    @property
    def key(self) -> str:
        """Its partition key (candidate_key): the head, or the smaller end of a symmetric pair."""
        return candidate_key(self.head_id, self.fact.relation, self.tail_id)

    @property
    def passage_mark(self) -> str:
        return passage_mark(self.passage_id, self.incarnation)


def candidate_key(head_id: str, relation: str, tail_id: str) -> str:
    """The partition key of a candidate fact: its head, so one head's facts are detected in
    order — but the smaller entity of a symmetric pair, so "A married B" and "B married A" are
    detected one after the other, never both activated at once on two partitions."""
    return min(head_id, tail_id) if relation in SYMMETRIC_RELATIONS else head_id


@dataclass
class ConflictSet(Record):
    """Work for the resolver. kind `duplicate`: merge the candidate into fact_id (the same
    fact, a swapped symmetric one, or a near-duplicate); kind `adjudicate`: decide the group
    (candidate's head, relation) again; kind `retract`: take fact_id out of memory as a caller
    asked (`memstream retract`, POST /v1/facts/{id}/retract, the MCP tool retract_fact). Key: the
    head entity whose group is decided — `candidate.head_id`, except a duplicate's: its target's
    head, which the record does not hold (topics.graph) — so one head's conflicts are resolved in order. `candidate.passage_id` is the chunk whose progress waits for work_id."""

    TOPIC: ClassVar[str] = "conflict-sets"
    KINDS: ClassVar[tuple[str, ...]] = ("duplicate", "adjudicate", "retract")
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("reason",)

    tenant: str
    kind: str
    candidate: CandidateFact
    fact_id: str
    conflicting: list[str]
    passage_ids: list[str]
    work_id: str = ""
    reason: str = ""
    cause: str = ""  # the decision that sent it (Chunk.cause)

    @classmethod
    def from_dict(cls, data, *, max_text_bytes=DEFAULT_MAX_TEXT_BYTES, where="", fields_at=""):
        record = super().from_dict(data, max_text_bytes=max_text_bytes, where=where, fields_at=fields_at)
        if record.kind not in cls.KINDS:
            raise ContractError(f"{where or cls.TOPIC}: kind {record.kind!r} is not one of {', '.join(cls.KINDS)}")
        return record


@dataclass
class FactEvent(Record):
    """A change of memory, published on indexed-facts. `event_id` is deterministic, so a
    consumer can drop the rare duplicate an at-least-once crash causes.

    A fact's events (FACT_EVENTS) name it (`fact_id`, `fact`); a document's (DOCUMENT_EVENTS)
    have `fact_id` '' and `fact` {} and name the document (`doc_id`): `retired` — passages a
    version or deletion took out of memory (`passage_ids`), `purged` — what an erasure removed
    from Redis (`passage_ids`, `fact_ids`; never any text; `doc_id` '' when a whole tenant went).
    Key: the fact id, or tenant/doc id (document_key) for a document's events."""

    TOPIC: ClassVar[str] = "indexed-facts"
    FREE_TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("fact", "reason")
    FACT_EVENTS: ClassVar[tuple[str, ...]] = (
        "activated",
        "merged",
        "qualified",
        "invalidated",
        "expired",
        "retracted",
        "pending",
    )
    DOCUMENT_EVENTS: ClassVar[tuple[str, ...]] = ("retired", "purged")
    EVENTS: ClassVar[tuple[str, ...]] = FACT_EVENTS + DOCUMENT_EVENTS

    tenant: str
    event: str
    event_id: str
    fact_id: str
    fact: dict
    passage_ids: list[str]
    graph_version: int
    reason: str = ""
    ts: float = 0.0
    evidence_passage_ids: list[str] = field(default_factory=list)
    doc_id: str = ""
    fact_ids: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return self.fact_id or document_key(self.tenant, self.doc_id)


@dataclass
class DeadLetter(Record):
    """A message that could not be processed. `payload` is the original value as text
    (undecodable bytes escaped), cut to a bound so a letter always fits the topic;
    `payload_bytes` and `payload_sha256` describe the whole original, and `partition`/`offset`
    say where to read it back while the topic retains it."""

    TOPIC: ClassVar[str] = "dlq"
    RAW_FIELDS: ClassVar[tuple[str, ...]] = ("payload", "error", "key")

    topic: str
    payload: str
    error: str
    key: Optional[str] = None
    partition: Optional[int] = None
    offset: Optional[int] = None
    attempts: int = 1
    tenant: Optional[str] = None
    ts: float = 0.0
    payload_bytes: int = 0
    payload_sha256: str = ""
    payload_truncated: bool = False


def encode(record: Record) -> bytes:
    return json.dumps(record.to_dict(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode(cls: type[Record], raw: bytes | str, *, max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES):
    """Bytes of a message on `cls.TOPIC` → a validated record, or ContractError (never another
    exception type: a consumer dead-letters on ContractError and must see nothing else)."""
    where = cls.TOPIC
    data = parse_json(raw, where)
    if isinstance(data, dict):
        version = data.get("v")
        if version is None:
            raise ContractError(f"{where}: missing schema version field 'v'")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise ContractError(
                f"{where}: unsupported schema version v={version!r} (this memstream reads v={SCHEMA_VERSION})"
            )
    read = getattr(cls, "decode_value", None) or cls.from_dict  # a topic with more than one kind of value (documents)
    return read(data, max_text_bytes=max_text_bytes, where=where)


def parse_json(raw: Any, where: str, invalid: str = "message is not valid UTF-8 JSON") -> Any:
    """Strict UTF-8 JSON → Python values, or ContractError: no NaN/Infinity (not JSON), integers
    within 64 bits (a 5,000-digit one would raise ValueError in int()), and nesting too deep for
    the parser (RecursionError) refused like any other malformed input. `invalid` starts the
    message for input that is not JSON at all."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            # strict UTF-8: json.loads alone would also accept UTF-16 and UTF-32 bytes
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError(f"{where}: {invalid} ({exc})") from None
    elif not isinstance(raw, str):
        raise ContractError(f"{where}: expected message bytes, got {type(raw).__name__}")
    try:
        return json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant)
    except _Refused as exc:
        raise ContractError(f"{where}: {exc}") from None
    except RecursionError:
        raise ContractError(f"{where}: {invalid} (nested too deeply to parse)") from None
    except ValueError as exc:  # JSONDecodeError is one
        raise ContractError(f"{where}: {invalid} ({exc})") from None


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # before int(): Python refuses over 4,300 digits with ValueError
        raise _Refused(f"integer of {len(text.lstrip('-'))} digits is out of the 64-bit range")
    value = int(text)
    if not _INT64[0] <= value <= _INT64[1]:
        raise _Refused(f"integer {text} is out of the 64-bit range")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise _Refused(f"number {text[:40]} is out of the double range")
    return value


def _refuse_constant(name: str):
    raise _Refused(f"{name} is not a JSON number")
