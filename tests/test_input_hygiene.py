"""Input hygiene: poison values are refused with ContractError and a reason, names that
differ only by a symbol keep distinct entity ids, `publish` refuses control characters, GraphML
is always valid XML, and text without spaces is chunked within the window. All pure."""

import io
import json
import logging
import re
from xml.etree import ElementTree as ET

import pytest

from ops.export import to_graphml
from ops.publish import load_documents
from topics import CandidateFact, Chunk, ConflictSet, ContractError, DeadLetter, Document, decode, encode
from topics.records import MAX_DEPTH
from workers.algorithms.chunking import MAX_TOKEN_CHARS, chunk_id_of, chunk_text
from workers.algorithms.normalize import UnnamedEntity, entity_id
from workers.models.extraction import ReplayExtractor, RulesExtractor, parse_extraction


# ---- records: every poison value is a ContractError ---------------------------------------------
def _doc(**over) -> dict:
    return {"v": 1, "tenant": "acme", "doc_id": "d1", "text": "Ada Lovelace wrote notes.", **over}


def _candidate(**fact_over) -> dict:
    fact = {"head": "Ada", "relation": "wrote", "tail": "Notes", **fact_over}
    return {
        "v": 1,
        "tenant": "acme",
        "passage_id": "p1",
        "doc_id": "d1",
        "fact": fact,
        "fact_index": 0,
        "chunk_fact_count": 1,
        "head_id": "ada",
        "tail_id": "notes",
        "extractor": "rules",
    }


def _json(data) -> bytes:
    return json.dumps(data).encode()


def _with_raw(data: dict, name: str, raw_json: str) -> bytes:
    """data with field `name` set to raw JSON text (for what json.dumps cannot write)."""
    return _json({**data, name: "@@"}).replace(b'"@@"', raw_json.encode())


POISON = {
    "invalid UTF-8": b'{"v": 1, "tenant": "acme", "doc_id": "d1", "text": "caf\xe9"}',
    "UTF-16 bytes": json.dumps(_doc()).encode("utf-16"),
    "lone surrogate in text": _with_raw(_doc(), "text", '"ok \\ud800 then"'),
    "lone surrogate in doc_id": _with_raw(_doc(), "doc_id", '"\\udfff"'),
    "JSON nested 100k deep": b'{"v": 1, "tenant": "acme", "doc_id": "d1", "text": "x", "metadata": {"a": '
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}}",
    "5000-digit integer": _with_raw(_doc(), "version", "9" * 5000),
    "integer past 64 bits": _json(_doc(version=1 << 63)),
    "NaN": _with_raw(_doc(), "ts", "NaN"),
    "Infinity": _with_raw(_doc(), "ts", "-Infinity"),
    "1e999": _with_raw(_doc(), "ts", "1e999"),
    "NUL in text": _json(_doc(text="Ada\x00Lovelace")),
    "bell in text": _json(_doc(text="Ada\x07")),
    "C1 control in text": _json(_doc(text="Ada\x85")),
    "DEL in text": _json(_doc(text="Ada\x7f")),
    "tab in doc_id": _json(_doc(doc_id="d\t1")),
    "newline in speaker": _json(_doc(speaker="user\n")),
    "NUL in a metadata value": _json(_doc(metadata={"source": ["ok", "bad\x00"]})),
    "control character in a metadata key": _json(_doc(metadata={"k\x1b": 1})),
    "metadata nested too deep": _json(_doc(metadata={"a": json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)})),
    "schema version true": _json(_doc(v=True)),
    "wrong type": _json(_doc(turn="2")),
}


@pytest.mark.parametrize("raw", POISON.values(), ids=POISON.keys())
def test_each_poison_value_is_a_contract_error(raw):
    with pytest.raises(ContractError, match=r"^documents"):
        decode(Document, raw)


@pytest.mark.parametrize("raw", [None, 5, ["v"]], ids=["no value", "an int", "a list"])
def test_a_value_that_is_not_bytes_is_a_contract_error(raw):
    with pytest.raises(ContractError, match="expected message bytes"):
        decode(Document, raw)


