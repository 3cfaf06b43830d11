"""Property-based tests (hypothesis) of memstream's edges, where untrusted input comes in (issue
12, item 6): the record decoders of every topic, `memstream publish`'s loaders, normalisation and
chunking, conversation parsing, the HTTP API and the envelope of the indexing stages.

The properties: a decoder raises ContractError naming its topic and nothing else, and a record it
returns encodes and decodes to itself; a loader never raises, names the file (line, turn) of
every rejection and loses no input silently; chunks stay within their window and are slices of
the text; the HTTP API never answers 5xx and every 4xx is JSON {"error"} naming what is wrong;
no message escapes the envelope as an exception, and an undecodable one is a dead letter with
its reason.

Each target runs the number of cases given with it (CASES counts what ran; the end of the pytest
run prints it, tests/conftest.py), derandomized: the same cases every run, as CI needs.
MEMSTREAM_FUZZ_SCALE=N runs N times as many from a random seed (the long run, README); a failure
prints the example and a @reproduce_failure blob. A bug a property found is fixed where it was
and its example pinned with @example on the property that found it."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import json
import logging
import math
import os
import string
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yarl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ops.publish import load_documents
from topics import ContractError, DocumentDeletion, decode, encode, parse_json
from topics.conversations import canonical_dia_id, is_locomo, locomo_turns, parse_evidence, parse_time, turn_from_json
from topics.records import (
    DEFAULT_MAX_TEXT_BYTES,
    FACT_CATEGORIES,
    CandidateFact,
    Chunk,
    ConflictSet,
    DeadLetter,
    Document,
    FactEvent,
    Triple,
)
from topics.times import EARLIEST_TS, LATEST_TS
from workers.algorithms.chunking import _TOKEN as TOKEN
from workers.algorithms.chunking import MAX_TOKEN_CHARS, chunk_id_of, chunk_text, token_count
from workers.algorithms.normalize import UnnamedEntity, entity_id, has_entity_id, relation_name
from workers.envelope import decode_document
from workers.pipeline import Pipeline

SCALE = int(os.environ.get("MEMSTREAM_FUZZ_SCALE", "1"))
CASES: Counter[str] = Counter()  # target → cases run in this session (printed by tests/conftest.py)
PLANNED: list[int] = []  # each target's max_examples × its parametrized runs


def fuzz(cases: int, runs: int = 1) -> settings:
    """A target's settings: `cases` examples (× MEMSTREAM_FUZZ_SCALE) in each of its `runs`
    (parametrized) tests, no deadline (the CI machine is shared), derandomized unless scaled up;
    no example database (nothing is written to the checkout)."""
    PLANNED.append(cases * SCALE * runs)
    return settings(
        max_examples=cases * SCALE,
        deadline=None,
        derandomize=SCALE == 1,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


# ---- strategies -----------------------------------------------------------------------------
# Any character, lone surrogates and control characters included; and the clean ones a valid
# record may hold in a strict field.
ANY_CHAR = st.characters(exclude_categories=())
CLEAN_CHAR = st.characters(exclude_categories=("Cc", "Cs"))
FREE_CHAR = st.one_of(CLEAN_CHAR, st.sampled_from("\t\n\r"))
# The input a fuzzer's dictionary would hold: integers past Python's 4,300-digit int() limit,
# dialogue ids, session keys, JSON punctuation, prompt delimiters, whitespace of every kind
LONG_DIGITS = st.integers(4290, 4400).map(lambda n: "1" * n)
TOKENS = st.sampled_from(
    [
        "D1:3",
        "D:11:26",
        "D30:05",
        "session_1",
        "session_2_date_time",
        "1:56 pm on 8 May, 2023",
        "2023-05-08T13:56:00Z",
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00+01:00",
        "NaN",
        "Infinity",
        "-0",
        "1e999",
        "TEXT>>>",
        "\u2028",
        "\u3000",
        "\x1f",
        "\x00",
        "\ufeff",
        "C++",
        ".NET",
        "the",
        "is",
        "  ",
        "\r\n",
        "日本語",
        "١٢٣",
    ]
)
# (one string in ten holds a number past the limit: they are costly to make and parse)
any_text = st.integers(0, 9).flatmap(
    lambda roll: (
        st.tuples(st.sampled_from(["", "D", "D1:", "session_"]), LONG_DIGITS).map("".join)
        if roll == 0
        else st.one_of(
            st.text(ANY_CHAR, max_size=40),
            TOKENS,
            st.lists(st.one_of(TOKENS, st.text(ANY_CHAR, max_size=6)), max_size=6).map("".join),
        )
    )
)
clean_text = st.text(CLEAN_CHAR, min_size=1, max_size=30).filter(str.strip)
free_text = st.text(FREE_CHAR, min_size=1, max_size=200).filter(str.strip)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), int64, st.floats(), any_text)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)),
    max_leaves=8,
)
json_small = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(any_text, inner, max_size=2)),
    max_leaves=3,
)  # inside other shapes
clean_json = st.recursive(
    st.one_of(st.none(), st.booleans(), int64, finite, st.text(FREE_CHAR, max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(FREE_CHAR, max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
tenants = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
strict = st.text(CLEAN_CHAR, max_size=20)
metadata = st.dictionaries(st.text(FREE_CHAR, max_size=8).filter(lambda k: k != "ttl_seconds"), clean_json, max_size=3)
epoch = st.floats(EARLIEST_TS, LATEST_TS)


def dumps(value, ascii_only: bool = False) -> bytes:
    """JSON bytes as a careless producer writes them: NaN and Infinity as Python writes them, lone
    surrogates escaped (ascii_only) or as the invalid UTF-8 they encode to."""
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", errors="surrogatepass")


triples = st.builds(
    Triple,
    head=clean_text,
    relation=clean_text,
    tail=clean_text,
    head_type=strict,
    tail_type=strict,
    category=st.sampled_from(FACT_CATEGORIES),
    valid_from=st.none() | strict,
    valid_to=st.none() | strict,
    stated=st.booleans(),
)
candidates = st.builds(
    CandidateFact,
    tenant=tenants,
    passage_id=strict,
    doc_id=strict,
    fact=triples,
    fact_index=int64,
    chunk_fact_count=int64,
    head_id=strict,
    tail_id=strict,
    extractor=strict,
    activation=st.booleans(),
    work_id=strict,
)
VALID = {
    Document: st.builds(
        Document,
        tenant=tenants,
        doc_id=clean_text,
        text=free_text,
        metadata=metadata,
        version=int64,
        session_id=st.none() | strict,
        turn=st.none() | int64,
        speaker=st.none() | strict,
        ts=st.none() | epoch,
    ),
    Chunk: st.builds(
        Chunk,
        tenant=tenants,
        chunk_id=strict,
        doc_id=strict,
        seq=int64,
        n_chunks=int64,
        text=free_text,
        doc_version=int64,
        doc_hash=strict,
        context=strict,
        metadata=metadata,
    ),
    CandidateFact: candidates,
    ConflictSet: st.builds(
        ConflictSet,
        tenant=tenants,
        kind=st.sampled_from(ConflictSet.KINDS),
        candidate=candidates,
        fact_id=strict,
        conflicting=st.lists(strict, max_size=3),
        passage_ids=st.lists(strict, max_size=3),
        work_id=strict,
        reason=st.text(FREE_CHAR, max_size=20),
    ),
    FactEvent: st.builds(
        FactEvent,
        tenant=tenants,
        event=strict,
        event_id=strict,
        fact_id=strict,
        fact=metadata,
        passage_ids=st.lists(strict, max_size=3),
        graph_version=int64,
        reason=st.text(FREE_CHAR, max_size=20),
        ts=finite,
        evidence_passage_ids=st.lists(strict, max_size=3),
    ),
    DeadLetter: st.builds(
        DeadLetter,
        topic=strict,
        payload=st.text(CLEAN_CHAR | st.characters(categories=("Cc",)), max_size=40),
        error=st.text(max_size=40),
        key=st.none() | st.text(max_size=10),
        partition=st.none() | int64,
        offset=st.none() | int64,
        attempts=int64,
        tenant=st.none() | tenants,
        ts=finite,
        payload_bytes=int64,
        payload_sha256=strict,
        payload_truncated=st.booleans(),
    ),
}
RECORDS = list(VALID)


@st.composite
def mutated_fields(draw, cls, values) -> dict:
    """A valid record's fields with one to three mutations anywhere in them (nested records and
    metadata too): a field dropped, a field's value replaced by one of `values`, a field added,
    or the schema version changed."""
    data = draw(VALID[cls]).to_dict()
    for _ in range(draw(st.integers(1, 3))):
        objects, pending = [], [data]
        while pending:  # every object in the record
            item = pending.pop()
            if isinstance(item, dict):
                objects.append(item)
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
        target = draw(st.sampled_from(objects))
        action = draw(st.sampled_from(["drop", "replace", "replace", "add", "version"]))
        if action == "version":
            data["v"] = draw(values)
        elif action == "add" or not target:
            target[draw(any_text)] = draw(values)
        else:
            name = draw(st.sampled_from(sorted(target)))
            if action == "drop":
                del target[name]
            else:
                target[name] = draw(values)
    return data


def mutated(cls) -> st.SearchStrategy[bytes]:
    """The JSON bytes of mutated_fields with any JSON values."""
    return st.tuples(mutated_fields(cls, json_value), st.booleans()).map(lambda case: dumps(*case))


# ---- the record decoders (topics/records.py) ------------------------------------------------
def check_decode(target: str, cls, raw) -> None:
    """decode raises ContractError naming the topic, nothing else; a record it returns encodes
    and decodes to itself."""
    CASES[target] += 1
    try:
        record = decode(cls, raw)
    except ContractError as exc:
        assert str(exc).startswith(f"{cls.TOPIC}"), exc
        return
    assert isinstance(record, cls)
    assert decode(cls, encode(record)) == record


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.TOPIC)
@fuzz(200, runs=len(RECORDS))
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        st.text(ANY_CHAR, max_size=100),
        json_value.map(dumps),
        st.dictionaries(any_text, json_value, max_size=6).map(lambda d: dumps({"v": 1, **d})),
    )
)
def test_decode_arbitrary_bytes_text_and_json(cls, raw):
    """200 cases per topic: bytes, text, any JSON value, any JSON object of schema version 1."""
    check_decode("decode: arbitrary input", cls, raw)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.TOPIC)
@fuzz(150, runs=len(RECORDS))
@given(data=st.data())
def test_decode_mutated_valid_records(cls, data):
    """150 cases per topic: a valid record of the topic with one to three mutations."""
    check_decode("decode: mutated records", cls, data.draw(mutated(cls)))


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.TOPIC)
@fuzz(50, runs=len(RECORDS))
@given(data=st.data())
def test_every_valid_record_decodes_to_itself(cls, data):
    """50 cases per topic: a record built from valid fields comes back equal through encode/decode."""
    CASES["decode: valid records"] += 1
    record = data.draw(VALID[cls])
    assert decode(cls, encode(record)) == record


# what a Python producer may hold: integers past 64 bits, NaN and infinities (json.dumps writes them)
python_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(FREE_CHAR, max_size=10),
        st.sampled_from([1 << 64, -(1 << 63) - 1, math.nan, math.inf, -math.inf]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(FREE_CHAR, max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.TOPIC)
@fuzz(50, runs=len(RECORDS))
@given(data=st.data())
def test_what_from_dict_accepts_decode_accepts(cls, data):
    """50 cases per topic: a valid record's fields mutated with any Python values (as a producer
    in Python builds one: `memstream publish`'s turns, the MCP `remember`): what Record.from_dict
    accepts, the workers' decode accepts as the same record."""
    CASES["decode: from_dict agrees"] += 1
    fields = data.draw(mutated_fields(cls, python_value))
    try:
        record = cls.from_dict(fields)
    except ContractError:
        return
    assert decode(cls, encode(record)) == record


