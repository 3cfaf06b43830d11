"""`memstream publish` input handling, without Kafka: every bad document is named with its
reason, and the good ones around it are kept."""

import io
import json
import os

from ops.publish import load_documents
from ops.stack.services import free_port
from tests.conftest import Cli


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
    (tmp_path / "docs.jsonl").write_text(
        '{"doc_id": "ok", "text": "fine", "metadata": {"ttl_seconds": 60}}\n'
        '{"doc_id": "ttl", "text": "x", "metadata": {"ttl_seconds": "1d"}}\n'
        '{"doc_id": "ms", "text": "x", "ts": 1683554160000}\n'
        '{"session_id": "s", "turn": 0, "speaker": "Ana", "text": "x", "ts": 1683554160000}\n'
    )
    loaded = load_documents([str(tmp_path / "docs.jsonl")], "acme", 1000)
    assert [d.doc_id for d in loaded.documents] == ["ok"]
    errors = "\n".join(loaded.errors)
    assert "docs.jsonl:2: metadata.ttl_seconds must be a whole number of seconds" in errors
    assert (
        "docs.jsonl:3: 'ts' must be seconds since the epoch within years 1-9999 (got 1.68355e+12: milliseconds?)"
        in errors
    )
    assert (
        "docs.jsonl:4: 'ts' must be seconds since the epoch within years 1-9999 (got 1.68355e+12: milliseconds?)"
        in errors
    )


def test_a_folder_is_walked_and_doc_ids_are_paths_within_it(tmp_path):
    """Before: `publish notes/` was refused ("no such file"), and a/README.md and b/README.md
    were both doc id README."""
    notes = tmp_path / "notes"
    (notes / "a").mkdir(parents=True)
    (notes / "b").mkdir()
    (notes / ".git").mkdir()
    (notes / "a" / "README.md").write_text("Alpha notes.")
    (notes / "b" / "README.md").write_text("Beta notes.")
    (notes / "top.txt").write_text("Top.")
    (notes / ".git" / "HEAD.txt").write_text("hidden")
    (notes / "image.png").write_bytes(b"\x89PNG")
    loaded = load_documents([str(notes)], "acme", 1000)
    assert loaded.errors == []
    assert [d.doc_id for d in loaded.documents] == ["a/README", "b/README", "top"]
    assert load_documents([str(tmp_path / "empty")], "acme", 1000).errors == [
        f"{tmp_path / 'empty'}: no such file or folder"
    ]


def test_two_inputs_of_one_doc_id_are_refused_with_where_each_was_read(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "README.md").write_text("Alpha.")
    (tmp_path / "b" / "README.md").write_text("Beta.")
    (tmp_path / "other.txt").write_text("Other.")
    loaded = load_documents(
        [str(tmp_path / "a" / "README.md"), str(tmp_path / "b" / "README.md"), str(tmp_path / "other.txt")],
        "acme",
        1000,
    )
    assert [d.doc_id for d in loaded.documents] == ["other"]  # the rest is still published
    first, second = loaded.errors  # one error per document refused, each naming the other
    a, b = str(tmp_path / "a" / "README.md"), str(tmp_path / "b" / "README.md")
    assert first.startswith(a) and "doc id 'README'" in first and b in first
    assert second.startswith(b) and a in second


def test_documents_take_the_publish_version_unless_they_name_one(tmp_path):
    (tmp_path / "a.txt").write_text("Ada.")
    (tmp_path / "d.jsonl").write_text(
        '{"doc_id": "own", "text": "x", "version": 7}\n{"doc_id": "plain", "text": "y"}\n'
    )
    loaded = load_documents([str(tmp_path / "a.txt"), str(tmp_path / "d.jsonl")], "acme", 1000, version=1700000000123)
    assert [(d.doc_id, d.version) for d in loaded.documents] == [
        ("a", 1700000000123),
        ("own", 7),
        ("plain", 1700000000123),
    ]
    assert load_documents([str(tmp_path / "a.txt")], "acme", 1000).documents[0].version == 1  # the contract's default


