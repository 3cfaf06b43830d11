"""Memory = f(log) (workers.recovery): a Redis that lost writes comes back to the memory of every
document the log holds, with no human step — restored from a backup taken before more documents
were indexed, or emptied (a lost volume) — while the workers keep running. Each test runs a Redis
of its own (the shared test Redis is never rolled back) beside the shared Kafka, and checks
through the CLI: `export` equals the export before the loss (statuses, supports and edges; the
facts' system times aside — tests/chaos.py comparable_export), and no fact was activated under
two event ids."""

from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest

from ops.stack.services import Stack, free_port
from tests.chaos import comparable_export, export_differences
from tests.conftest import write_docs
from tests.test_crash import corpus
from tests.test_end_to_end import tenant_name
from workers.settings import Settings

pytestmark = pytest.mark.stack

RECOVERY_DEADLINE_S = 180


class OwnRedis:
    """A Redis of the test's own, stopped and started on its data (SIGTERM: the AOF flushed)."""

    def __init__(self, home: Path):
        self.stack = Stack(Settings(home=home, redis_port=free_port()))
        self.data = self.stack.redis.dir / "data"
        self.url = f"redis://127.0.0.1:{self.stack.redis.port}/0"
        self.stack.service_up("redis", lambda m: None)

    def backup(self, to: Path) -> None:
        """A consistent copy of its files, as a backup or a lagging replica holds them."""
        self.stack.service_down("redis")
        shutil.copytree(self.data, to)
        self.stack.service_up("redis", lambda m: None)

    def restore(self, backup: Path | None) -> None:
        """Restarted on the backup's files, or on none (a lost volume)."""
        self.stack.service_down("redis")
        shutil.rmtree(self.data)
        if backup is None:
            self.data.mkdir()
        else:
            shutil.copytree(backup, self.data)
        self.stack.service_up("redis", lambda m: None)

    def stop(self) -> None:
        self.stack.service_down("redis")


@pytest.fixture
def own_redis(tmp_path):
    redis = OwnRedis(tmp_path / "own-redis")
    yield redis
    redis.stop()


def _export(cli, tenant: str) -> dict:
    return comparable_export(json.loads(cli.run("export", "--tenant", tenant).stdout))


def _until_equal(
    cli, tenant: str, expected: dict, within_s: float = RECOVERY_DEADLINE_S, seen=lambda export: export
) -> dict:
    """The tenant's export (as `seen` sees it) once it equals `expected`, or at the deadline."""
    deadline = time.monotonic() + within_s
    while True:
        got = seen(_export(cli, tenant))
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(2)


def in_memory(export: dict) -> dict:
    """What a fresh build of the current documents must equal (tests/test_versions.py's
    current_memory): the facts in memory with their status and supporting passages, and the
    graph's fact and passage edges — not the history a retracted fact keeps (when it was
    activated) nor the type edges (an entity keeps the types it joined)."""
    return {
        "facts": {f["id"]: (f["status"], f["passages"]) for f in export["facts"] if f["status"] != "retracted"},
        "edges": sorted(
            (e["source"], e["target"], e["kind"], e["weight"])
            for e in export["edges"]
            if e["kind"] in ("fact", "passage")
        ),
    }


def _one_event_id_a_fact(cli, tenant: str) -> None:
    activated = defaultdict(set)
    for event in cli.tail(tenant):
        if event["event"] == "activated":
            activated[event["fact_id"]].add(event["event_id"])
    assert activated, "no fact was activated"
    assert all(len(ids) == 1 for ids in activated.values()), "a fact was activated under two event ids"