@pytest.mark.parametrize("value", [1 << 70, -(1 << 63) - 1, math.nan, math.inf, [{"deep": [-math.inf]}]])
def test_from_dict_refuses_numbers_the_workers_would_refuse(value):
    """Found by the property above: metadata holding an integer past 64 bits or a NaN passed
    from_dict (the MCP `remember` published it) and was dead-lettered by the chunker."""
    with pytest.raises(ContractError, match=r"documents\.metadata\[.n.\]"):
        Document.from_dict({"tenant": "t", "doc_id": "d", "text": "x", "metadata": {"n": value}})


# ---- `memstream publish`'s loaders (ops/publish.py) -----------------------------------------
def sometimes(good):
    """Mostly a good value, sometimes anything."""
    return st.one_of(good, good, json_small)


def optional_fields(**fields):
    """Objects with any subset of `fields` (name → strategy) and perhaps an unknown one."""
    return st.fixed_dictionaries({}, optional={**fields, "extra": json_small})


document_objects = optional_fields(
    doc_id=sometimes(clean_text),
    text=sometimes(free_text),
    tenant=sometimes(tenants),
    metadata=sometimes(metadata),
    version=sometimes(int64),
    ts=sometimes(epoch),
)
turn_objects = st.fixed_dictionaries(
    {"turn": sometimes(st.integers(0, 50))},
    optional=dict(
        session_id=sometimes(clean_text),
        speaker=sometimes(clean_text),
        text=sometimes(free_text),
        tenant=sometimes(tenants),
        ts=st.one_of(epoch, TOKENS, json_small),
        turn_id=sometimes(clean_text),
        doc_id=sometimes(clean_text),
        metadata=sometimes(metadata),
    ),
)
session_keys = st.one_of(st.integers(0, 30).map("session_{}".format), LONG_DIGITS.map("session_{}".format), any_text)
locomo_rows = st.lists(
    st.one_of(
        optional_fields(
            speaker=sometimes(clean_text),
            text=sometimes(free_text),
            dia_id=st.one_of(TOKENS, any_text),
            img_url=any_text,
            blip_caption=st.one_of(any_text, json_small),  # a shared photo's caption joins the text
        ),
        json_small,
    ),
    max_size=3,
)
locomo_sample = st.fixed_dictionaries(
    {
        "conversation": st.dictionaries(session_keys, sometimes(locomo_rows), max_size=3).flatmap(
            lambda sessions: st.fixed_dictionaries(
                {
                    f"{k}_date_time": st.one_of(TOKENS, any_text, json_small)
                    for k in sessions
                    if isinstance(k, str) and k.startswith("session_")
                }
            ).map(lambda dates: {**sessions, **dates})
        )
    },
    optional={"sample_id": json_small, "qa": json_small, "speaker_a": json_small},
)
loader_json = st.one_of(
    document_objects,
    turn_objects,
    locomo_sample,
    st.lists(st.one_of(document_objects, turn_objects), max_size=4),
    st.lists(locomo_sample, min_size=1, max_size=2),
    json_value,
)
jsonl_lines = st.lists(
    st.one_of(
        document_objects.map(dumps),
        turn_objects.map(dumps),
        json_value.map(dumps),
        st.text(ANY_CHAR, max_size=30).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.just(b""),
    ),
    max_size=5,
).map(b"\n".join)
loader_input = st.one_of(
    st.binary(max_size=200),
    st.text(ANY_CHAR, max_size=100).map(lambda s: s.encode("utf-8", "surrogatepass")),
    loader_json.map(dumps),
    jsonl_lines,
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder for the files the cases load (hypothesis refuses a function's tmp_path)."""
    return tmp_path_factory.mktemp("publish")


def check_loaded(loaded, where: str) -> None:
    """Every rejection names `where` and says why; every document loaded is one the workers accept."""
    for error in loaded.errors:
        assert isinstance(error, str) and error.startswith(where) and len(error) > len(where) + 2, error
    for doc in loaded.documents:
        assert decode(Document, encode(doc)) == doc


@fuzz(400)
@given(name=st.sampled_from(["doc.txt", "doc.md", "doc.json", "doc.jsonl", "doc.pdf", "doc"]), raw=loader_input)
@example(name="doc.json", raw=b'{"conversation": {"session_' + b"1" * 4400 + b'": []}}').via(
    "a session number of 4,400 digits"
)
@example(
    name="doc.json",
    raw=b'{"conversation": {"session_1": [{"speaker": "A", "text": "t", "dia_id": "D1:' + b"2" * 4400 + b'"}]}}',
).via("a dia_id of 4,400 digits")
@example(name="doc.json", raw=b"[1, Infinity]").via("JSON Python reads and the contract refuses")
def test_publish_loads_any_file(scratch, name, raw):
    """400 cases: a .txt/.md/.json/.jsonl (or unsupported) file of any bytes, JSON, documents,
    turns, JSONL lines or LoCoMo samples. A file gives one document or one error per text file,
    per item of a JSON list and per non-blank JSONL line (an empty list or JSONL: one error)."""
    CASES["publish: files"] += 1
    path = scratch / name
    path.write_bytes(raw)
    loaded = load_documents([str(path)], "fuzz", 2000)
    check_loaded(loaded, str(path))
    outcomes = len(loaded.documents) + len(loaded.errors)
    if path.suffix in (".pdf", ""):  # refused by its name, whatever it holds
        assert outcomes == 1 and "unsupported file type" in loaded.errors[0]
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert outcomes == 1 and "not UTF-8" in loaded.errors[0]
        return
    if path.suffix in (".txt", ".md"):
        assert outcomes == 1
    elif path.suffix == ".jsonl":
        assert outcomes == max(1, sum(1 for line in text.split("\n") if line.strip()))  # none: one error
    else:
        try:
            data = parse_json(text, str(path), invalid="invalid JSON")  # the contract's JSON: no NaN, no Infinity
        except ContractError as exc:
            assert outcomes == 1 and loaded.errors[0] == str(exc)
            return
        if not is_locomo(data):  # (a LoCoMo sample gives a document or an error per turn, and per bad part)
            assert (
                outcomes == (max(1, len(data)) if isinstance(data, list) else 1)  # an empty list: one error
                or outcomes == 1
                and "invalid JSON" in loaded.errors[0]
            )


@fuzz(300)
@given(raw=loader_input)
def test_publish_loads_any_stdin(raw):
    """300 cases: the same inputs piped to `memstream publish -`: text, JSON or JSONL as it looks."""
    CASES["publish: stdin"] += 1
    loaded = load_documents(["-"], "fuzz", 2000, stdin=io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    check_loaded(loaded, "<stdin>")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = ""  # one error
    if not text.strip().startswith(("{", "[")):  # plain text: one document or one error
        assert len(loaded.documents) + len(loaded.errors) == 1


@fuzz(300)
@given(row=st.one_of(turn_objects, json_value))
def test_a_turn_line_is_a_turn_or_a_contract_error(row):
    """300 cases: topics.conversations.turn_from_json on turn-shaped and arbitrary values."""
    CASES["conversations: turn lines"] += 1
    try:
        turn = turn_from_json(row, "line 1")
    except ContractError as exc:
        assert str(exc).startswith("line 1: "), exc
        return
    assert turn.speaker.strip() and turn.text.strip() and turn.session_id.strip() and turn.doc_id
    assert turn.ts is None or EARLIEST_TS <= turn.ts <= LATEST_TS


# ---- conversations (topics/conversations.py) ------------------------------------------------
locomo_dates = st.builds(
    "{}:{:02d} {} on {} {}, {}".format,
    st.integers(0, 99),
    st.integers(0, 99),
    st.sampled_from(["am", "pm", "a.m.", "PM"]),
    st.integers(0, 99),
    st.sampled_from(["May", "january", "Sept", "Dec", "Mai", "x"]),
    st.integers(0, 99999),
)
iso_times = st.builds(
    lambda moment, zone: moment.isoformat() + zone,
    st.datetimes(),
    st.one_of(
        st.just(""),
        st.just("Z"),
        st.builds("{}{:02d}:{:02d}".format, st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59)),
    ),
)


@fuzz(1000)
@given(value=st.one_of(locomo_dates, iso_times, json_value, st.floats(), int64))
@example(value="9999-12-31T23:59:59-23:59").via("an ISO time in the year 10000 in UTC")
def test_parse_time_is_a_moment_within_years_1_to_9999_or_none(value):
    """1,000 cases: LoCoMo dates, ISO times (every zone), numbers and any JSON value."""
    CASES["conversations: parse_time"] += 1
    ts = parse_time(value)
    assert ts is None or (isinstance(ts, float) and EARLIEST_TS <= ts <= LATEST_TS), ts


@fuzz(800)
@given(evidence=st.one_of(any_text, st.lists(st.one_of(any_text, json_small), max_size=4), json_small))
@example(evidence="D" + "1" * 4400 + ":3").via("a session number of 4,400 digits")
def test_evidence_is_canonical_ids_in_order_without_repeats(evidence):
    """800 cases: parse_evidence and canonical_dia_id on any text, lists and JSON values."""
    CASES["conversations: parse_evidence"] += 1
    found = parse_evidence(evidence)
    assert len(found) == len(set(found))
    for dia in found:
        assert (
            canonical_dia_id(dia) == dia
            and dia[0] == "D"
            and all(part.isascii() and part.isdigit() for part in dia[1:].split(":"))
        )
    for item in evidence if isinstance(evidence, list) else [evidence]:
        if isinstance(item, str):
            assert canonical_dia_id(item) in ([None] if not found else found + [None])


@fuzz(200)
@given(data=st.one_of(locomo_sample, st.lists(st.one_of(locomo_sample, json_small), max_size=3), json_value))
def test_locomo_turns_reads_the_turns_and_names_each_bad_part(data):
    """200 cases: LoCoMo-shaped and arbitrary values. With an error list nothing is raised; without,
    only a ContractError, the first of those errors."""
    CASES["conversations: locomo_turns"] += 1
    errors: list[str] = []
    turns = locomo_turns(data, "in.json", errors)
    assert all(error.startswith("in.json") for error in errors)
    for turn in turns:
        assert turn.speaker and turn.text.strip() and turn.turn >= 1 and turn.turn_id == canonical_dia_id(turn.turn_id)
    try:
        assert locomo_turns(data, "in.json") == turns and not errors
    except ContractError as exc:
        assert errors and str(exc) == errors[0]


# ---- normalisation and chunking (workers/algorithms) ----------------------------------------
names = st.one_of(
    any_text,
    st.text(CLEAN_CHAR, max_size=30),
    st.lists(
        st.sampled_from(
            ["the", "a", "C", "++", "#", ".", "NET", "Eiffel", "-", " ", "\t", "İ", "ß", "ﬁ", "Ⅻ", "①", "_"]
        ),
        max_size=6,
    ).map("".join),
)


@fuzz(1500)
@given(name=names, relation=names)
def test_ids_are_canonical_and_cannot_collide_through_the_separator(name, relation):
    """1,500 cases: entity_id is word characters and '_', the same for its own output, or
    UnnamedEntity; relation_name is lower-case words joined by single spaces. Neither holds the
    separator of short_hash (fact and schema ids), so distinct parts give distinct ids."""
    CASES["normalize: ids"] += 1
    try:
        eid = entity_id(name)
    except UnnamedEntity:
        assert not has_entity_id(name)
        eid = None
    if eid is not None:
        assert has_entity_id(name) and eid.strip("_") and all(c.isalnum() or c == "_" for c in eid)
        assert entity_id(eid) == eid
    rel = relation_name(relation)
    assert rel and rel == " ".join(rel.split()) and rel == rel.lower() and all(c.isalnum() or c in " _" for c in rel)


chunk_alphabet = st.one_of(st.sampled_from(" \t\n\r\u3000\u2028ab日本語カ"), CLEAN_CHAR)
chunk_texts = st.one_of(
    st.text(chunk_alphabet, max_size=300),
    st.lists(
        st.one_of(
            st.text(chunk_alphabet, max_size=12),
            st.integers(1, 200).map(lambda n: "x" * n),
            st.integers(1, 300).map(lambda n: " " * n),
        ),
        max_size=30,
    ).map("".join),
)


@fuzz(1800)
@given(text=chunk_texts, window=st.integers(1, 30), overlap_share=st.floats(0, 1, exclude_max=True))
def test_chunks_stay_within_the_window_and_are_slices_of_the_text(text, window, overlap_share):
    """1,800 cases: any text (words, runs of one character, long whitespace, unspaced scripts)
    and window: every chunk holds at most `window` tokens and window × MAX_TOKEN_CHARS characters,
    is a slice of the text from a token to a token, in order, together covering every token; a
    text within one window comes back unchanged; ids are the chunks' content hashes, the same
    every time."""
    CASES["chunking: chunk_text"] += 1
    overlap = int(overlap_share * window)
    chunks = chunk_text(text, window, overlap)
    assert chunks == chunk_text(text, window, overlap)  # stable
    tokens = token_count(text)
    if tokens == 0:
        assert chunks == []
        return
    if tokens <= window and len(text) <= window * MAX_TOKEN_CHARS:
        assert [c.text for c in chunks] == [text]
        return
    for seq, chunk in enumerate(chunks):
        assert chunk.seq == seq and chunk.chunk_id == chunk_id_of(chunk.text)
        assert 1 <= token_count(chunk.text) <= window and len(chunk.text) <= window * MAX_TOKEN_CHARS
    assert slices_covering(text, [c.text for c in chunks]), (
        "the chunks are not slices of the text, in order, covering every token"
    )


def slices_covering(text: str, pieces: list[str]) -> bool:
    """Whether `pieces` are slices of `text` from a token to a token, each starting after the one
    before, with nothing but whitespace outside them. A piece can occur at several places (a text
    of one repeated word), so every placement is tried."""
    spans = [m.span() for m in TOKEN.finditer(text)]
    starts, ends = {s for s, _ in spans}, {e for _, e in spans}

    @functools.cache
    def place(index: int, previous: int, covered: int) -> bool:
        if index == len(pieces):
            return not text[covered:].strip()
        piece = pieces[index]
        start = text.find(piece, previous + 1)
        while start >= 0 and not text[covered:start].strip():
            if (
                start in starts
                and start + len(piece) in ends
                and place(index + 1, start, max(covered, start + len(piece)))
            ):
                return True
            start = text.find(piece, start + 1)
        return False

    return place(0, -1, 0)


# ---- the HTTP API (workers/query/server.py) -------------------------------------------------
class HttpClient:
    """The query worker's application (query_app) served by aiohttp's test server on an event loop
    of its own, over the dev stack's Redis, holding one tenant with three passages and facts
    (tests/test_query_server.write_memory); requests are made synchronously, one at a time."""

    def __init__(self, redis_url: str):
        from aiohttp.test_utils import TestClient, TestServer

        from tests.inprocess import DigitBlindEmbedder
        from tests.test_query_server import write_memory
        from workers.query.server import query_app
        from workers.settings import Settings

        self.tenant = f"fuzz-{uuid.uuid4().hex[:10]}"
        self.loop = asyncio.new_event_loop()
        self.written = self.loop.run_until_complete(write_memory(redis_url, self.tenant))

        async def start():
            client = TestClient(
                TestServer(
                    query_app(Settings.from_env({}, redis_url=redis_url, tenant=self.tenant), DigitBlindEmbedder())
                )
            )
            await client.start_server()
            return client

        self.client = self.loop.run_until_complete(start())

    def request(self, method: str, url, **kwargs) -> tuple[int, object]:
        async def call():
            async with self.client.request(method, url, **kwargs) as response:
                body = await response.read()
                return response.status, response.content_type, body

        status, content_type, body = self.loop.run_until_complete(call())
        assert status < 500, (status, body[:500])
        if status >= 400:
            assert content_type == "application/json", (status, content_type, body[:200])
            error = json.loads(body).get("error")
            assert isinstance(error, str) and error.strip(), body
            return status, error
        return status, json.loads(body) if content_type == "application/json" else body

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(scope="module")
def http(stack_env):
    client = HttpClient(stack_env["MEMSTREAM_REDIS_URL"])
    yield client
    client.close()


PARAMS = {
    "layer_k": st.integers(1, 200),
    "tau_q": st.floats(-1, 1),
    "alpha": st.floats(0, 1000),
    "temperature": st.floats(0, 100),
    "damping": st.floats(0, 0.95, exclude_min=True),
    "tolerance": st.floats(1e-9, 1e-2),
    "constraint_boost": st.floats(0, 100),
    "hub_suppression": st.booleans(),
    "information_density": st.booleans(),
    "schema_seeds": st.booleans(),
}
BUDGET = {"steps": st.integers(1, 32), "passages": st.integers(1, 100), "tokens": st.integers(1, 100_000)}
# what an error about a field must mention
FIELD_WORDS = {
    "query": "query",
    "tenant": "tenant",
    "top_k": "top_k",
    "mode": "mode",
    "params": "param",
    "budget": "budget",
    "as_of": "as_of",
    "answer": "answer",
}


@st.composite
def query_bodies(draw) -> tuple[dict, str | None]:
    """A valid POST /v1/query body (every mode, parameters, budget, as_of) with at most one
    field replaced by anything: (body, the field replaced or None). The tenant is filled in by
    the test."""
    mode = draw(st.sampled_from(["ppr", "dense", "reconstruct", None]))
    body = {"query": draw(st.text(CLEAN_CHAR | st.just(" "), min_size=1, max_size=60).filter(str.strip))}
    if mode:
        body["mode"] = mode
    if draw(st.booleans()):
        body["top_k"] = draw(st.integers(1, 100))
    if draw(st.booleans()):
        body["params"] = draw(st.fixed_dictionaries({}, optional=PARAMS))
    if mode == "reconstruct" and draw(st.booleans()):
        body["budget"] = draw(st.fixed_dictionaries({}, optional=BUDGET))
    if draw(st.booleans()):
        body["as_of"] = draw(
            iso_times.filter(lambda t: not t.startswith("0001-01-01") and not t.startswith("9999-12-31"))
        )
    bad = draw(st.none() | st.sampled_from(sorted(FIELD_WORDS)))
    if bad is not None:
        body[bad] = draw(
            st.one_of(
                json_value,
                st.just(True),
                st.just(0),
                st.just(101),
                st.just(""),
                st.just("reconstruct"),
                st.dictionaries(st.sampled_from(sorted(PARAMS) + ["x"]), json_value, max_size=2),
                st.dictionaries(st.sampled_from(sorted(BUDGET) + ["x"]), json_value, max_size=2),
            )
        )
    return body, bad


@fuzz(300)
@given(case=query_bodies(), tenant_given=st.booleans())
def test_post_query_answers_a_valid_body_and_names_the_bad_field(http, case, tenant_given):
    """300 cases: a valid body is answered (200, the tenant's passages); a body with one field
    replaced by anything is answered or refused with a 400 naming that field (or, for NaN or
    Infinity, saying the body is no JSON); never a 5xx."""
    CASES["http: POST /v1/query (structured)"] += 1
    body, bad = case
    if tenant_given and bad != "tenant":
        body["tenant"] = http.tenant
    status, answer = http.request(
        "POST", "/v1/query", data=dumps(body, ascii_only=True), headers={"Content-Type": "application/json"}
    )
    if bad is None:
        assert status == 200, answer
        assert answer["tenant"] == http.tenant and isinstance(answer["passages"], list)
    elif status != 200:
        try:
            json.dumps(body[bad], allow_nan=False)
            expected = FIELD_WORDS[bad]
        except ValueError:  # NaN or Infinity: the body is no JSON, whatever field holds it
            expected = "is not a JSON number"
        assert status == 400 and expected in answer, (bad, body, answer)


@fuzz(300)
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        json_value.map(dumps),
        st.dictionaries(st.sampled_from(sorted(FIELD_WORDS) + ["x"]), json_value, max_size=6).map(dumps),
        st.dictionaries(any_text, json_value, max_size=4).map(
            lambda d: dumps({"query": "who runs the mill?", **d}, ascii_only=True)
        ),
    ),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]),
)
def test_post_query_never_fails_on_any_body(http, raw, content_type):
    """300 cases: any bytes, any JSON, any object of the request's fields: 200 or a JSON 4xx."""
    CASES["http: POST /v1/query (any body)"] += 1
    http.request("POST", "/v1/query", data=raw, headers={"Content-Type": content_type} if content_type else {})


