"""ops.processes.WorkerProcess, the one way benchmarks, the demo, chaos and the test fixtures
start and stop `memstream worker`: a worker that exits while awaited fails the wait at once,
with its log's tail, instead of after the health timeout."""

import os
import time

import pytest

from ops.processes import WorkerFailed, WorkerProcess


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