@pytest.mark.parametrize("loss", ["restored from a backup", "emptied"])
def test_memory_comes_back_from_the_log_after_redis_lost_writes(make_workers, own_redis, tmp_path, loss):
    workers = make_workers(extractor="rules", redis_url=own_redis.url, tau=1, conflicts="off")
    workers.start(role="all")
    cli, tenant = workers.cli, tenant_name("rebuild")
    docs = corpus(10)
    first, second = dict(list(docs.items())[:5]), dict(list(docs.items())[5:])
    cli.run("publish", *write_docs(tmp_path / "a", first), "--tenant", tenant, "--wait", "--timeout", "180")
    backup = tmp_path / "backup"
    own_redis.backup(backup)
    cli.run("publish", *write_docs(tmp_path / "b", second), "--tenant", tenant, "--wait", "--timeout", "180")
    before = _export(cli, tenant)
    assert before["facts"], "nothing was indexed"

    own_redis.restore(backup if loss == "restored from a backup" else None)

    after = _until_equal(cli, tenant, before)
    assert after == before, export_differences(before, after)
    _one_event_id_a_fact(cli, tenant)
    assert "reading it again" in workers.logs()


def test_rebuild_makes_a_damaged_tenant_a_fresh_build_of_its_current_documents(make_workers, stack_env, tmp_path):
    """`memstream rebuild --tenant T --wait` after a third of the tenant's keys were lost: its
    memory equals a fresh build of its current documents — an edited document at its last
    version, a deleted one gone — in another tenant."""
    import redis

    workers = make_workers(extractor="rules", tau=1, conflicts="off")
    workers.start(role="all")
    cli, tenant, fresh = workers.cli, tenant_name("rebuilt"), tenant_name("fresh")
    docs = corpus(6)
    kept = dict(list(docs.items())[:5])
    edited = {"doc-edit": "Hester Vane founded Vane Hester Works. Vane Hester Works builds boats in Ostra."}
    cli.run("publish", *write_docs(tmp_path / "a", kept), "--tenant", tenant, "--wait", "--timeout", "180")
    first = {"doc-edit": "Ivo Quill founded Quill Ivo Works. Quill Ivo Works builds boats in Lake Merrow."}
    cli.run("publish", *write_docs(tmp_path / "v1", first), "--tenant", tenant, "--wait", "--timeout", "180")
    cli.run("publish", *write_docs(tmp_path / "v2", edited), "--tenant", tenant, "--wait", "--timeout", "180")
    gone = {"doc-gone": list(docs.values())[5]}
    cli.run("publish", *write_docs(tmp_path / "g", gone), "--tenant", tenant, "--wait", "--timeout", "180")
    cli.run("delete", "doc-gone", "--tenant", tenant, "--wait", "--timeout", "180")

    client = redis.Redis.from_url(stack_env["MEMSTREAM_REDIS_URL"])
    keys = sorted(client.scan_iter(match=f"*{{{tenant}}}*", count=1000))
    assert keys, "the tenant holds nothing"
    client.delete(*keys[::3])
    client.close()

    done = cli.run("rebuild", "--tenant", tenant, "--wait", "--timeout", "180")
    assert "6 current documents to index" in done.stderr, done.stderr
    cli.run(
        "publish", *write_docs(tmp_path / "fresh", {**kept, **edited}), "--tenant", fresh, "--wait", "--timeout", "180"
    )
    rebuilt, expected = _export(cli, tenant), _export(cli, fresh)
    assert rebuilt["facts"], "nothing was rebuilt"
    assert rebuilt == expected, export_differences(expected, rebuilt)


