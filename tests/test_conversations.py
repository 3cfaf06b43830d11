"""Conversations in and drill-down out: `memstream publish` reads the LoCoMo layout and JSONL of
turns (bad turns named, the rest kept); each turn is one immutable passage whose metadata maps
back to its turn_id / dia_id, embedded with who said it and when; and a passage comes back
byte for byte as published, over HTTP and through `memstream passage --text`.

In-process (tests/inprocess.py, InMemoryStore) but for the last test, which runs the CLI and a
worker on the stack."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import urllib.request
import uuid

from ops.publish import load_documents
from tests import inprocess
from tests.conftest import MEMSTREAM, ROOT, running_workers
from tests.inprocess import InProcess
from topics import Document, encode
from workers.algorithms.chunking import chunk_id_of, chunk_text
from workers.algorithms.normalize import entity_id, fact_id, relation_name
from workers.models.extraction import RulesExtractor
from workers.query import drilldown
from workers.stages.chunker import context_of, pieces_of

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests

LOCOMO = {
    "sample_id": "conv-7",
    "conversation": {
        "speaker_a": "Caroline",
        "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a pottery class and made my first bowl."},
            {
                "speaker": "Melanie",
                "dia_id": "D1:2",
                "text": "Thanks! Caroline showed the bowl to Melanie at Tate Modern.",
            },
        ],
        "session_2_date_time": "4:10 pm on 14 October, 2023",
        "session_2": [
            {"speaker": "Melanie", "dia_id": "D2:1", "text": "I went to a pottery workshop and made a little bowl."},
            {"speaker": "Caroline", "dia_id": "D2:2", "text": "Thanks!", "img_url": "https://example.org/bowl.jpg"},
        ],
    },
    "qa": [{"question": "What did Caroline make in May?", "answer": "a bowl", "evidence": ["D1:1"], "category": 4}],
}


def run(coro):
    return asyncio.run(coro)


async def stored_passages(stages: InProcess) -> list[dict]:
    ids = await stages.memory.scan_ids(stages.tenant, "passages")
    return [p for p in await stages.memory.passages(stages.tenant, ids) if p]


async def index(stages: InProcess, documents) -> None:
    """`memstream publish --wait` of loaded documents into the harness's tenant."""
    for doc in documents:
        assert doc.tenant == stages.tenant
        stages.put("documents", doc.key.encode(), encode(doc))  # its key names its tenant and doc id
    await stages.drain()


# ---- loading ----------------------------------------------------------------------------------
def test_a_locomo_file_is_one_document_per_turn(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([LOCOMO]))
    loaded = load_documents([str(path)], "acme", 10_000)
    assert loaded.errors == []
    docs = loaded.documents
    assert [d.doc_id for d in docs] == ["conv-7:D1:1", "conv-7:D1:2", "conv-7:D2:1", "conv-7:D2:2"]
    first = docs[0]
    assert (first.tenant, first.session_id, first.turn, first.speaker) == ("acme", "conv-7:session_1", 1, "Caroline")
    assert first.ts == 1683554160.0  # 2023-05-08 13:56 UTC
    assert first.metadata == {
        "turn_id": "D1:1",
        "dia_id": "D1:1",
        "date": "1:56 pm on 8 May, 2023",
        "sample_id": "conv-7",
        "session": 1,
    }
    assert docs[3].metadata["img_url"] == "https://example.org/bowl.jpg"
    # stdin holds the same layout: read the same way
    assert load_documents(["-"], "acme", 10_000, stdin=io.StringIO(json.dumps(LOCOMO))).documents == docs


def test_bad_locomo_turns_are_named_and_the_rest_published(tmp_path):
    broken = json.loads(json.dumps(LOCOMO))
    broken["conversation"]["session_1"][1] = {"speaker": "Melanie", "dia_id": "D1:2"}  # no text
    broken["conversation"]["session_2"][0]["text"] = "null \x00 byte"
    broken["conversation"]["session_3"] = "not a list"
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([broken, {"sample_id": "x"}]))
    loaded = load_documents([str(path)], "acme", 10_000)
    assert [d.doc_id for d in loaded.documents] == ["conv-7:D1:1", "conv-7:D2:2"]
    assert loaded.errors == [
        f"{path}[0].conversation.session_1[1]: a turn needs non-empty strings 'speaker' and 'text'",
        f"{path}[0].conversation.session_3: expected a list of turns",
        f"{path}[1]: expected an object with a 'conversation' object (LoCoMo layout)",
        f"{path}: turn D2:1 of conv-7:session_2, position 1: text: control character U+0000 at index 5 "
        "(free text allows only tab, newline and carriage return)",
    ]


