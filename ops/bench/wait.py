"""`memstream bench wait`: what `memstream publish --wait` costs while documents stay pending.

The real CLI (`python -m ops.cli publish FILE --wait`, a subprocess) publishes `pending`
one-chunk documents to a topic namespace of its own that no worker consumes, so they stay
pending (with `seen`, each with its status recorded as the chunker records it, no chunk done:
what a busy pipeline's waits read; otherwise none has a status); once they are published, its CPU (utime + stime from /proc/<pid>/stat) and Redis's (INFO
cpu, used_cpu_user + used_cpu_sys) are measured over `window_s` seconds, as a share of one core.
Redis is one of the benchmark's own (started on a free port, stopped at the end), so nothing
else's commands count towards its CPU. With `baseline_tree` (a checkout of an older version, e.g.
`git worktree add --detach DIR 50b1565`) the same is measured for its CLI (cwd and PYTHONPATH
there), side by side in the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from ops.bench.corpora import synthetic_doc
from ops.bench.trees import baseline_checkout
from ops.stack.kafka_admin import delete_namespace_topics
from ops.stack.services import Stack, free_port, stderr
from store.server_stats import server_usage
from workers.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ACCEPTABLE_SHARE = 0.05  # of one core, with 5,000 documents pending


@dataclass
class WaitCost:
    tree: str  # "this" or "baseline"
    directory: str
    namespace: str  # of its topics (deleted at the end)
    pending: int
    seen: bool  # the chunker had recorded every document
    window_s: float
    client_core_share: float  # the `publish --wait` process's CPU / wall time
    redis_core_share: float  # Redis's CPU over the same window / wall time
    redis_commands_per_s: float  # the commands of its scripts included


def run_wait_bench(
    settings: Settings, pending: int, window_s: float, baseline_tree: str | None, seen: bool, as_json: bool
) -> int:
    Stack(settings).up(stderr)  # Kafka, which the CLI publishes to
    trees = [("this", ROOT)] + (
        [("baseline", baseline_checkout(baseline_tree, "ops/cli/__main__.py", "ops/cli.py"))] if baseline_tree else []
    )
    work = Path(tempfile.mkdtemp(prefix="memstream-waitbench-"))
    redis_stack = Stack(Settings(home=work, redis_port=free_port()))
    redis_stack.service_up("redis", stderr)
    redis_url = f"redis://127.0.0.1:{redis_stack.redis.port}/0"
    namespaces = []
    try:
        rows = []
        for name, tree in trees:
            ns = f"waitbench{uuid.uuid4().hex[:8]}"
            namespaces.append(ns)
            stderr(
                f"bench wait: {name} ({tree}): publishing {pending} documents no worker consumes, then {window_s:g} s of --wait"
            )
            rows.append(_measure(settings, tree, name, ns, redis_url, work, pending, window_s, seen))
    finally:
        redis_stack.service_down("redis")
        delete_namespace_topics(settings, namespaces)
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        print(json.dumps([asdict(row) for row in rows], indent=1))
    else:
        state = "each seen by the chunker, no chunk done" if seen else "none seen by the chunker"
        print(f"publish --wait with {pending} documents pending ({state}), {window_s:g} s window (share of one core):")
        print(f"{'tree':>10} {'client CPU':>11} {'Redis CPU':>10} {'Redis cmd/s':>12}  directory")
        for row in rows:
            print(
                f"{row.tree:>10} {100 * row.client_core_share:>10.2f}% {100 * row.redis_core_share:>9.2f}% {row.redis_commands_per_s:>12.1f}  {row.directory}"
            )
        this = rows[0]
        total = this.client_core_share + this.redis_core_share
        verdict = "meets" if total < ACCEPTABLE_SHARE else "misses"
        print(
            f"this tree: client + Redis {100 * total:.2f}% of a core: {verdict} the < {100 * ACCEPTABLE_SHARE:g}% target"
        )
        if len(rows) > 1 and total > 0:
            base = rows[1].client_core_share + rows[1].redis_core_share
            print(f"baseline / this: {base / total:.0f}x the CPU")
    return 0


def _measure(
    settings: Settings,
    tree: Path,
    name: str,
    ns: str,
    redis_url: str,
    work: Path,
    pending: int,
    window_s: float,
    seen: bool,
) -> WaitCost:
    tenant = f"waitbench-{ns[-8:]}"
    texts = {f"wait-{i}": synthetic_doc(i) for i in range(pending)}
    docs = work / f"{ns}.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": doc_id, "text": text}) + "\n" for doc_id, text in texts.items()))
    if seen:
        asyncio.run(_record_chunked(redis_url, tenant, texts))
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = {
        **inherited,
        "PYTHONPATH": str(tree),
        "MEMSTREAM_TOPIC_NAMESPACE": ns,
        "MEMSTREAM_APP_ID": ns,
        "MEMSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "MEMSTREAM_REDIS_URL": redis_url,
        "MEMSTREAM_HOME": str(work),
    }
    argv = [
        sys.executable,
        "-m",
        "ops.cli",
        "publish",
        str(docs),
        "--tenant",
        tenant,
        "--wait",
        "--timeout",
        str(window_s + 600),
    ]
    proc = subprocess.Popen(
        argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines, published = [], threading.Event()

    def drain() -> None:  # all of its stderr, so a full pipe never stalls it
        assert proc.stderr is not None  # Popen(stderr=PIPE)
        for line in proc.stderr:
            lines.append(line)
            if " published" in line:  # not a terminal: one line once all are published (ops.publish.Progress)
                published.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        while not published.wait(0.2):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"bench wait: {name}'s publish --wait ended (exit {proc.returncode}) before publishing: {''.join(lines)[-2000:]}"
                )
        cpu0, redis0, started = _process_cpu_s(proc.pid), server_usage(redis_url), time.monotonic()
        time.sleep(window_s)
        cpu1, redis1, wall = _process_cpu_s(proc.pid), server_usage(redis_url), time.monotonic() - started
        if proc.poll() is not None:
            raise RuntimeError(
                f"bench wait: {name}'s publish --wait ended (exit {proc.returncode}) during the window: {''.join(lines)[-2000:]}"
            )
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return WaitCost(
        name,
        str(tree),
        ns,
        pending,
        seen,
        round(wall, 1),
        round((cpu1 - cpu0) / wall, 4),
        round((redis1.cpu_s - redis0.cpu_s) / wall, 4),
        round((redis1.commands - redis0.commands) / wall, 1),
    )


async def _record_chunked(redis_url: str, tenant: str, texts: dict[str, str]) -> None:
    """Each document's status as the chunker records it (one chunk: the benchmark's documents
    are short), none of its chunks done."""
    from store import Memory
    from workers.algorithms.chunking import chunk_id_of
    from workers.algorithms.normalize import content_hash

    memory = Memory.from_url(redis_url)
    try:
        pipe = memory.pipeline(tenant)
        for doc_id, text in texts.items():
            memory.stage_document(pipe, tenant, doc_id, content_hash(text), 1, [chunk_id_of(text)])
        await pipe.execute()
    finally:
        await memory.close()


def _process_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
