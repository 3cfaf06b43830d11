"""ops.stack.processes.WorkerProcess, the one way benchmarks, the demo, chaos and the test fixtures
start and stop `memstream worker`: a worker that exits while awaited fails the wait at once,
with its log's tail, instead of after the health timeout."""

import asyncio
import os
import socket
import sys
import time

import pytest

from ops.publish import _wait_indexed
from ops.stack import processes
from ops.stack.processes import WorkerFailed, WorkerProcess
from ops.stack.services import ephemeral_ports, free_port
from store.in_memory import InMemoryStore
from topics import Document
from workers.liveness import EXIT_STALLED
from workers.settings import Settings


def test_a_worker_that_exits_fails_the_wait_at_once_with_its_log(tmp_path):
    env = {**os.environ, "MEMSTREAM_HOME": str(tmp_path), "MEMSTREAM_LOG_LEVEL": "warning"}
    worker = WorkerProcess.spawn(tmp_path / "worker.log", env, role="chunker,bogus", own_session=True)
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as failed:
        worker.wait_healthy(timeout_s=60)
    assert time.monotonic() - started < 30  # not the health timeout: the exit was noticed
    assert "exited with 2" in str(failed.value) and "unknown role(s) ['bogus']" in str(failed.value)
    assert worker.stop(timeout_s=1) is True and worker.returncode == 2  # stopping an exited worker is a no-op


def test_settings_a_worker_would_refuse_raise_before_anything_is_spawned(tmp_path):
    env = {**os.environ, "MEMSTREAM_HTTP_PORT": "not-a-port"}
    with pytest.raises(ValueError):
        WorkerProcess.spawn(tmp_path / "worker.log", env)
    assert not (tmp_path / "worker.log").exists()


def test_services_stop_together_and_are_gone_when_stop_returns(tmp_path):
    """ops.stack.services.stop_together: one service that stops on SIGTERM, one that ignores it (a KRaft
    broker whose quorum is gone): both get SIGTERM at once, the second SIGKILL after the grace,
    and neither is alive when it returns (a start right after found a port still open)."""
    from ops.stack.services import Service, _alive, stop_together

    polite = Service("polite", 0, tmp_path / "polite", "polite-sleeper")
    stubborn = Service("stubborn", 0, tmp_path / "stubborn", "stubborn-sleeper")
    polite.spawn(["bash", "-c", "sleep 60; : polite-sleeper"])  # two commands: bash stays, the needle in its line
    stubborn.spawn(["bash", "-c", "trap '' TERM; while true; do sleep 0.1; done # stubborn-sleeper"])
    deadline = time.monotonic() + 10
    while not (polite.pid() and stubborn.pid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [polite.pid(), stubborn.pid()]
    assert all(pids), "the services did not start"
    assert stop_together([polite, stubborn], timeout_s=1)
    assert not any(_alive(pid, needle) for pid, needle in zip(pids, ("polite-sleeper", "stubborn-sleeper")))
    assert polite.pid() is None and stubborn.pid() is None
    assert not stop_together([polite, stubborn])  # none running: nothing to stop


def test_eval_of_stack_up_exports_the_addresses_to_what_starts_next(stack_env):
    """`eval "$(memstream stack up)"` (the README's first step) set shell variables a worker
    started next did not see (no `export`): only the defaults made it work."""
    import shlex
    import subprocess

    from tests.conftest import MEMSTREAM

    memstream = " ".join(shlex.quote(part) for part in MEMSTREAM)
    env = {k: v for k, v in stack_env.items() if k not in ("MEMSTREAM_KAFKA_BOOTSTRAP", "MEMSTREAM_REDIS_URL")}
    seen = subprocess.run(
        [
            "bash",
            "-c",
            f'eval "$({memstream} stack up 2>/dev/null)" && sh -c \'echo "$MEMSTREAM_KAFKA_BOOTSTRAP $MEMSTREAM_REDIS_URL"\'',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert seen == [stack_env["MEMSTREAM_KAFKA_BOOTSTRAP"], stack_env["MEMSTREAM_REDIS_URL"]]


def test_a_free_port_is_chosen_below_the_ports_outgoing_connections_take():
    """A port from the kernel's ephemeral range can be taken as the source port of any connection
    opened before the service binds it (CI: a broker's JVM, seconds later, "Address already in use")."""
    low, high = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    inside = [p for p in ports if low <= p <= high]
    assert inside == [], f"ports chosen inside the ephemeral range {low}-{high}: {inside[:10]}"
    assert len(set(ports)) > 150, "the ports chosen are not spread: two services starting together would collide"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # and free


_FAKE_WORKER = """
import sys, time
from pathlib import Path
runs = Path(sys.argv[1])
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
print("fake worker, run", len(runs.read_text().split()), flush=True)
if len(runs.read_text().split()) == 1:
    sys.exit(int(sys.argv[2]))  # the first run exits with the code it was given
time.sleep(600)
"""


@pytest.mark.parametrize("code", [75, 3])
def test_a_wait_on_workers_starts_a_stalled_one_again_and_fails_at_once_on_any_other_exit(tmp_path, monkeypatch, code):
    """A benchmark or the demo waits for its documents while supervising its workers: a worker
    that exits with EXIT_STALLED (75, its liveness check asks to be started again) is started
    again, its output appended to its log; any other exit fails the wait at once with the log's
    tail. Before, `bench recall` waited its full hour for a worker that had exited 75."""
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)
    monkeypatch.setattr(processes, "WORKER_COMMAND", (sys.executable, str(script), str(tmp_path / "runs"), str(code)))
    env = {**os.environ, "MEMSTREAM_HOME": str(tmp_path)}
    worker = WorkerProcess.spawn(tmp_path / "worker.log", env, own_session=True)
    worker.proc.wait(timeout=30)  # the first run has exited
    never_indexed = [Document(tenant="t", doc_id="d", text="Ada Berg lives in Norland.")]
    started = time.monotonic()
    try:
        if code == EXIT_STALLED:
            pending = asyncio.run(
                _wait_indexed(Settings.from_env(env), never_indexed, 2.0, True, InMemoryStore(), workers=[worker])
            )
            assert pending == ["d"] and worker.restarts == 1 and worker.running()
            deadline = time.monotonic() + 30
            while "run 2" not in worker.log_tail() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "run 1" in worker.log_tail() and "run 2" in worker.log_tail()  # one log, appended
        else:
            with pytest.raises(WorkerFailed) as failed:
                asyncio.run(
                    _wait_indexed(Settings.from_env(env), never_indexed, 60.0, True, InMemoryStore(), workers=[worker])
                )
            assert time.monotonic() - started < 30 and "exited with 3" in str(failed.value)
            assert "fake worker, run 1" in str(failed.value) and worker.restarts == 0
    finally:
        worker.stop(timeout_s=5)
    assert (tmp_path / "runs").read_text().split() == ["run"] * (2 if code == EXIT_STALLED else 1)
