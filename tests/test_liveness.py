"""workers.liveness.StallWatch: which held partitions are stalled (messages waiting, no progress
for the bound) and what the worker does about it (times given: nothing waits); and a real
worker on the stack that stalls and recovers."""

from __future__ import annotations

import time
import uuid

import pytest

from tests.conftest import write_docs
from workers.liveness import StallWatch


def test_a_partition_with_messages_waiting_and_no_progress_past_the_bound_is_stalled():
    watch = StallWatch(60)
    assert watch.check(0, {"p0": 10, "p1": None}, {"p0": 20, "p1": 5}) == []  # first seen: progress now
    assert watch.check(59, {"p0": 10, "p1": None}, {"p0": 20, "p1": 5}) == []
    assert watch.check(61, {"p0": 10, "p1": None}, {"p0": 20, "p1": 5}) == ["p0", "p1"]


def test_a_partition_with_nothing_to_fetch_or_that_moves_is_never_stalled():
    watch = StallWatch(60)
    watch.check(0, {"idle": 20, "moving": 10, "handling": 10}, {"idle": 20, "moving": 30, "handling": 30})
    watch.handled("handling", 50)  # a message handled (its commit not yet seen)
    found = watch.check(100, {"idle": 20, "moving": 15, "handling": 10}, {"idle": 20, "moving": 30, "handling": 30})
    assert found == []
    assert watch.check(161, {"idle": 20, "moving": 15, "handling": 10}, {"idle": 20, "moving": 30, "handling": 30}) == [
        "handling",
        "moving",
    ]
    # messages arriving at an idle partition: its clock runs from the last check that saw it caught up
    assert watch.check(170, {"idle": 20}, {"idle": 25}) == [] and watch.check(222, {"idle": 20}, {"idle": 25}) == [
        "idle"
    ]


def test_the_first_stall_rejoins_the_second_exits_and_each_verdict_gets_its_bound():
    watch = StallWatch(10)
    watch.check(0, {"p": 0}, {"p": 3})
    stalled = watch.check(11, {"p": 0}, {"p": 3})
    assert stalled == ["p"] and watch.stalled(stalled, 11) == "rejoin"
    assert watch.check(20, {"p": 0}, {"p": 3}) == []  # the rejoin gets the bound again
    stalled = watch.check(22, {"p": 0}, {"p": 3})
    assert stalled == ["p"] and watch.stalled(stalled, 22) == "exit"


def test_a_partition_revoked_is_forgotten_and_starts_again_when_assigned_back():
    watch = StallWatch(10)
    watch.check(0, {"p": 0}, {"p": 3})
    watch.check(5, {}, {})
    assert watch.check(12, {"p": 0}, {"p": 3}) == []  # seen anew at 12
    assert watch.check(23, {"p": 0}, {"p": 3}) == ["p"]


@pytest.mark.stack
@pytest.mark.timeout(420)
def test_a_worker_whose_fetching_stalls_rejoins_its_group_and_indexes_what_waits(make_workers, tmp_path):
    """A worker whose consumer holds its partitions but fetches nothing (the test hook pauses
    fetching once, as faust-streaming #523 leaves a consumer after a broker restart): with
    MEMSTREAM_STALL_SECONDS=4 it sees messages waiting without progress, leaves and rejoins
    its group, and indexes them — well within the 5.6 minutes the chaos run's consumer waited."""
    workers = make_workers(extractor="rules", tau=1, stall_seconds=4)
    workers.start("all", MEMSTREAM_TEST_PAUSE_FETCH="1")
    deadline = time.monotonic() + 120
    while "fetching paused" not in workers.logs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "fetching paused" in workers.logs(), workers.logs()[-3000:]
    started = time.monotonic()
    docs = {"orchard": "Tomas Reed owns the Dunmore Orchard.", "mill": "Greta Holm runs the Salt Mill."}
    workers.cli.run(
        "publish",
        *write_docs(tmp_path / "docs", docs),
        "--tenant",
        f"stalled-{uuid.uuid4().hex[:8]}",
        "--wait",
        "--timeout",
        "120",
    )
    took = time.monotonic() - started
    logs = workers.logs()
    assert "leaving and rejoining the group" in logs, logs[-3000:]
    assert all(worker.running() for worker in workers.procs)  # the rejoin was enough: no exit
    assert took < 90, took