url_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
raw_query_string = st.lists(
    st.one_of(
        st.sampled_from(["tenant=", "category=", "limit=", "&", "=", "%", "%ff", "%00", "%2F", "+", ";", "#"]),
        st.text(string.ascii_letters + string.digits + "-._~,", max_size=8),
    ),
    max_size=10,
).map("".join)


@fuzz(400)
@given(
    params=st.lists(
        st.tuples(
            st.sampled_from(["tenant", "category", "limit", "x"]),
            st.one_of(
                url_text,
                st.sampled_from(
                    FACT_CATEGORIES + ("", "HARD_CONSTRAINT,TOOL_FAILURE", "500", "501", "0", "²", " 5", "1e3")
                ),
                st.integers(0, 10**30).map(str),
            ),
        ),
        max_size=5,
    ),
    raw=st.none() | raw_query_string,
    own_tenant=st.booleans(),
)
def test_get_facts_never_fails_on_any_query_string(http, params, raw, own_tenant):
    """400 cases: GET /v1/facts with any tenant, categories and limits, repeated or not, as
    parameters or as a raw (percent-encoded, invalid UTF-8) query string."""
    CASES["http: GET /v1/facts"] += 1
    if own_tenant:
        params = [("tenant", http.tenant)] + params
    url = yarl.URL("/v1/facts?" + raw, encoded=True) if raw is not None else yarl.URL("/v1/facts").with_query(params)
    status, answer = http.request("GET", url)
    if status == 200:
        assert isinstance(answer["facts"], list) and answer["total"] >= len(answer["facts"])