def test_a_republished_file_is_a_newer_version():
    from ops.publish import publish_version

    first = publish_version()
    assert publish_version() >= first > 1_600_000_000_000  # milliseconds since the epoch


def test_an_empty_tenant_is_an_error_not_the_default(tmp_path, capsys):
    """Before: `--tenant ""` (an unset shell variable) published into the default tenant."""
    import pytest

    from ops import cli
    from topics import ContractError
    from workers.query.engine import QueryRequest

    (tmp_path / "a.txt").write_text("Ada.")
    assert cli.main(["publish", "--tenant", "", str(tmp_path / "a.txt")]) == 2
    assert "invalid tenant ''" in capsys.readouterr().err
    assert cli.main(["query", "--tenant", " ", "who?"]) == 2
    with pytest.raises(ContractError, match="invalid tenant ''"):
        QueryRequest.from_json({"query": "who?", "tenant": ""}, "default", 5)
    assert QueryRequest.from_json({"query": "who?"}, "default", 5).tenant == "default"


def offline_cli() -> Cli:
    """The CLI as a user runs it, Kafka and Redis nowhere: a command refused before it connects
    does not notice."""
    nowhere = f"127.0.0.1:{free_port()}"
    return Cli({**os.environ, "MEMSTREAM_KAFKA_BOOTSTRAP": nowhere, "MEMSTREAM_REDIS_URL": f"redis://{nowhere}/0"})


def test_stdin_that_starts_as_json_must_parse():
    """Before: JSON with a syntax error on stdin was published as the text of a document
    (`stdin-<hash>`), exit 0. Now stdin starting with { or [ is JSON (or JSONL) and is refused
    with the parser's line and column."""
    one_line = '{"doc_id": "s1", "text": "Eve sings."\n'
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(one_line))
    assert loaded.documents == []
    assert loaded.errors == [
        "<stdin>: starts with { or [ but is not valid JSON (Expecting ',' delimiter: line 1 column 38 (char 37))"
    ]
    listed = '[\n  {"doc_id": "a", "text": "x"},\n  {"doc_id": "b" "text": "y"}\n]\n'
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(listed))
    assert loaded.documents == [] and "line 3 column 18" in loaded.errors[0]
    pretty = '{\n  "doc_id": "a",\n  "text": "x",\n}\n'  # one object over lines, not JSONL
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(pretty))
    assert loaded.documents == [] and len(loaded.errors) == 1 and "line 4 column 1" in loaded.errors[0]
    lines = '{"doc_id": "a", "text": "x"}\n{"doc_id": "b" "text": "y"}\n'  # JSONL: its bad line named
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(lines))
    assert [d.doc_id for d in loaded.documents] == ["a"] and loaded.errors[0].startswith("<stdin>:2: invalid JSON")
    # JSONL whose first line is the broken one: still JSONL, the others published (a review)
    lines = '{"doc_id": "a" "text": "x"}\n{"doc_id": "b", "text": "y"}\n{"doc_id": "c", "text": "z"}\n'
    loaded = load_documents(["-"], "acme", 1000, stdin=io.StringIO(lines))
    assert [d.doc_id for d in loaded.documents] == ["b", "c"] and loaded.errors[0].startswith("<stdin>:1: invalid JSON")
    # refused before Kafka is reached
    done = offline_cli().run("publish", "-", "--tenant", "acme", input=one_line, check=False)
    assert done.returncode == 2 and "not valid JSON (Expecting ',' delimiter: line 1 column 38" in done.stderr