def test_two_locomo_turns_of_one_dia_id_each_name_the_other(tmp_path):
    """Before: both errors said "also at conv.json: turn D1:1 of conv-7:session_1", each naming
    itself; a turn's place now holds its position in the session."""
    sample = json.loads(json.dumps(LOCOMO))
    sample["conversation"]["session_1"][1]["dia_id"] = "D1:1"
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(sample))
    loaded = load_documents([str(path)], "acme", 10_000)
    assert [d.doc_id for d in loaded.documents] == ["conv-7:D2:1", "conv-7:D2:2"]
    first, second = (
        f"{path}: turn D1:1 of conv-7:session_1, position 1",
        f"{path}: turn D1:1 of conv-7:session_1, position 2",
    )
    assert [error.split(": doc id")[0] for error in loaded.errors] == [first, second]
    assert f"also at {second}: rename one" in loaded.errors[0] and f"also at {first}: rename one" in loaded.errors[1]


def test_a_locomo_turn_that_shares_a_photo_holds_its_caption_and_is_found_by_it(tmp_path):
    """LoCoMo's "take a look at this" turns answer in their photo: the caption follows the text
    (topics.conversations.locomo_text), so a question about the photo finds the turn. The
    dataset makers' image search words (`query`) stay metadata only, as the caption does too."""
    sample = json.loads(json.dumps(LOCOMO))
    sample["conversation"]["session_2"][1].update(
        {"blip_caption": " a photo of a painting of a\nsunset over a lake ", "query": "painting sunrise"}
    )
    sample["conversation"]["session_2"][0]["blip_caption"] = "   "  # no caption: the text as it is
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(sample))
    docs = load_documents([str(path)], "acme", 10_000).documents
    assert docs[3].text == "Thanks! [shared a photo of a painting of a sunset over a lake]"
    assert docs[3].metadata["query"] == "painting sunrise"
    assert docs[2].text == sample["conversation"]["session_2"][0]["text"]

    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await index(stages, load_documents([str(path)], stages.tenant, 10_000).documents)
            return await stages.query("Who painted a sunset?", top_k=1, mode="lexical")
        finally:
            await stages.close()

    answer = run(scenario())
    assert [p["metadata"]["dia_id"] for p in answer["passages"]] == ["D2:2"]