@fuzz(400)
@given(
    route=st.sampled_from(["/v1/passages/{}", "/v1/facts/{}", "/v1/facts/{}/evidence"]),
    known=st.booleans(),
    record_id=url_text,
    tenant=st.one_of(st.none(), st.just("own"), url_text, tenants),
    raw_id=st.none() | raw_query_string,
)
def test_get_a_record_never_fails_on_any_id_or_tenant(http, route, known, record_id, tenant, raw_id):
    """400 cases: passages and facts by any id (or one of the tenant's own) in any tenant: 200,
    or 400/404 saying which."""
    CASES["http: GET /v1/passages|facts/{id}"] += 1
    if known:
        record_id = next(iter(http.written.values()))["passage" if route.startswith("/v1/passages") else "fact"]
    segment = raw_id if raw_id is not None else urllib.parse.quote(record_id, safe="")
    url = yarl.URL(route.format(segment), encoded=True)
    if tenant is not None:
        url = url.update_query(tenant=http.tenant if tenant == "own" else tenant)
    status, answer = http.request("GET", url)
    if known and tenant in (None, "own") and raw_id is None:
        assert status == 200, answer
    if status == 404:  # the tenant has no such record, or no route has such a path
        assert answer.startswith(("no passage ", "no fact ", "Not Found: GET /")), answer


