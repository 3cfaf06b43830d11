"""`memstream publish` input handling, without Kafka: every bad document is named with its
reason, and the good ones around it are kept."""

import io
import json

from ops.publish import load_documents


def test_each_supported_format(tmp_path):
    (tmp_path / "a.txt").write_text("Ada wrote notes.")
    (tmp_path / "b.md").write_text("# Title\nBody")
    (tmp_path / "c.json").write_text(json.dumps({"doc_id": "c", "text": "C text", "metadata": {"src": "x"}}))
    (tmp_path / "d.json").write_text(json.dumps([{"doc_id": "d1", "text": "one"}, {"doc_id": "d2", "text": "two"}]))
    (tmp_path / "e.jsonl").write_text('{"doc_id": "e1", "text": "e one"}\n\n{"doc_id": "e2", "text": "e two"}\n')
    paths = [str(tmp_path / n) for n in ("a.txt", "b.md", "c.json", "d.json", "e.jsonl")]
    loaded = load_documents(paths, "acme", 1000)
    assert loaded.errors == []
    assert [d.doc_id for d in loaded.documents] == ["a", "b", "c", "d1", "d2", "e1", "e2"]
    assert all(d.tenant == "acme" for d in loaded.documents)
    assert loaded.documents[2].metadata == {"src": "x"}
    assert loaded.documents[0].text == "Ada wrote notes."


def test_stdin_text_and_json(tmp_path):
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO("plain words"))
    assert loaded.documents[0].text == "plain words" and loaded.documents[0].doc_id.startswith("stdin-")
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO('[{"doc_id": "x", "text": "y"}]'))
    assert [d.doc_id for d in loaded.documents] == ["x"]


def test_bad_documents_are_named_and_the_rest_kept(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "big.txt").write_text("x" * 2000)
    (tmp_path / "broken.json").write_text("{nope")
    (tmp_path / "mixed.jsonl").write_text('{"doc_id": "ok", "text": "fine"}\n{"doc_id": "no-text"}\n{bad\n')
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "x.pdf").write_text("%PDF")
    names = ["empty.txt", "big.txt", "broken.json", "mixed.jsonl", "latin1.txt", "x.pdf", "missing.txt"]
    loaded = load_documents([str(tmp_path / n) for n in names], "acme", 1000)
    assert [d.doc_id for d in loaded.documents] == ["ok"]
    errors = "\n".join(loaded.errors)
    assert "empty.txt: field 'text' is empty" in errors
    assert "big.txt: field 'text' is 2000 bytes, over the limit of 1000 bytes" in errors
    assert "broken.json: invalid JSON" in errors
    assert "mixed.jsonl:2: missing required field 'text'" in errors
    assert "mixed.jsonl:3: invalid JSON" in errors
    assert "latin1.txt: not UTF-8 text" in errors
    assert "x.pdf: unsupported file type '.pdf'" in errors
    assert "missing.txt: no such file" in errors
    assert len(loaded.errors) == 8


def test_times_and_ttls_the_workers_would_refuse_are_refused_at_load(tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"doc_id": "ok", "text": "fine", "metadata": {"ttl_seconds": 60}}\n'
                                         '{"doc_id": "ttl", "text": "x", "metadata": {"ttl_seconds": "1d"}}\n'
                                         '{"doc_id": "ms", "text": "x", "ts": 1683554160000}\n'
                                         '{"session_id": "s", "turn": 0, "speaker": "Ana", "text": "x", "ts": 1683554160000}\n')
    loaded = load_documents([str(tmp_path / "docs.jsonl")], "acme", 1000)
    assert [d.doc_id for d in loaded.documents] == ["ok"]
    errors = "\n".join(loaded.errors)
    assert "docs.jsonl:2: metadata.ttl_seconds must be a whole number of seconds" in errors
    assert "docs.jsonl:3: 'ts' must be seconds since the epoch within years 1-9999 (got 1.68355e+12: milliseconds?)" in errors
    assert "docs.jsonl:4: 'ts' must be seconds since the epoch within years 1-9999 (got 1.68355e+12: milliseconds?)" in errors