@pytest.mark.parametrize(
    "cls, raw",
    [
        (
            Chunk,
            _json(
                {"v": 1, "tenant": "acme", "chunk_id": "c\x00", "doc_id": "d1", "seq": 0, "n_chunks": 1, "text": "x"}
            ),
        ),
        (
            Chunk,
            _with_raw(
                {"v": 1, "tenant": "acme", "chunk_id": "c", "doc_id": "d1", "seq": 0, "n_chunks": 1},
                "text",
                '"\\ud83d"',
            ),
        ),
        (CandidateFact, _json(_candidate(head="Ada\x00"))),
        (CandidateFact, _with_raw(_candidate(), "fact_index", "1" + "0" * 4999)),
        (
            ConflictSet,
            _json(
                {
                    "v": 1,
                    "tenant": "acme",
                    "kind": "duplicate",
                    "candidate": _candidate(tail="\x01"),
                    "fact_id": "f",
                    "conflicting": [],
                    "passage_ids": [],
                }
            ),
        ),
        (ConflictSet, b"[" * 100_000),
    ],
    ids=[
        "chunk id NUL",
        "chunk text surrogate",
        "fact head NUL",
        "fact index 5000 digits",
        "nested tail control",
        "deep",
    ],
)
def test_poison_on_every_input_topic_is_a_contract_error(cls, raw):
    with pytest.raises(ContractError, match=f"^{cls.TOPIC}"):
        decode(cls, raw)


def test_the_error_names_the_field_the_character_and_where_it_is():
    with pytest.raises(
        ContractError, match=r"^documents\.text: control character U\+0000 at index 3 \(free text allows only tab"
    ):
        decode(Document, _json(_doc(text="Ada\x00Lovelace")))
    with pytest.raises(
        ContractError, match=r"^documents\.doc_id: control character U\+0009 at index 1 \(no control characters"
    ):
        decode(Document, _json(_doc(doc_id="d\t1")))
    with pytest.raises(ContractError, match=r"^documents\.text: lone surrogate U\+D800 at index 3"):
        decode(Document, _with_raw(_doc(), "text", '"ok \\ud800"'))
    with pytest.raises(ContractError, match=r"^candidate-facts\.fact\.head: control character U\+0000"):
        decode(CandidateFact, _json(_candidate(head="Ada\x00")))
    with pytest.raises(ContractError, match=r"^documents\.metadata\['source'\]\[1\]: control character U\+0000"):
        decode(Document, _json(_doc(metadata={"source": ["ok", "bad\x00"]})))


def test_free_text_keeps_tab_newline_and_carriage_return_and_survives_a_roundtrip():
    raw = _json(_doc(text="Ada\tLovelace\r\nwrote notes.", metadata={"note": "line 1\nline 2"}))
    document = decode(Document, raw)
    assert document.text == "Ada\tLovelace\r\nwrote notes." and document.metadata == {"note": "line 1\nline 2"}
    assert decode(Document, encode(document)) == document
    candidate = decode(CandidateFact, _json(_candidate(head="Ada\tLovelace")))
    assert candidate.fact.head == "Ada\tLovelace"
    assert decode(Document, _json(_doc(text="東京 \U0001f600 ok"))).text == "東京 \U0001f600 ok"  # a proper pair


def test_a_dead_letter_keeps_the_bad_bytes_it_quarantines():
    letter = DeadLetter(
        topic="memstream.documents",
        payload='{"text": "a\x00\x1b"}',
        error="documents.text: control character U+0000",
        key="k\x00",
    )
    assert decode(DeadLetter, encode(letter)) == letter


# ---- entity ids ---------------------------------------------------------------------------------
def test_names_told_apart_by_a_symbol_keep_distinct_ids():
    names = ["C", "C++", "C#", "NET", ".NET", "F", "F#", "Google", "Google+"]
    ids = [entity_id(n) for n in names]
    assert len(set(ids)) == len(names), dict(zip(names, ids))
    assert entity_id("C++") == entity_id("c++") == "c_plus_plus" and entity_id("C#") == "c_sharp"
    assert entity_id(".NET") == entity_id("Dot NET") == "dot_net"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Alder Rowan", "alder_rowan"),
        ("The  Eiffel-Tower.", "eiffel_tower"),
        ("Node.js", "node_js"),
        ("ASP.NET", "asp_net"),
        ("AT&T", "at_t"),
        ("St. Louis", "st_louis"),
        ("#MeToo", "metoo"),
        ("a .763 average", "763_average"),
        ("São Paulo", "são_paulo"),
        ("...And Justice for All", "and_justice_for_all"),
        ("+44 20", "44_20"),
        ("_x_", "_x_"),
    ],
)
def test_ordinary_names_keep_the_ids_they_had(name, expected):
    assert entity_id(name) == expected  # existing memories stay valid