# Replayed side by side, the stages' topics once rebuilt a document's versions out of their first
# order — a superseded version's chunk or candidate replayed before the chunker recorded its
# successor again left facts retracted that the undisturbed run held active, or 'new' facts never
# decided. Each message now names the decision that sent it (its `cause`), and one whose cause
# memory does not hold is passed over until the stage upstream sends it again (store.records.
# CauseNotInMemory); tests/test_versions.py holds the same property over random histories.
@pytest.mark.parametrize("loss", ["restored from a backup", "emptied"])
def test_a_loss_after_an_edit_a_revert_and_a_deletion_ends_as_a_fresh_build(make_workers, own_redis, tmp_path, loss):
    """After the backup a document is edited and reverted, another deleted; Redis then loses
    those writes (or all): once the workers caught up, memory (`in_memory`) is a fresh build's of
    the current documents, as it was before the loss."""
    workers = make_workers(extractor="rules", redis_url=own_redis.url, tau=1, conflicts="off")
    workers.start(role="all")
    cli, tenant, fresh = workers.cli, tenant_name("edits"), tenant_name("edits-fresh")
    docs = corpus(4)
    first = {"doc-x": "Ivo Quill founded Quill Ivo Works. Quill Ivo Works builds boats in Lake Merrow."}
    second = {"doc-x": "Hester Vane founded Vane Hester Works. Vane Hester Works builds boats in Ostra."}
    cli.run("publish", *write_docs(tmp_path / "a", {**docs, **first}), "--tenant", tenant, "--wait", "--timeout", "180")
    backup = tmp_path / "backup"
    own_redis.backup(backup)
    cli.run("publish", *write_docs(tmp_path / "v2", second), "--tenant", tenant, "--wait", "--timeout", "180")
    gone = list(docs)[-1]
    cli.run("delete", gone, "--tenant", tenant, "--wait", "--timeout", "180")
    cli.run("publish", *write_docs(tmp_path / "v3", first), "--tenant", tenant, "--wait", "--timeout", "180")
    undisturbed = in_memory(_export(cli, tenant))
    current = {**{k: v for k, v in docs.items() if k != gone}, **first}
    cli.run("publish", *write_docs(tmp_path / "fresh", current), "--tenant", fresh, "--wait", "--timeout", "180")
    built = in_memory(_export(cli, fresh))
    assert undisturbed == built, "the undisturbed memory is not a fresh build of the current documents"

    own_redis.restore(backup if loss == "restored from a backup" else None)

    after = _until_equal(cli, tenant, built, within_s=60, seen=in_memory)
    assert after == built


def one_partition(end: int, at: int) -> type:
    """A test double of kafka.KafkaConsumer over a topic of one partition ending at `end`, whose
    position stays at `at` and whose poll() answers nothing (a partition that never moves, or
    an empty one)."""

    class OnePartition:
        def __init__(self, **config):
            pass

        def partitions_for_topic(self, topic):
            return {0}

        def assign(self, partitions):
            pass

        def seek_to_beginning(self, *partitions):
            pass

        def end_offsets(self, partitions):
            return {tp: end for tp in partitions}

        def position(self, tp):
            return at

        def poll(self, timeout_ms=0, max_records=None):
            time.sleep(0.05)
            return {}

        def close(self):
            pass

    return OnePartition


def test_rebuild_gives_up_on_a_documents_log_that_stops_moving(monkeypatch):
    """A broker or a partition's leader gone while `memstream rebuild` reads the documents log:
    poll() answers nothing, and the read asked again forever with the terminal held (found in a
    review). Now a read with no partition moving for READ_STALL_S raises, naming the partitions
    and Kafka, before anything is erased. The consumer is a test double (a partition at offset 3
    of 10 that never moves); 0.5 s stands for READ_STALL_S."""
    import threading

    import kafka

    from ops import rebuild

    monkeypatch.setattr(kafka, "KafkaConsumer", one_partition(end=10, at=3))
    monkeypatch.setattr(rebuild, "READ_STALL_S", 0.5, raising=False)  # (the old code had none: it hung)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            rebuild.current_documents(Settings())
        except BaseException as exc:
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the read still waiting on a log that does not move after 10 s"
    assert len(raised) == 1 and isinstance(raised[0], RuntimeError), raised
    assert "made no progress" in str(raised[0]) and "partitions 0 at 3 of 10" in str(raised[0])
    assert "Nothing was erased" in str(raised[0])


def test_rebuild_of_a_tenant_the_log_holds_nothing_of_erases_nothing(monkeypatch):
    """`memstream rebuild --tenant nosuch` erased what Redis held of the tenant and published
    nothing (an audit): a misspelt tenant, or a Kafka that is not this memory's own, left the
    tenant empty. A tenant the documents log holds no current document of is refused now, before
    Redis is touched. The consumer is a test double (an empty topic); Redis's URL answers nothing."""
    import kafka

    from ops import rebuild
    from topics import BadInput
    from workers.settings import Settings

    monkeypatch.setattr(kafka, "KafkaConsumer", one_partition(end=0, at=0))
    with pytest.raises(BadInput, match="holds no current document of tenant 'nosuch'.*left as it is"):
        rebuild.rebuild(Settings(redis_url="redis://127.0.0.1:1/0"), "nosuch", None, quiet=True)
