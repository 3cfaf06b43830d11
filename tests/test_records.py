"""The message contract: every invalid message is refused with a reason a person can act on."""

import json

import pytest

from topics import (
    SCHEMA_VERSION,
    CandidateFact,
    Chunk,
    ContractError,
    DeadLetter,
    Document,
    FactEvent,
    Topics,
    decode,
    encode,
)
from topics.records import Triple


def doc(**over):
    return json.dumps({"v": 1, "tenant": "acme", "doc_id": "d1", "text": "Ada Lovelace wrote notes.", **over}).encode()


def test_document_roundtrip_keeps_every_field():
    d = Document(
        tenant="acme",
        doc_id="d1",
        text="hello",
        metadata={"k": 1},
        version=3,
        session_id="s",
        turn=2,
        speaker="user",
        ts=1.5,
    )
    assert decode(Document, encode(d)) == d
    assert json.loads(encode(d))["v"] == SCHEMA_VERSION
    assert d.key == "acme/d1"  # every version and the tombstone of one document share the key


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\xff\xfe", "not valid UTF-8 JSON"),
        (b"{not json", "not valid UTF-8 JSON"),
        (b"[1, 2]", "expected a JSON object, got array"),
        (doc(v=None), "missing schema version field 'v'"),
        (doc(v=2), "unsupported schema version v=2"),
        (json.dumps({"v": 1, "tenant": "acme", "text": "x"}).encode(), "missing required field 'doc_id'"),
        (doc(text=""), "field 'text' is empty"),
        (doc(text="   \n"), "field 'text' is empty"),
        (doc(text=5), "documents.text: expected string, got number"),
        (doc(version="1"), "documents.version: expected integer, got string"),
        (doc(metadata=[]), "documents.metadata: expected object, got array"),
        (doc(tenant="../etc"), "invalid tenant '../etc'"),
        (doc(tenant=""), "invalid tenant ''"),
    ],
)
def test_document_errors_name_the_problem(raw, message):
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        decode(Document, raw)


def test_text_over_the_limit_is_refused_with_sizes():
    with pytest.raises(ContractError, match="is 1001 bytes, over the limit of 1000 bytes"):
        decode(Document, doc(text="x" * 1001), max_text_bytes=1000)
    assert decode(Document, doc(text="x" * 1000), max_text_bytes=1000).text == "x" * 1000


def test_a_title_is_a_name_and_over_512_characters_is_refused():
    """Every passage of a titled document holds its title as its subject and the entity it names:
    a 200,000-character title was indexed as both, in every passage."""
    with pytest.raises(ContractError, match="field 'title' is 513 characters, over the limit of 512"):
        decode(Document, doc(title="é" * 513))
    assert decode(Document, doc(title="é" * 512)).title == "é" * 512
    assert decode(Document, doc()).title is None


def test_default_limit_is_one_mebibyte():
    with pytest.raises(ContractError, match="over the limit of 1048576 bytes"):
        decode(Document, doc(text="é" * (1 << 19) + "x"))


def test_nested_fact_is_validated_with_its_path():
    cand = CandidateFact("acme", "p1", "d1", Triple("Ada", "wrote", "Notes"), 0, 1, "ada", "notes", "rules")
    assert decode(CandidateFact, encode(cand)) == cand
    data = json.loads(encode(cand))
    data["fact"]["relation"] = ""
    with pytest.raises(ContractError, match="candidate-facts.fact: field 'relation' is empty"):
        decode(CandidateFact, json.dumps(data))
    data["fact"]["relation"] = "wrote"
    data["fact"]["category"] = "GOSSIP"
    with pytest.raises(ContractError, match="category 'GOSSIP' is not one of DECLARATIVE"):
        decode(CandidateFact, json.dumps(data))


def test_other_records_roundtrip():
    chunk = Chunk("acme", "c1", "d1", 0, 1, "text", 1, "h")
    assert decode(Chunk, encode(chunk)) == chunk and chunk.key == "d1"
    event = FactEvent("acme", "activated", "e1", "f1", {"head": "a"}, ["p1"], 7, "", 1.0)
    assert decode(FactEvent, encode(event)) == event and event.key == "f1"
    letter = DeadLetter(topic="memstream.documents", payload="x", error="bad")
    assert decode(DeadLetter, encode(letter)) == letter


def test_topic_names_follow_the_namespace():
    assert Topics().all() == [
        "memstream.documents",
        "memstream.chunks",
        "memstream.candidate-facts",
        "memstream.conflict-sets",
        "memstream.indexed-facts",
        "memstream.dlq",
    ]
    assert Topics("staging").dlq == "staging.dlq"