@pytest.mark.parametrize("name", ["+", "...", "#", "—", "$", "___", " \t ", "''"])
def test_a_name_of_only_punctuation_is_rejected(name):
    with pytest.raises(UnnamedEntity, match="has no letters or digits"):
        entity_id(name)


def test_rules_extractor_keeps_cpp_and_csharp_apart():
    extraction = RulesExtractor().extract_sync("C++ influenced C#.")
    assert [(f.head, f.relation, f.tail) for f in extraction.facts] == [("C++", "influence", "C#")]
    (fact,) = extraction.facts
    assert entity_id(fact.head) != entity_id(fact.tail)  # the pipeline would drop head == tail
    assert {e.name for e in extraction.entities} == {"C++", "C#"}


def test_llm_extraction_drops_unnamed_entities_and_their_facts(caplog):
    answer = {
        "entities": [{"name": "Ada", "type": "PERSON"}, {"name": "...", "type": "ENTITY"}],
        "facts": [
            {"head": "Ada", "relation": "wrote", "tail": "Notes", "head_type": "PERSON", "tail_type": "WORK"},
            {"head": "+", "relation": "plus", "tail": "Ada", "head_type": "ENTITY", "tail_type": "PERSON"},
        ],
    }
    with caplog.at_level(logging.WARNING, logger="workers.models.extraction"):
        extraction = parse_extraction(answer)
    assert [e.name for e in extraction.entities] == ["Ada"]
    assert [(f.head, f.tail) for f in extraction.facts] == [("Ada", "Notes")]
    assert "entity '...' dropped: its name has no letters or digits" in caplog.text
    assert "fact ('+', 'plus', 'Ada') dropped" in caplog.text


def test_replay_drops_unnamed_entities_and_their_facts(tmp_path):
    text = "Ada wrote Notes."
    from workers.algorithms.normalize import content_hash

    line = {
        "text_sha256": content_hash(text),
        "entities": [{"name": "Ada"}, {"name": "#"}],
        "facts": [
            {"head": "Ada", "relation": "wrote", "tail": "Notes"},
            {"head": "Ada", "relation": "is", "tail": "$"},
        ],
    }
    path = tmp_path / "replay.jsonl"
    path.write_text(json.dumps(line) + "\n")
    extraction = ReplayExtractor(path).by_sha[content_hash(text)]
    assert [e.name for e in extraction.entities] == ["Ada"]
    assert [(f.head, f.tail) for f in extraction.facts] == [("Ada", "Notes")]


# ---- publish ------------------------------------------------------------------------------------
def test_publish_refuses_control_characters_and_keeps_the_other_documents(tmp_path):
    (tmp_path / "good.txt").write_text("Ada wrote notes.\n\tIndented line.\r\n")
    (tmp_path / "nul.txt").write_text("Ada\x00wrote notes.")
    (tmp_path / "bell.json").write_text(
        json.dumps([{"doc_id": "ok", "text": "fine"}, {"doc_id": "bell", "text": "ding\x07"}])
    )
    (tmp_path / "lines.jsonl").write_text(
        '{"doc_id": "s", "text": "\\ud800"}\n{"doc_id": "n", "text": "x", "ts": NaN}\n'
        '{"doc_id": "big", "text": "x", "version": ' + "9" * 5000 + "}\n"
    )
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    names = ["good.txt", "nul.txt", "bell.json", "lines.jsonl", "deep.json"]
    loaded = load_documents([str(tmp_path / n) for n in names], "acme", 10_000)
    assert [d.doc_id for d in loaded.documents] == ["good", "ok"]
    errors = "\n".join(loaded.errors)
    # the field after the file, apart: "nul.txt.text" read as the name of another file
    assert f"{tmp_path / 'nul.txt'}: text: control character U+0000 at index 3" in errors
    assert f"{tmp_path / 'bell.json'}[1]: text: control character U+0007 at index 4" in errors
    assert "lines.jsonl:1: text: lone surrogate U+D800" in errors
    assert "lines.jsonl:2: NaN is not a JSON number" in errors
    assert "lines.jsonl:3: integer of 5000 digits is out of the 64-bit range" in errors
    assert "deep.json: invalid JSON (nested too deeply to parse)" in errors
    assert len(loaded.errors) == 6