def test_jsonl_turns_mix_with_documents_and_bad_lines_are_named(tmp_path):
    lines = [
        {"doc_id": "notes", "text": "An ordinary document."},
        {
            "session_id": "s1",
            "turn": 0,
            "speaker": "user",
            "ts": "2024-05-02T09:30:00Z",
            "text": "Book a flight to Madrid.",
        },
        {
            "session_id": "s1",
            "turn": 1,
            "speaker": "agent",
            "ts": 1714642260,
            "text": "Done.",
            "turn_id": "t-1",
            "metadata": {"tool": "booking"},
        },
        {"session_id": "s1", "turn": "2", "speaker": "user", "text": "no turn number"},
        {"session_id": "s1", "turn": 3, "speaker": "user", "ts": "yesterday", "text": "bad time"},
        {"session_id": "s1", "turn": 4, "speaker": "", "text": "no speaker"},
    ]
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n{broken\n")
    loaded = load_documents([str(path)], "acme", 10_000)
    assert [d.doc_id for d in loaded.documents] == ["notes", "s1:0", "s1:t-1"]
    notes, first, second = loaded.documents
    assert (notes.session_id, notes.turn, notes.metadata) == (None, None, {})
    assert (first.session_id, first.turn, first.speaker, first.ts) == ("s1", 0, "user", 1714642200.0)
    assert first.metadata == {"turn_id": "0"}
    assert second.metadata == {"tool": "booking", "turn_id": "t-1"}
    assert loaded.errors == [
        f"{path}:4: 'turn' must be a non-negative integer",
        f"{path}:5: 'ts' must be seconds since the epoch or an ISO time, got 'yesterday'",
        f"{path}:6: a turn needs a non-empty string 'speaker'",
        f"{path}:7: invalid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))",
    ]
    # the same lines on stdin
    piped = load_documents(["-"], "acme", 10_000, stdin=io.StringIO("\n".join(json.dumps(line) for line in lines[:3])))
    assert piped.documents == loaded.documents


def test_input_is_read_as_the_bytes_it_is(tmp_path):
    """No newline translation (a CRLF stays a CRLF, in a file or on stdin), and JSONL lines end
    at newlines only: a line separator (U+2028) inside a JSON string is text."""
    (tmp_path / "crlf.txt").write_bytes("first line\r\nsecond line\r\n".encode())
    (tmp_path / "sep.jsonl").write_bytes(
        json.dumps({"doc_id": "sep", "text": "a\u2028b\u2029c"}, ensure_ascii=False).encode()
    )
    loaded = load_documents([str(tmp_path / "crlf.txt"), str(tmp_path / "sep.jsonl")], "acme", 10_000)
    assert loaded.errors == []
    assert [d.text for d in loaded.documents] == ["first line\r\nsecond line\r\n", "a\u2028b\u2029c"]
    stdin = io.TextIOWrapper(io.BytesIO(b"piped\r\ntext\r\n"), encoding="utf-8")
    assert load_documents(["-"], "acme", 10_000, stdin=stdin).documents[0].text == "piped\r\ntext\r\n"


# ---- passages ---------------------------------------------------------------------------------
def test_a_turn_is_one_passage_whatever_its_length():
    long_text = " ".join(f"word{i}" for i in range(900)) + "  \n"
    assert len(chunk_text(long_text)) > 4  # as a document it would be windows

    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await stages.publish("s1:0", long_text, session_id="s1", turn=0, speaker="Caroline", ts=1683554160.0)
            await stages.publish("doc", long_text)
            return await stored_passages(stages), stages.dead_letters()
        finally:
            await stages.close()

    passages, dead = run(scenario())
    assert dead == []
    turns = [p for p in passages if p["doc_id"] == "s1:0"]
    assert len(turns) == 1 and turns[0]["text"] == long_text and turns[0]["seq"] == 0
    assert turns[0]["context"] == "Caroline (8 May 2023 13:56 UTC):"
    assert turns[0]["metadata"] == {"session_id": "s1", "turn": 0, "speaker": "Caroline", "ts": 1683554160.0}
    assert len([p for p in passages if p["doc_id"] == "doc"]) == len(chunk_text(long_text))


def test_the_same_words_in_two_turns_are_two_passages_and_documents_keep_their_ids():
    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await stages.publish("s1:1", "Thanks!", session_id="s1", turn=1, speaker="Melanie")
            await stages.publish("s1:3", "Thanks!", session_id="s1", turn=3, speaker="Melanie")
            await stages.publish("a", "Paris is in France.")
            await stages.publish("b", "Paris is in France.")
            return await stored_passages(stages)
        finally:
            await stages.close()

    passages = run(scenario())
    thanks = sorted(p["doc_id"] for p in passages if p["text"] == "Thanks!")
    assert thanks == ["s1:1", "s1:3"]
    # documents that are not turns: one passage per text, its id the content hash, as before
    assert [p["id"] for p in passages if p["text"] == "Paris is in France."] == [chunk_id_of("Paris is in France.")]


def test_a_turn_published_again_with_its_speaker_corrected_is_indexed_again():
    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await stages.publish("s1:0", "We flew to Madrid.", session_id="s1", turn=0, speaker="Carolin")
            await stages.publish("s1:0", "We flew to Madrid.", session_id="s1", turn=0, speaker="Caroline")
            return await stages.memory.document_status(stages.tenant, "s1:0"), await stored_passages(stages)
        finally:
            await stages.close()

    status, passages = run(scenario())
    assert status.chunks == status.chunks_done == 1  # `publish --wait` returns
    assert sorted(p["context"] for p in passages) == ["Carolin:", "Caroline:"]


def test_passages_map_back_to_their_dia_ids(tmp_path):
    """Through the stored passages, a query's passages and a fact's evidence."""
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(LOCOMO))

    async def scenario():
        stages = InProcess(None, RulesExtractor(), tau=1)
        try:
            await index(stages, load_documents([str(path)], stages.tenant, 10_000).documents)
            answer = await stages.query("pottery bowl", top_k=4, mode="dense")
            facts = await stages.facts()
            evidence = [(await drilldown.fact_evidence(stages.memory, stages.tenant, fid)).to_json() for fid in facts]
            return await stored_passages(stages), answer, evidence
        finally:
            await stages.close()

    passages, answer, evidence = run(scenario())
    dia = {p["metadata"]["dia_id"]: p for p in passages}
    assert sorted(dia) == ["D1:1", "D1:2", "D2:1", "D2:2"]
    for turn_id, passage in dia.items():
        assert passage["doc_id"] == f"conv-7:{turn_id}"
        assert passage["text"] == LOCOMO["conversation"][f"session_{turn_id[1]}"][int(turn_id[3]) - 1]["text"]
    assert all(p["metadata"]["turn_id"] == turn_id for turn_id, p in dia.items())
    assert dia["D2:2"]["context"] == "Caroline (4:10 pm on 14 October, 2023):"
    assert dia["D2:2"]["metadata"]["img_url"] == "https://example.org/bowl.jpg"
    assert len(answer["passages"]) == 4
    assert all(p["metadata"]["dia_id"] in dia and p["context"] for p in answer["passages"])
    assert evidence and all(p["metadata"]["dia_id"] in dia for e in evidence for p in e["passages"])