# ---- the envelope (workers/envelope.py through workers.pipeline.Pipeline) -------------------
class Stages:
    """The four stages in process over InMemoryStore (tests/inprocess.py) with the real rules
    extractor, on an event loop of their own; retries do not wait (backoff patched to 0), and the
    workers' logs are off."""

    def __init__(self):
        from tests.inprocess import InProcess
        from workers.models.extraction import RulesExtractor

        self.loop = asyncio.new_event_loop()
        self.stages = InProcess(None, RulesExtractor())

    def deliver(self, topic: str, key: bytes | None, value: bytes | None) -> list[dict]:
        """The dead letters the message (and all it caused) gave."""
        before = len(self.stages.dead_letters())
        self.loop.run_until_complete(self.stages.deliver(topic, key, value))
        return self.stages.dead_letters()[before:]


@pytest.fixture(scope="module")
def stages():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("workers.envelope.backoff", lambda attempt: 0)
        patch.setattr(
            logging.getLogger("workers"), "disabled", True
        )  # a log line per dead letter and retry: the test checks them
        harness = Stages()
        yield harness
        harness.loop.run_until_complete(harness.stages.close())
        harness.loop.close()


@st.composite
def messages(draw) -> tuple[str, bytes | None, bytes | None]:
    topic = draw(st.sampled_from(sorted(Pipeline.RECORDS)))
    cls = Pipeline.RECORDS[topic]
    value = draw(
        st.one_of(st.none(), st.binary(max_size=120), json_small.map(dumps), mutated(cls), VALID[cls].map(encode))
    )
    # keys: any bytes, or a tenant/doc id (a tombstone's key on documents; a version's must be the
    # one its body names)
    return (
        topic,
        draw(st.none() | st.binary(max_size=20) | st.sampled_from([b"fuzz/doc-1", b"acme/x", b"acme/"])),
        value,
    )


