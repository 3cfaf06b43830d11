"""`memstream demo` (`make demo`): local stack up, workers, the sample corpus published and
indexed, a few indexed-fact events and the answers to sample queries."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from ops.kafka_admin import ensure_topics
from ops.publish import load_documents, publish, wait_indexed
from ops.processes import WorkerProcess
from ops.stack import Stack, stderr
from workers.settings import Settings

SAMPLE_CORPUS = Path(__file__).parent / "sample_corpus"
SAMPLE_QUERIES = (
    "Who designed the bridge over the Ostra River?",
    "Which comet does the observatory track, and who discovered it?",
    "How does rye from the mill reach Port Selka?",
)
TENANT = "demo"


def run_demo(settings: Settings) -> int:
    from ops.cli import format_answer, query_endpoint

    stderr("== 1. local stack (Kafka + Redis)")
    Stack(settings).up(stderr)
    ensure_topics(settings)
    stderr("== 2. workers (chunker, extractor, detector, resolver, query)")
    log_path = settings.home / "demo-worker.log"
    with WorkerProcess.spawn(log_path) as worker:
        worker.wait_healthy()
        stderr(f"== 3. publish the sample corpus ({SAMPLE_CORPUS}) as tenant '{TENANT}'")
        loaded = load_documents(sorted(str(p) for p in SAMPLE_CORPUS.glob("*.md")), TENANT, settings.max_text_bytes)
        publish(settings, loaded.documents)
        pending = wait_indexed(settings, loaded.documents, timeout_s=300)
        if pending:
            stderr(f"demo: not indexed in time: {pending}; see {log_path}")
            return 1
        stderr("== 4. answers")
        for text in SAMPLE_QUERIES:
            body = json.dumps({"query": text, "tenant": TENANT, "top_k": 3}).encode()
            request = urllib.request.Request(query_endpoint(settings), data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                print(format_answer(json.loads(response.read())), flush=True)
            print(flush=True)
        stderr("done. Try: memstream query \"Who founded Brightwater?\" --tenant demo (with `memstream worker` running);"
               " `memstream tail --tenant demo --from-beginning` for events; `memstream stack down` to stop Kafka and Redis.")
        return 0