def test_an_input_without_a_document_is_refused(tmp_path):
    """Before: `[]` in a .json or on stdin and an empty .jsonl published nothing and exited 0 (an
    empty .txt or .json was refused); now each is refused, saying what was empty."""
    (tmp_path / "none.json").write_text("[]")
    (tmp_path / "none.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    names = ["none.json", "none.jsonl", "blank.jsonl"]
    loaded = load_documents([str(tmp_path / n) for n in names], "acme", 1000)
    assert loaded.documents == []
    assert loaded.errors == [
        f"{tmp_path / 'none.json'}: an empty list, no document to publish",
        f"{tmp_path / 'none.jsonl'}: no line holds a document, nothing to publish",
        f"{tmp_path / 'blank.jsonl'}: no line holds a document, nothing to publish",
    ]
    done = offline_cli().run("publish", "-", "--tenant", "acme", input="[]\n", check=False)
    assert done.returncode == 2 and "<stdin>: an empty list, no document to publish" in done.stderr
    done = offline_cli().run("publish", str(tmp_path / "none.jsonl"), "--tenant", "acme", check=False)
    assert done.returncode == 2 and "none.jsonl: no line holds a document" in done.stderr


def test_a_document_of_another_tenant_is_refused(tmp_path):
    """Before: a document's own "tenant" won over --tenant: `publish ot.json --tenant tb` put it
    in the tenant the file named, silently. Now it is refused, naming both tenants."""
    (tmp_path / "ot.json").write_text(
        json.dumps(
            [
                {"doc_id": "ot", "text": "Ivan paints.", "tenant": "othertenant"},
                {"doc_id": "same", "text": "Ivan sings.", "tenant": "tb"},
                {"doc_id": "plain", "text": "Ivan reads."},
            ]
        )
    )
    (tmp_path / "turns.jsonl").write_text(
        '{"session_id": "s", "turn": 0, "speaker": "Ana", "text": "Hi.", "tenant": "othertenant"}\n'
    )
    loaded = load_documents([str(tmp_path / "ot.json"), str(tmp_path / "turns.jsonl")], "tb", 1000)
    assert [(d.doc_id, d.tenant) for d in loaded.documents] == [("same", "tb"), ("plain", "tb")]
    assert loaded.errors == [
        f"{tmp_path / 'ot.json'}[0]: document 'ot' names tenant 'othertenant', but this publish writes tenant 'tb' "
        "(--tenant, default MEMSTREAM_TENANT): drop its 'tenant' or publish it with its own --tenant",
        f"{tmp_path / 'turns.jsonl'}:1: document 's:0' names tenant 'othertenant', but this publish writes tenant "
        "'tb' (--tenant, default MEMSTREAM_TENANT): drop its 'tenant' or publish it with its own --tenant",
    ]
    done = offline_cli().run("publish", str(tmp_path / "turns.jsonl"), "--tenant", "tb", check=False)
    assert done.returncode == 2 and "names tenant 'othertenant', but this publish writes tenant 'tb'" in done.stderr


def test_a_wait_timeout_must_be_a_number_of_seconds_above_0(tmp_path, monkeypatch, capsys):
    """Before: `publish/delete --wait --timeout -5` were taken (rebuild refused a timeout <= 0,
    and took nan). Now argparse refuses each, exit 2, before anything is published."""
    import pytest

    from ops import cli

    nowhere = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("MEMSTREAM_KAFKA_BOOTSTRAP", nowhere)  # (the old code published)
    monkeypatch.setenv("MEMSTREAM_REDIS_URL", f"redis://{nowhere}/0")
    (tmp_path / "a.txt").write_text("Ada.")
    for argv in (
        ["publish", str(tmp_path / "a.txt"), "--wait", "--timeout", "-5"],
        ["publish", str(tmp_path / "a.txt"), "--wait", "--timeout", "nan"],
        ["delete", "a", "--wait", "--timeout", "-5"],
        ["rebuild", "--wait", "--timeout", "nan"],
    ):
        with pytest.raises(SystemExit) as exit:
            cli.main(argv)
        assert exit.value.code == 2
        assert f"argument --timeout: must be a number of seconds above 0, not '{argv[-1]}'" in capsys.readouterr().err
