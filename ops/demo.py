"""`memstream demo` (`make demo`): local stack up, workers, the sample corpus published and
indexed, a few indexed-fact events and the answers to sample queries."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

from ops.answer_format import format_answer, query_endpoint, read_answer
from ops.publish import load_documents, publish, wait_indexed
from ops.stack.kafka_admin import ensure_topics
from ops.stack.processes import WorkerProcess
from ops.stack.services import Stack, stderr
from workers.settings import Settings

SAMPLE_CORPUS = Path(__file__).parent / "sample_corpus"
SAMPLE_QUERIES = (
    "Who designed the bridge over the Ostra River?",
    "Which comet does the observatory track, and who discovered it?",
    "How does rye from the mill reach Port Selka?",
)
TENANT = "demo"


class LagReport:
    """While its block runs, prints the consumer lag of each stage (as `memstream status` reads
    it) whenever it changes, then until it reads 0 everywhere (offsets are committed a few
    seconds after the work: faust commits on an interval), at most `settle_s`."""

    def __init__(self, settings: Settings, every_s: float = 1.0, settle_s: float = 60.0):
        self.settings, self.every_s, self.settle_s = settings, every_s, settle_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.last = ""

    def __enter__(self) -> "LagReport":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        deadline = time.monotonic() + self.settle_s
        while self._report() != 0 and time.monotonic() < deadline:
            time.sleep(self.every_s)

    def _report(self) -> int | None:
        """Prints the lag when it changed; returns it in all (None: unreadable)."""
        from ops.status import kafka_status

        try:
            stages = kafka_status(self.settings, sample_s=0.2)["stages"]
        except Exception as exc:  # Kafka busy: the next reading says it
            stderr(f"   status: unreadable now ({type(exc).__name__})")
            return None
        line = "   status: lag " + ", ".join(f"{role} {stage['lag']}" for role, stage in stages.items())
        if line != self.last:
            stderr(line)
            self.last = line
        return sum(stage["lag"] for stage in stages.values())

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self._report()


def explorer_address(settings: Settings) -> str:
    """The explorer's page on the query worker (workers.query.page)."""
    return query_endpoint(settings).removesuffix("/v1/query") + "/"


def run_demo(settings: Settings) -> int:
    stderr("== 1. local stack (Kafka + Redis)")
    Stack(settings).up(stderr)
    ensure_topics(settings)
    stderr("== 2. workers (chunker, extractor, detector, resolver, query)")
    log_path = settings.home / "demo-worker.log"
    # the worker's own tenant (its /mcp, the explorer's and the CLI's default) is the one the demo writes
    with WorkerProcess.spawn(log_path, {**os.environ, "MEMSTREAM_TENANT": TENANT}) as worker:
        worker.wait_healthy()
        stderr(f"== 3. publish the sample corpus ({SAMPLE_CORPUS}) as tenant '{TENANT}'")
        loaded = load_documents(sorted(str(p) for p in SAMPLE_CORPUS.glob("*.md")), TENANT, settings.max_text_bytes)
        publish(settings, loaded.documents)
        with LagReport(settings):  # `memstream status`'s lag per stage, a line each time it changes
            pending = wait_indexed(settings, loaded.documents, timeout_s=300, workers=[worker])
        if pending:
            stderr(f"demo: not indexed in time: {pending}; see {log_path}")
            return 1
        stderr("== 4. answers")
        for text in SAMPLE_QUERIES:
            body = json.dumps({"query": text, "tenant": TENANT, "top_k": 3}).encode()
            request = urllib.request.Request(
                query_endpoint(settings), data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                print(format_answer(read_answer(response.read())), flush=True)
            print(flush=True)
        stderr(
            f"== 5. the explorer: {explorer_address(settings)}?tenant={TENANT} — every query worker serves it;"
            " with `memstream worker` running, open it in a browser"
        )
        stderr(
            'done. Try: memstream query "Who founded Brightwater?" --tenant demo (with `MEMSTREAM_TENANT=demo memstream worker`'
            " running: its /mcp serves that tenant); `memstream tail --tenant demo --from-beginning` for events;"
            " `memstream stack down` to stop Kafka and Redis."
        )
        return 0
