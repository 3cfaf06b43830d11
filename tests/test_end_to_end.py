"""End to end on real Kafka + Redis, through the CLI as a user runs it: publish --wait, tail,
query; dead letters; tenant isolation.

Worker processes (each loads torch and the embedding model) are shared by the tests that can
run on the same settings, each test on its own tenant: one rules worker (τ = 1, the default
text limit) and one with a single partition and a 4 KiB text limit for dead letters;
the replay pipeline's exact events run in process (test_stages_replay)."""

import collections
import hashlib
import json
import random
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.conftest import Cli, running_workers, write_docs

CORPUS = {
    "lighthouse": "Captain Ilse Marrow built the Varn Lighthouse in 1871. The Varn Lighthouse stands on Kestrel Point.",
    "harbour": "Captain Ilse Marrow built the Varn Lighthouse. The harbour of Kestrel Point freezes every January.",
    "orchard": "The Dunmore Orchard grows Pellow apples. Tomas Reed owns the Dunmore Orchard.",
    "observatory": "The Halden Observatory tracks the comet Vesk. Dr Mira Okafor directs the Halden Observatory.",
}


def tenant_name(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def rules_workers(stack_env, tmp_path_factory):
    """One `memstream worker` (all roles, rules extractor, τ = 1, default limits) for every
    test of this module that needs nothing else."""
    with running_workers(stack_env, tmp_path_factory.mktemp("rules-workers"), extractor="rules", tau=1) as workers:
        yield workers


@pytest.fixture(scope="module")
def dlq_workers(stack_env, tmp_path_factory):
    """One worker with a single partition (a bad message and the good one behind it share it)
    and a 4 KiB text limit (a letter of 600 KB escaped would not fit the topic)."""
    with running_workers(
        stack_env, tmp_path_factory.mktemp("dlq-workers"), extractor="rules", partitions=1, max_text_bytes=4096
    ) as workers:
        yield workers


def triples(events, kind):
    return sorted((e["fact"]["head"], e["fact"]["relation"], e["fact"]["tail"]) for e in events if e["event"] == kind)


def test_rules_pipeline_publish_tail_query(rules_workers, tmp_path):
    workers = rules_workers
    cli, tenant = workers.cli, tenant_name("rules")
    cli.run("publish", *write_docs(tmp_path / "docs", CORPUS), "--tenant", tenant, "--wait", "--timeout", "120")
    events = cli.tail(tenant)
    activated = triples(events, "activated")
    assert ("Varn Lighthouse", "built by", "Captain Ilse Marrow") in activated  # a making verb, kept in the passive
    assert ("Tomas Reed", "own", "Dunmore Orchard") in activated
    assert triples(events, "merged") == [("Varn Lighthouse", "built by", "Captain Ilse Marrow")]
    assert len({e["event_id"] for e in events}) == len(events), "an event was published twice"
    assert all(e["tenant"] == tenant and e["graph_version"] > 0 for e in events)
    assert cli.query("Who owns the orchard with Pellow apples?", tenant)["passages"][0]["doc_id"] == "orchard"
    assert cli.query("When does the harbour freeze?", tenant)["passages"][0]["doc_id"] == "harbour"

    # publishing the same documents again changes nothing and emits nothing
    cli.run("publish", *write_docs(tmp_path / "docs", CORPUS), "--tenant", tenant, "--wait", "--timeout", "60")
    assert cli.tail(tenant) == events


def _dlq_letters(bootstrap: str, topic: str, expected: int, timeout: float = 60, key: str | None = None) -> list[dict]:
    """The dead letters on `topic` (those of messages keyed `key`, when given: workers shared by
    several tests may hold other tests' letters), once `expected` are there or at the timeout."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    letters, deadline = [], time.monotonic() + timeout
    while len(letters) < expected and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            letters += [
                letter
                for letter in map(json.loads, (r.value for r in records))
                if key is None or letter.get("key") == key
            ]
    consumer.close()
    return letters


def test_malformed_messages_go_to_the_dlq_and_the_partition_keeps_flowing(dlq_workers, tmp_path):
    workers = dlq_workers
    env, ns, tenant = workers.env, workers.env["MEMSTREAM_TOPIC_NAMESPACE"], tenant_name("dlq")
    good = {"v": 1, "tenant": tenant}
    bad = {
        "documents": [
            (b"\xff\xfe\x00", "not valid UTF-8 JSON"),
            (json.dumps({**good, "text": "no id"}).encode(), "missing required field 'doc_id'"),
            (json.dumps({**good, "v": 7, "doc_id": "x", "text": "t"}).encode(), "unsupported schema version v=7"),
            (json.dumps({**good, "doc_id": "x", "text": " "}).encode(), "field 'text' is empty"),
            (json.dumps({**good, "doc_id": "x", "text": "y" * 5000}).encode(), "over the limit of 4096 bytes"),
            # a valid body under another key: deletions and compaction go by the key
            (json.dumps({**good, "doc_id": "x", "text": "t"}).encode(), "is not the one its body names"),
            (
                None,
                "a message without a value deletes a document, and its key must be 'tenant/doc id'",
            ),  # a tombstone keyed 'same-key'
        ],
        "chunks": [
            (b"[]", "expected a JSON object, got array"),
            (json.dumps({**good, "chunk_id": 5}).encode(), "chunks.chunk_id: expected string"),
        ],
        "candidate-facts": [(json.dumps({**good, "passage_id": "p"}).encode(), "missing required field")],
        "conflict-sets": [(b"{}", "missing schema version")],
    }
    # poison that once escaped the envelope (the message was skipped, not dead-lettered), and a
    # value whose dead letter, escaped in full, would no longer fit the topic
    poison = [
        (
            json.dumps({**good, "doc_id": "x", "text": "TEXT"}).encode().replace(b"TEXT", b"\\ud800 lone"),
            "lone surrogate",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (
            json.dumps({**good, "doc_id": "x", "text": "t"})[:-1].encode() + b',"version":' + b"9" * 5000 + b"}",
            "5000 digits",
        ),
        (b"\xff" * 600_000, "not valid UTF-8"),
    ]
    for topic in bad:  # a document-shaped value fails other topics' contracts before its text is read
        bad[topic] = bad[topic] + [
            (value, reason if topic == "documents" or reason != "lone surrogate" else f"{topic}")
            for value, reason in poison
        ]
    producer = KafkaProducer(bootstrap_servers=env["MEMSTREAM_KAFKA_BOOTSTRAP"])
    for topic, messages in bad.items():
        for value, _ in messages:
            producer.send(f"{ns}.{topic}", key=b"same-key", value=value)
    producer.flush()
    # a valid document behind the bad ones on the same partition is still indexed
    workers.cli.run(
        "publish",
        *write_docs(tmp_path / "docs", {"orchard": CORPUS["orchard"]}),
        "--tenant",
        tenant,
        "--wait",
        "--timeout",
        "120",
    )
    assert workers.cli.query("Pellow apples", tenant)["passages"][0]["doc_id"] == "orchard"

    expected = sum(len(m) for m in bad.values())
    letters = _dlq_letters(env["MEMSTREAM_KAFKA_BOOTSTRAP"], f"{ns}.dlq", expected)
    assert len(letters) == expected
    for topic, messages in bad.items():
        errors = [letter["error"] for letter in letters if letter["topic"] == f"{ns}.{topic}"]
        assert len(errors) == len(messages)
        for _, reason in messages:
            assert any(reason in e for e in errors), (reason, errors)
    assert all(letter["key"] == "same-key" and letter["offset"] is not None for letter in letters)
    # the payload is kept whole when the letter fits the topic; 600 KB escaped to ~3 MB would not
    # (the limit here is 4 × 4096 + 1 MiB): it is cut, with the original's size and sha256
    values = [value or b"" for messages in bad.values() for value, _ in messages]
    assert sorted(letter["payload_bytes"] for letter in letters) == sorted(len(v) for v in values)
    assert {letter["payload_sha256"] for letter in letters} == {hashlib.sha256(v).hexdigest() for v in values}
    assert all(letter["payload_truncated"] == (letter["payload_bytes"] == 600_000) for letter in letters)
    assert any("y" * 5000 in letter["payload"] for letter in letters)


def test_two_tenants_with_the_same_text_see_only_their_own(rules_workers, tmp_path):
    cli = rules_workers.cli
    alpha, beta = tenant_name("alpha"), tenant_name("beta")
    shared = {"orchard": CORPUS["orchard"]}
    cli.run(
        "publish",
        *write_docs(tmp_path / "a", {**shared, "observatory": CORPUS["observatory"]}),
        "--tenant",
        alpha,
        "--wait",
        "--timeout",
        "120",
    )
    cli.run("publish", *write_docs(tmp_path / "b", shared), "--tenant", beta, "--wait", "--timeout", "120")

    assert cli.query("comet Vesk observatory", alpha)["passages"][0]["doc_id"] == "observatory"
    beta_answer = cli.query("comet Vesk observatory", beta)
    assert [p["doc_id"] for p in beta_answer["passages"]] == ["orchard"]
    assert all("Vesk" not in f["tail"] for f in beta_answer["facts"])
    assert all(e["name"] != "Vesk" for e in beta_answer["entities"])

    beta_events = cli.tail(beta)
    assert beta_events and all(e["tenant"] == beta for e in beta_events)
    assert {e["fact_id"] for e in beta_events} < {e["fact_id"] for e in cli.tail(alpha)}
    assert cli.query("anything", tenant_name("nobody"))["passages"] == []


def test_publish_rejects_invalid_documents_and_indexes_the_rest(dlq_workers, tmp_path):
    """The limit is the publisher's own (1000 bytes here); the worker's is larger."""
    cli = Cli({**dlq_workers.env, "MEMSTREAM_MAX_TEXT_BYTES": "1000"})
    tenant = tenant_name("bad-input")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "empty.txt").write_text("")
    (docs / "big.txt").write_text("word " * 400)
    (docs / "good.txt").write_text(CORPUS["orchard"])
    proc = cli.run(
        "publish",
        *(str(docs / n) for n in ("empty.txt", "big.txt", "good.txt")),
        "--tenant",
        tenant,
        "--wait",
        "--timeout",
        "120",
        check=False,
    )
    assert proc.returncode == 2
    assert "rejected" in proc.stderr and "empty.txt: field 'text' is empty" in proc.stderr
    assert "big.txt: field 'text' is 2000 bytes, over the limit of 1000 bytes" in proc.stderr
    assert cli.query("Pellow apples", tenant)["passages"][0]["doc_id"] == "good"
    bad_tenant = cli.run("publish", str(docs / "good.txt"), "--tenant", "no/slashes", check=False)
    assert bad_tenant.returncode == 2 and "invalid tenant 'no/slashes'" in bad_tenant.stderr


def test_query_endpoint_refuses_bad_requests(rules_workers):
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{rules_workers.env['MEMSTREAM_HTTP_PORT']}"

    def post(body: bytes):
        req = urllib.request.Request(url + "/v1/query", data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = post(b"{nope")
    assert status == 400 and body["error"].startswith("request body is not valid JSON")
    assert post(b'{"query": ""}')[0] == 400
    assert "over the limit" in post(json.dumps({"query": "x" * 5000}).encode())[1]["error"]
    assert "invalid tenant" in post(json.dumps({"query": "x", "tenant": "a b"}).encode())[1]["error"]
    assert "top_k" in post(json.dumps({"query": "x", "top_k": 0}).encode())[1]["error"]
    status, body = post(json.dumps({"query": "') OR 1=1 -- @tenant:{*} ~!", "tenant": "fresh"}).encode())
    assert status == 200 and body["passages"] == []
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        assert b"memstream_query_seconds" in r.read()


def test_oversize_document_is_dead_lettered_whole(rules_workers, tmp_path):
    workers = rules_workers  # default limit: 1 MiB of text
    env, ns, tenant = workers.env, workers.env["MEMSTREAM_TOPIC_NAMESPACE"], tenant_name("big")
    text = "word " * 300_000  # 1.5 MB
    producer = KafkaProducer(bootstrap_servers=env["MEMSTREAM_KAFKA_BOOTSTRAP"], max_request_size=8 << 20)
    producer.send(
        f"{ns}.documents",
        key=b"big",
        value=json.dumps({"v": 1, "tenant": tenant, "doc_id": "big", "text": text}).encode(),
    ).get(timeout=30)
    producer.close()
    (letter,) = _dlq_letters(env["MEMSTREAM_KAFKA_BOOTSTRAP"], f"{ns}.dlq", 1, key="big")
    assert "field 'text' is 1500000 bytes, over the limit of 1048576 bytes" in letter["error"]
    assert json.loads(letter["payload"])["text"] == text


def test_republishing_an_earlier_text_makes_it_current_again(rules_workers, tmp_path):
    workers = rules_workers
    tenant = tenant_name("revert")
    first, second = CORPUS["orchard"], CORPUS["observatory"]
    for text in (first, second, first):
        path = tmp_path / "note.txt"
        path.write_text(text)
        workers.cli.run("publish", str(path), "--tenant", tenant, "--wait", "--timeout", "60")
    # each publish is a new version (the CLI's): the second text is retired, the first current again
    for question in ("Who directs the Halden Observatory?", "Who owns the orchard with Pellow apples?"):
        assert [p["text"] for p in workers.cli.query(question, tenant)["passages"]] == [first]
    events = workers.cli.tail(tenant)
    retracted = {e["fact"]["head"] for e in events if e["event"] == "retracted"}
    assert "Halden Observatory" in retracted, [(e["event"], e["fact"]["head"]) for e in events]
    facts = json.loads(workers.cli.run("export", "--tenant", tenant).stdout)["facts"]
    assert {f["status"] for f in facts if "Halden" in f["head"] + f["tail"]} == {"retracted"}
    assert all(f["status"] != "retracted" for f in facts if "Dunmore" in f["head"] + f["tail"])


# ---- documents change, through the CLI and worker processes ---------------------------------------
def _held(export: dict) -> dict:
    """What a fresh tenant of the current texts must equal (tests/test_versions.current_memory,
    from `memstream export`): facts in memory with status and passages, schemas with a frequency."""
    facts = {f["id"]: (f["status"], tuple(f["passages"])) for f in export["facts"] if f["status"] != "retracted"}
    schemas = {s["id"]: (s["frequency"], s["status"]) for s in export["schemas"] if int(s["frequency"]) > 0}
    return {"facts": facts, "schemas": schemas}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_memory_is_a_function_of_the_current_documents_through_kafka(rules_workers, tmp_path, seed):
    """Three seeded sequences of publish / edit / whitespace edit / revert / delete, sent as a user
    would (`memstream publish FILE`, `memstream delete`) to a worker over real Kafka and Redis:
    the memory equals that of a fresh tenant given only the current texts."""
    from tests.test_versions import DOCS, SENTENCES

    workers, rng = rules_workers, random.Random(seed)
    tenant, fresh_tenant = tenant_name(f"versions{seed}"), tenant_name(f"fresh{seed}")
    history: dict[str, list[str]] = {}
    current: dict[str, str] = {}
    for _ in range(6):
        doc, kind = rng.choice(DOCS[:3]), rng.choice(["publish", "publish", "whitespace", "revert", "delete"])
        path = tmp_path / f"{doc}.txt"
        if kind == "delete" and doc in current:
            workers.cli.run("delete", doc, "--tenant", tenant, "--wait", "--timeout", "120")
            del current[doc]
            continue
        if kind == "whitespace" and doc in current:
            text = current[doc] + "\n"
        elif kind == "revert" and len(history.get(doc, [])) >= 2:
            text = history[doc][-2]
        else:
            text = " ".join(rng.sample(SENTENCES, 2))
        path.write_text(text)
        workers.cli.run("publish", str(path), "--tenant", tenant, "--wait", "--timeout", "120")
        history.setdefault(doc, []).append(text)
        current[doc] = text
    for doc, text in current.items():
        (tmp_path / "fresh").mkdir(exist_ok=True)
        (tmp_path / "fresh" / f"{doc}.txt").write_text(text)
    if current:
        workers.cli.run("publish", str(tmp_path / "fresh"), "--tenant", fresh_tenant, "--wait", "--timeout", "120")
    edited = json.loads(workers.cli.run("export", "--tenant", tenant).stdout)
    fresh = json.loads(workers.cli.run("export", "--tenant", fresh_tenant).stdout)
    assert _held(edited) == _held(fresh), (seed, current)


def test_memstream_retract_takes_a_fact_out_through_the_resolver(rules_workers, tmp_path):
    workers, tenant = rules_workers, tenant_name("retract")
    workers.cli.run(
        "publish",
        *write_docs(tmp_path / "docs", {"orchard": CORPUS["orchard"]}),
        "--tenant",
        tenant,
        "--wait",
        "--timeout",
        "120",
    )
    [fact] = [
        f
        for f in json.loads(workers.cli.run("export", "--tenant", tenant).stdout)["facts"]
        if f["head"] == "Tomas Reed"
    ]
    assert fact["status"] == "active"
    said = workers.cli.run("retract", fact["id"], "--tenant", tenant, "--reason", "sold the orchard").stdout
    assert f"retraction of {fact['id']} queued (retract:{fact['id']}:" in said
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        [now] = [
            f
            for f in json.loads(workers.cli.run("export", "--tenant", tenant).stdout)["facts"]
            if f["id"] == fact["id"]
        ]
        if now["status"] == "retracted":
            break
        time.sleep(0.5)
    assert (now["status"], now["reason"]) == ("retracted", "retracted on request: sold the orchard")
    unknown = workers.cli.run("retract", "f-none", "--tenant", tenant, check=False)
    assert unknown.returncode == 2 and f"no fact 'f-none' in tenant '{tenant}'" in unknown.stderr


def test_memstream_delete_purge_erases_a_document_through_kafka(rules_workers, tmp_path):
    """`memstream delete --purge --wait`: the erasure and its tombstone go through Kafka to the
    chunker; when it returns, none of the document's words is left under the tenant (export:
    passages, facts, entities) and a `purged` event names what went, without its text."""
    workers, tenant = rules_workers, tenant_name("erase")
    word = f"Zorvex{uuid.uuid4().hex[:8]}"
    docs = {
        "quill": f"{word} Quill lives in Brannoc. {word} Quill works for Orsk Mills.",
        "nora": "Nora Velt works for Orsk Mills.",
    }
    workers.cli.run("publish", *write_docs(tmp_path / "docs", docs), "--tenant", tenant, "--wait", "--timeout", "120")
    assert word in workers.cli.run("export", "--tenant", tenant).stdout
    said = workers.cli.run("delete", "quill", "--purge", "--wait", "--timeout", "120", "--tenant", tenant)
    assert "1 erasures published" in said.stderr + said.stdout
    export = workers.cli.run("export", "--tenant", tenant).stdout
    assert word.lower() not in export.lower()
    assert {(f["head"], f["status"]) for f in json.loads(export)["facts"]} == {("Nora Velt", "active")}
    events = [
        json.loads(line)
        for line in workers.cli.run(
            "tail", "--tenant", tenant, "--from-beginning", "--idle-timeout", "5"
        ).stdout.splitlines()
    ]
    [purged] = [e for e in events if e["event"] == "purged"]
    assert (
        purged["doc_id"] == "quill"
        and len(purged["passage_ids"]) == 1
        and word.lower() not in json.dumps(purged).lower()
    )


def test_memstream_status_shows_lag_falling_to_zero_and_the_tenants_memory(rules_workers, tmp_path):
    """`memstream status --tenant T --json` after an ingestion: every stage's lag comes down to 0
    (offsets commit a few seconds after the work), the tenant's documents are all indexed and its
    facts by status are those of its export; without --json, one line per stage."""
    workers, tenant = rules_workers, tenant_name("status")
    workers.cli.run(
        "publish",
        *write_docs(tmp_path / "docs", {"orchard": CORPUS["orchard"]}),
        "--tenant",
        tenant,
        "--wait",
        "--timeout",
        "120",
    )
    deadline = time.monotonic() + 60
    while True:
        report = json.loads(workers.cli.run("status", "--tenant", tenant, "--json", "--sample", "0.5").stdout)
        lags = {role: stage["lag"] for role, stage in report["kafka"]["stages"].items()}
        if not any(lags.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert lags == {"chunker": 0, "extractor": 0, "detector": 0, "resolver": 0}
    assert all(stage["partitions"] for stage in report["kafka"]["stages"].values())
    facts = json.loads(workers.cli.run("export", "--tenant", tenant).stdout)["facts"]
    held = report["tenant"]
    assert (held["documents"], held["documents_indexed"], held["documents_deleted"]) == (1, 1, 0)
    assert held["facts"] == dict(sorted(collections.Counter(f["status"] for f in facts).items()))
    text = workers.cli.run("status", "--tenant", tenant, "--sample", "0").stdout
    assert [line.split()[0] for line in text.splitlines()[2:6]] == ["chunker", "extractor", "detector", "resolver"]
    assert f"tenant {tenant}: 1 of 1 documents indexed" in text and "warning" not in text