def test_publish_refuses_control_characters_on_stdin():
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO("plain\x00words"))
    assert loaded.documents == [] and "<stdin>: text: control character U+0000" in loaded.errors[0]
    deep = "[" * 100_000 + "]" * 100_000
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(deep))
    assert loaded.documents == [] and "nested too deeply" in loaded.errors[0]


# ---- GraphML ------------------------------------------------------------------------------------
def test_graphml_is_valid_xml_whatever_the_names_hold():
    memory = {
        "tenant": "acme",
        "graph_version": 1,
        "schemas": [],
        "facts": [],
        "entities": [
            {"id": "ada", "name": "Ada\x00Love\x0blace\ud800\ufffe", "type": "PER\x1bSON"},
            {"id": "notes", "name": None, "type": "WORK"},
        ],
        "edges": [{"source": "e:ada", "target": "e:notes", "kind": "fact\x07", "weight": 1.0}],
    }
    root = ET.fromstring(to_graphml(memory))  # raises ParseError on any character XML 1.0 forbids
    ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
    nodes = {n.get("id"): [d.text for d in n.findall("g:data", ns)] for n in root.iter(f"{{{ns['g']}}}node")}
    assert nodes == {"e:ada": ["Ada\ufffdLove\ufffdlace\ufffd\ufffd", "PER\ufffdSON"], "e:notes": [None, "WORK"]}
    (edge,) = root.iter(f"{{{ns['g']}}}edge")
    assert [d.text for d in edge.findall("g:data", ns)] == ["fact\ufffd", "1.0"]


# ---- chunking text without spaces ----------------------------------------------------------------
def test_text_without_spaces_is_chunked_by_characters():
    text = "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(100_000))  # 100k Han characters
    chunks = chunk_text(text, window=200, overlap=40)
    assert max(len(c.text) for c in chunks) == 200  # a window of 200 tokens: 200 characters
    assert [c.seq for c in chunks] == list(range(len(chunks))) and len(chunks) == 625
    assert chunks[0].text + "".join(c.text[40:] for c in chunks[1:]) == text  # covered, overlapping by 40
    assert all(c.chunk_id == chunk_id_of(c.text) for c in chunks)
    assert chunk_text(text, window=200, overlap=40) == chunks  # stable ids


def test_japanese_with_latin_words_counts_each_kana_and_kanji():
    text = "東京は日本の首都です。Tokyo is the capital of Japan. " * 1000
    chunks = chunk_text(text, window=50, overlap=10)
    tokens = [len(re.findall(r"[\u3001-\u9fff]|[A-Za-z.]+", c.text)) for c in chunks]  # kana, kanji, 。 and words
    assert set(tokens[:-1]) == {50} and tokens[-1] <= 50
    assert chunks[0].text.startswith("東京は日本の首都です。Tokyo") and chunks[-1].text.endswith("Japan.")


def test_no_chunk_passes_the_window_whatever_the_text():
    window = 20
    texts = [
        "".join(f"{i:06d}" for i in range(20_000)),  # 120k characters of one unspaced Latin run
        (" " * 1000).join(f"w{i}" for i in range(300)),  # words far apart
        "word " * 10 + "".join(f"{i:06d}" for i in range(1000)),
    ]
    for text in texts:
        chunks = chunk_text(text, window=window, overlap=5)
        assert chunks and all(0 < len(c.text) <= window * MAX_TOKEN_CHARS for c in chunks)
        covered, start = set(), 0
        for chunk in chunks:  # slices of the text, in order, together covering every character but spaces
            start = text.index(chunk.text, start)
            covered.update(range(start, start + len(chunk.text)))
            start += 1
        assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())
    assert chunk_text("a short text", window=window, overlap=5)[0].text == "a short text"