def test_who_said_it_and_when_are_embedded(real_embedder, tmp_path):
    """Caroline's May turn ranks above Melanie's October one for "what did Caroline do last
    May", although Melanie's words alone are nearer the question (cosine with all-MiniLM-L6-v2:
    0.14 against 0.11 for the texts; 0.22 against 0.53 with the context lines)."""
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(LOCOMO))

    async def scenario():
        stages = InProcess(None, RulesExtractor(), real_embedder)
        try:
            docs = [
                d
                for d in load_documents([str(path)], stages.tenant, 10_000).documents
                if d.metadata["turn_id"] in ("D1:1", "D2:1")
            ]
            await index(stages, docs)
            vectors = await real_embedder.embed(["what did Caroline do last May"] + [d.text for d in docs])
            return await stages.query("what did Caroline do last May", top_k=2, mode="dense"), vectors
        finally:
            await stages.close()

    answer, vectors = run(scenario())
    assert float(vectors[0] @ vectors[2]) > float(vectors[0] @ vectors[1])  # the words alone: Melanie's is nearer
    assert [p["metadata"]["turn_id"] for p in answer["passages"]] == ["D1:1", "D2:1"]


# ---- drill-down through the CLI and HTTP on the stack -------------------------------------------
AWKWARD = {  # doc id → text: CRLF, tabs, trailing spaces, combining characters, emoji
    "crlf": "Line one\r\nLine two\r\n\r\n",
    "tabs": "\tindented\twith tabs\t \n  trailing spaces   ",
    "combining": "Cafe\u0301 vs Caf\u00e9, n\u0303, a\u0308\u0304",
    "emoji": "Family: \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 flag \U0001f1f8\U0001f1ea skin \U0001f44d\U0001f3fd",
}