@fuzz(400)
@given(message=messages())
def test_no_message_escapes_the_envelope(stages, message):
    """400 cases: any bytes, any JSON, mutated and valid records on each input topic. Nothing
    raises; an undecodable message is one dead letter with the decoder's reason and the message's
    bytes; a valid document is indexed without any dead letter; every dead letter says why."""
    CASES["envelope: any message"] += 1
    topic, key, value = message
    letters = stages.deliver(topic, key, value)
    try:
        if value is None and topic == "documents":  # a tombstone: deletes the document its key names
            DocumentDeletion.from_key(key)
            assert letters == []
            return
        if value is None:
            raise ContractError(f"{topic}: empty message (no value)")
        if topic == "documents":  # its key too: a keyed version must be under the key its body names
            decode_document(value, key, DEFAULT_MAX_TEXT_BYTES)
        else:
            decode(Pipeline.RECORDS[topic], value)
    except ContractError as exc:
        assert len(letters) == 1, letters
        (letter,) = letters
        assert (
            letter["topic"] == f"memstream.{topic}" and letter["error"] == str(exc)[:8192]
        )  # the letter's bound on errors
        assert letter["payload_sha256"] == hashlib.sha256(value or b"").hexdigest()
        return
    if topic == "documents":
        assert letters == []
    for letter in letters:
        assert letter["error"].strip()


def test_the_targets_plan_the_issues_ten_thousand_cases():
    """The targets above plan at least 10,000 cases in a plain run (the issue's bar)."""
    assert sum(PLANNED) >= 10_000 * SCALE, PLANNED
