"""The corpora more than one bench indexes: synthetic one-chunk documents (`bench index`,
`bench wait`), and a QA set's passages indexed through `memstream worker` processes, one
document each (`bench recall`, `ppr`, `load`)."""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

from ops.bench.datasets import Dataset
from ops.publish import publish, wait_indexed
from ops.stack.kafka_admin import ensure_topics
from ops.stack.processes import WorkerProcess, stop_all, worker_env
from ops.stack.services import free_port
from topics import BadInput, Document
from workers.settings import Settings

FIRST = [
    "Ada",
    "Bram",
    "Cora",
    "Dag",
    "Eira",
    "Finn",
    "Gro",
    "Hal",
    "Ines",
    "Jon",
    "Kari",
    "Lars",
    "Mina",
    "Nils",
    "Olga",
    "Per",
]


LAST = ["Aune", "Berg", "Dahl", "Eide", "Foss", "Haug", "Lund", "Moe", "Nes", "Rud", "Sand", "Vik"]


THINGS = ["Ropes", "Sails", "Clocks", "Maps", "Bells", "Looms", "Kites", "Oars", "Nets", "Glass", "Salt", "Cider"]


TOWNS = ["Brightwater", "Port Selka", "Kestrel Point", "Norland", "Calder", "Ostra", "Merrow", "Halden"]


def synthetic_doc(i: int) -> str:
    person = f"{FIRST[i % 16]} {LAST[(i // 16) % 12]}{i}"
    company = f"{THINGS[i % 12]} Works{i}"
    return (
        f"{person} founded {company} in {1900 + i % 100}. {company} sells goods in {TOWNS[i % 8]}. "
        f"{person} lives in {TOWNS[(i + 3) % 8]}."
    )


# Every passage of these sets fits one chunk (≤ 300 words): the replay extractor is keyed by
# whole passages, and HippoRAG's recall counts passages.
BENCH_CHUNK_TOKENS = 100_000


def corpus_documents(dataset: Dataset, tenant: str) -> list[Document]:
    """One document per passage, titled by its first line (the sets' passages are HippoRAG's
    "title\\ntext"): a Wikipedia page's title is its subject (workers.algorithms.subjects)."""
    return [
        Document(tenant=tenant, doc_id=f"{dataset.name}-{i:05d}", text=text, title=text.partition("\n")[0] or None)
        for i, text in enumerate(dataset.passages)
    ]


def passage_index(doc_id: str) -> int:
    return int(doc_id.rsplit("-", 1)[1])


def corpus_worker_env(
    settings: Settings, namespace: str, home: Path, extractor: str, replay_file: Path | None, **extra: str
) -> dict:
    replay = {"MEMSTREAM_REPLAY_FILE": str(replay_file)} if replay_file else {}
    return worker_env(
        settings,
        namespace,
        home,
        MEMSTREAM_EXTRACTOR=extractor,
        MEMSTREAM_CHUNK_TOKENS=str(BENCH_CHUNK_TOKENS),
        **replay,
        **extra,
    )


def index_corpus(
    settings: Settings, dataset: Dataset, tenant: str, extractor: str, workers: int = 1, **extra: str
) -> float:
    """Publish every passage as a document and wait until the pipeline has indexed it all;
    returns the seconds taken. Indexing an already indexed tenant again changes nothing."""
    if extractor == "replay" and dataset.openie_file is None:
        raise BadInput(f"{dataset.name} has no recorded OpenIE extraction; use --extractor rules")
    namespace = f"recall{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="memstream-recall-"))
    env = corpus_worker_env(
        settings, namespace, home, extractor, dataset.openie_file if extractor == "replay" else None, **extra
    )
    bench = Settings.from_env(env)
    ensure_topics(bench)
    processes: list[WorkerProcess] = []
    try:
        for n in range(workers):
            processes.append(
                WorkerProcess.spawn(home / f"worker{n}.log", {**env, "MEMSTREAM_HTTP_PORT": str(free_port())})
            )
        for worker in processes:
            worker.wait_healthy()
        documents = corpus_documents(dataset, tenant)
        started = time.perf_counter()
        publish(bench, documents)
        pending = wait_indexed(bench, documents, timeout_s=3600, workers=processes)
        if pending:
            raise RuntimeError(f"{len(pending)} passages not indexed in time; see {home}")
        return time.perf_counter() - started
    finally:
        stop_all(processes)