def test_drill_down_returns_the_published_bytes(stack_env, tmp_path):
    tenant = f"conv-{uuid.uuid4().hex[:8]}"
    turns = [
        {"session_id": "s1", "turn": n, "speaker": "Caroline", "ts": 1683554160 + n, "text": text, "turn_id": f"t{n}"}
        for n, text in enumerate(AWKWARD.values())
    ]
    turns.append({"session_id": "s1", "turn": 9, "speaker": "Melanie", "text": "Caroline moved to Boston."})
    lines = [json.dumps(t, ensure_ascii=False) for t in turns] + [
        json.dumps({"doc_id": d, "text": t}, ensure_ascii=False) for d, t in AWKWARD.items()
    ]
    (tmp_path / "conv.jsonl").write_bytes("\n".join(lines).encode("utf-8"))
    (tmp_path / "raw.txt").write_bytes(AWKWARD["crlf"].encode("utf-8") + "\ttail \U0001f600  ".encode("utf-8"))
    paths = [str(tmp_path / "conv.jsonl"), str(tmp_path / "raw.txt")]
    documents = load_documents(paths, tenant, 1 << 20).documents
    expected = {p.chunk_id: p.text for doc in documents for p in pieces_of(doc, context_of(doc), 200, 40)}
    assert len(expected) == len(turns) + len(AWKWARD) + 1

    def memstream(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(MEMSTREAM + list(args), env=workers.env, cwd=ROOT, capture_output=True, timeout=180)

    (tmp_path / "workers").mkdir()
    with running_workers(stack_env, tmp_path / "workers", extractor="rules", tau=1) as workers:
        published = memstream("publish", *paths, "--tenant", tenant, "--wait", "--timeout", "120")
        assert published.returncode == 0, published.stderr.decode()
        base = f"http://127.0.0.1:{workers.env['MEMSTREAM_HTTP_PORT']}"
        for passage_id, text in expected.items():
            with urllib.request.urlopen(f"{base}/v1/passages/{passage_id}?tenant={tenant}", timeout=30) as response:
                assert json.loads(response.read().decode("utf-8"))["text"] == text
            printed = memstream("passage", passage_id, "--tenant", tenant, "--text")
            assert (printed.returncode, printed.stdout) == (0, text.encode("utf-8"))
        tabs = json.loads(
            memstream(
                "passage", next(i for i, t in expected.items() if t == AWKWARD["tabs"]), "--tenant", tenant
            ).stdout
        )
        assert tabs["metadata"]["turn_id"] == "t1" and tabs["context"].startswith("Caroline (8 May 2023")

        moved = fact_id(entity_id("Caroline"), relation_name("moved to"), entity_id("Boston"))
        fact = json.loads(memstream("fact", moved, "--tenant", tenant).stdout)
        evidence = json.loads(memstream("fact", moved, "--tenant", tenant, "--evidence").stdout)
        with urllib.request.urlopen(f"{base}/v1/facts/{moved}/evidence?tenant={tenant}", timeout=30) as response:
            assert json.loads(response.read()) == evidence
        assert fact["id"] == moved and evidence["fact"] == fact
        assert [(p["text"], p["metadata"]["turn_id"]) for p in evidence["passages"]] == [
            ("Caroline moved to Boston.", "9")
        ]

        missing = memstream("passage", "nope", "--tenant", tenant, "--text")
        assert (missing.returncode, missing.stdout) == (1, b"")
        assert missing.stderr.decode() == f"memstream passage: no passage 'nope' in tenant '{tenant}'\n"
        missing = memstream("fact", "nope", "--tenant", tenant, "--evidence")
        assert (missing.returncode, missing.stderr.decode()) == (
            1,
            f"memstream fact: no fact 'nope' in tenant '{tenant}'\n",
        )


# ---- one rule for what a turn is: `turn` set (topics.Document.is_turn) ----------------------------
def test_a_turn_is_a_document_with_turn_set_and_a_session_note_is_chunked_as_a_document(tmp_path):
    """The chunker, `memstream publish` and the MCP `remember` agree: `turn` makes a turn (one
    passage, with its context line); a session_id alone does not (windows, no context line)."""
    from workers.query.mcp_server import remembered_document

    long_text = " ".join(f"word{i}" for i in range(900))
    assert Document("acme", "t", "x", session_id="s1", turn=0).is_turn and Document("acme", "t", "x", turn=0).is_turn
    assert not Document("acme", "n", "x", session_id="s1").is_turn and not Document("acme", "d", "x").is_turn

    path = tmp_path / "session.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {"doc_id": "note", "session_id": "s1", "speaker": "Ana", "text": long_text},  # no turn: a document
                {"doc_id": "numbered", "turn": 2, "text": "a turn with no session"},
            ]
        )
        + "\n"
    )
    loaded = load_documents([str(path)], "acme", 1 << 20)
    assert [(d.doc_id, d.is_turn) for d in loaded.documents] == [("note", False)]
    assert loaded.errors == [f"{path}:2: a turn needs a non-empty string 'session_id'"]
    note_text = long_text.replace("word", "term")  # another text: documents' passages are content hashes
    remembered = remembered_document("acme", note_text, None, "s1", None, "Ana", None, None, 1 << 20)
    assert not remembered.is_turn and remembered.session_id == "s1"

    async def scenario():
        stages = InProcess(None, RulesExtractor())
        try:
            await stages.publish("note", long_text, session_id="s1", speaker="Ana")
            await stages.publish(remembered.doc_id, note_text, session_id="s1", speaker="Ana")
            await stages.publish("s1:0", long_text, session_id="s1", turn=0, speaker="Ana")
            return await stored_passages(stages)
        finally:
            await stages.close()

    passages = run(scenario())
    for doc_id in ("note", remembered.doc_id):
        pieces = [p for p in passages if p["doc_id"] == doc_id]
        assert len(pieces) == len(chunk_text(long_text)) > 1 and {p["context"] for p in pieces} == {""}
    [turn] = [p for p in passages if p["doc_id"] == "s1:0"]
    assert turn["text"] == long_text and turn["context"] == "Ana:"


def test_a_speakers_first_person_is_the_speaker():
    """ "I adopted a dog" said by Caroline: a fact headed by Caroline (before: no fact — "I" is no
    name, and "dog" no capitalised mention)."""
    from workers.models.extraction import RulesExtractor

    extraction = RulesExtractor().extract_sync("I adopted a dog last week.", "Caroline (1:56 pm on 8 May, 2023):")
    assert [(f.head, f.relation, f.tail, f.head_type) for f in extraction.facts] == [
        ("Caroline", "adopted", "dog", "SPEAKER")
    ]
    assert {e.name for e in extraction.entities} == {"Caroline", "dog"}
    # a pronoun or a time is no object; a plain document has no speaker to stand for "I"
    assert RulesExtractor().extract_sync("I love it so much!", "Caroline:").facts == []
    assert RulesExtractor().extract_sync("I adopted a dog last week.").facts == []
