"""`memstream worker` subprocesses, started and stopped one way for the benchmarks, the demo,
the chaos driver and the test fixtures: output in a log file, waited for until /healthz answers
— failing at once, with the log's tail, when the worker exits instead — and stopped with
SIGTERM, then SIGKILL when it outlasts the timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterable

from workers.liveness import EXIT_STALLED
from workers.settings import Settings

WORKER_COMMAND = (sys.executable, "-m", "ops.cli", "worker")
HEALTHY_TIMEOUT_S = 180  # a worker imports torch and loads the embedding model before it serves
STOP_TIMEOUT_S = 30  # a graceful stop that takes longer is ended with SIGKILL
LOG_TAIL_CHARS = 3000


class WorkerFailed(RuntimeError):
    """A worker exited, or did not answer /healthz in time, while it was awaited."""


class WorkerProcess:
    """One `memstream worker [--role R]` process and its log file."""

    def __init__(
        self, proc: subprocess.Popen, log: Path, health_url: str, own_session: bool, argv=(), env=None, cwd=None
    ):
        self.proc = proc
        self.log = log
        self.health_url = health_url
        self.own_session = own_session
        self._terminated = False  # SIGTERM sent: a second one would ask faust for a harder stop
        self._launch = (list(argv), env, cwd)  # how it was started, for `supervise`
        self.restarts = 0

    @classmethod
    def spawn(
        cls,
        log: Path,
        env: dict | None = None,
        role: str | None = None,
        cwd: Path | None = None,
        own_session: bool = False,
    ) -> "WorkerProcess":
        """Start a worker with `env` (None: this process's environment), all roles unless
        `role` is given, its stdout and stderr written to `log` (truncated).

        own_session: in a session and process group of its own, which a SIGKILL reaches whole
        (the tests and the chaos driver, which signal workers themselves). Otherwise it stays in
        the caller's process group, so a Ctrl-C or a `timeout` of a benchmark or the demo
        reaches the worker too, even where the caller dies before it could stop it."""
        settings = Settings.from_env(
            os.environ if env is None else env
        )  # where it will listen (ValueError: it would not start)
        argv = [*WORKER_COMMAND, *(["--role", role] if role else [])]
        proc = _popen(argv, env, cwd, log, own_session, "wb")
        return cls(proc, log, f"http://{settings.http_host}:{settings.http_port}/healthz", own_session, argv, env, cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        """Until /healthz answers; raises WorkerFailed with the log's tail if the worker exits
        first or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise WorkerFailed(f"worker exited with {self.proc.returncode}; see {self.log}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise WorkerFailed(f"worker not healthy after {timeout_s:g}s; see {self.log}:\n{self.log_tail()}")

    def supervise(self) -> None:
        """What a supervisor does, for the benchmarks and the demo that wait on their workers: a
        worker that exited with EXIT_STALLED (its liveness check found it stalled twice, and it
        asks to be started again) is started again, its output appended to the same log; any
        other exit raises WorkerFailed with the log's tail, so a wait ends at once instead of at
        its timeout. A stop asked for (`terminate`) is no failure."""
        if self._terminated or self.proc.poll() is None:
            return
        if self.proc.returncode != EXIT_STALLED:
            raise WorkerFailed(f"worker exited with {self.proc.returncode}; see {self.log}:\n{self.log_tail()}")
        argv, env, cwd = self._launch
        self.proc = _popen(argv, env, cwd, self.log, self.own_session, "ab")
        self.restarts += 1

    def terminate(self) -> None:
        """SIGTERM to the worker itself, as compose, systemd and Kubernetes send it; once."""
        if not self._terminated and self.proc.poll() is None:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """SIGTERM, then SIGKILL if it is still running after `timeout_s`.
        True if it exited by itself (or had already), False if it had to be killed."""
        self.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        """SIGKILL at once (no clean shutdown) — to its process group when it has its own —
        and reap the worker."""
        if self.proc.returncode is None:  # not reaped yet, so its pid (and group id) is still its own
            with contextlib.suppress(ProcessLookupError):
                if self.own_session:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> "WorkerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _popen(argv, env, cwd, log: Path, own_session: bool, mode: str) -> subprocess.Popen:
    with open(log, mode) as out:
        return subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=own_session
        )


def stop_all(workers: Iterable[WorkerProcess], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to every worker first, so they shut down side by side, then each is waited for
    (and killed past `timeout_s`)."""
    workers = list(workers)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.stop(timeout_s)


def worker_env(settings: Settings, namespace: str, home: Path, **overrides: str) -> dict:
    """The environment of a `memstream worker` subprocess a benchmark starts on this stack:
    topics, consumer group and home of its own; its query API without keys on loopback, as the
    benchmark's own requests send none (keys in this environment are not passed on)."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("MEMSTREAM_API_KEYS", "MEMSTREAM_API_KEYS_FILE")}
    return {
        **inherited,
        "MEMSTREAM_HTTP_HOST": "127.0.0.1",
        "MEMSTREAM_TOPIC_NAMESPACE": namespace,
        "MEMSTREAM_APP_ID": namespace,
        "MEMSTREAM_HOME": str(home),
        "MEMSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "MEMSTREAM_REDIS_URL": settings.redis_url,
        "MEMSTREAM_LOG_LEVEL": "warning",
        **overrides,
    }
