"""`memstream bench scale`: one tenant at 5,000 / 50,000 / 200,000 passages on the Redis store —
query p50 / p99 of every mode through the engine and over HTTP, the write and (this tree's)
lexical promotion time, Redis memory per passage, the graph cache's load time and resident
growth — for this tree and a baseline tree side by side, in one run.

The passages. First the shared corpora's own, read by path (MuSiQue-100's 1,890, HotpotQA-100's
994, the LoCoMo dev conversations' 1,451 turns); past them, passages recombined from their
sentences (three to five, drawn with a fixed seed), so a size of any count holds real words in
real proportions. Each passage's entities are the names the rules extractor reads in its
sentences (workers.models.mentions; at most four, found once, in this tree, for both), each
pair of neighbours a fact ("A appears with B", active, one stable schema), written as the
extractor writes them (passage, entities, entity–passage edges, facts and their edges) through
the tree's store staging calls, a pipeline of 200 passages at a time: no model runs, so a size
takes minutes, not hours. Vectors come from WordHashEmbedder: each word hashed to a signed
coordinate of 384, counted and normalised — the local model's size and cost shape for the
indexes, no model's quality (the bench measures speed; `bench recall` and `bench conversation`
measure quality). The queries are the corpora's questions, each asked once per tree (the
engine caches answers), the same ones of both trees in a round.

Each tree (this checkout; with `baseline_tree` an older one, e.g. `git worktree add --detach
DIR <commit>`) gets a Redis of its own and is written by a subprocess importing that tree's
code (this file run with PYTHONPATH at the tree). Then one long-lived query process per tree
holds its engine and its HTTP app (workers.query.server.query_app on a free port); rounds
alternate which tree goes first (this, baseline; baseline, this; ...), each round the same
queries in every mode for both. The first PPR query of each process loads the graph cache: its
time and the process's resident growth (VmRSS) are the graph cache's load time and memory."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIMS = 384
SIZES = (5_000, 50_000, 200_000)
TENANT = os.environ.get("MEMSTREAM_SCALE_TENANT", "scale")
WRITE_BATCH = 200
GOALS = {"50000": {"lexical": 5.0, "graph_p50": 20.0, "graph_p99": 60.0}, "200000": {"every_p50": 40.0}}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+")


class WordHashEmbedder:
    """Not a model: each word (lowercased) hashed to one of `dims` coordinates with a sign,
    counted, the vector normalised. Texts sharing words are near, as with a model; it costs
    microseconds, so 200,000 passages are written in minutes. The bench's queries use it too."""

    name = "word-hash"

    def __init__(self, dims: int = DIMS):
        self.dims = dims

    def vector(self, text: str):
        import numpy as np

        out = np.zeros(self.dims, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            h = zlib.crc32(word.encode())
            out[h % self.dims] += 1.0 if h & 0x80000000 else -1.0
        norm = float(np.linalg.norm(out))
        return out / norm if norm else out

    async def embed(self, texts: list[str]):
        import numpy as np

        return np.vstack([self.vector(t) for t in texts])


# ---- the corpus: built once here, read by every tree's writer ---------------------------------
def build_corpus(data_dir: Path, size: int, seed: int = 7) -> tuple[list[str], list[str]]:
    """`size` passages (the corpora's own first, then recombined sentences) and the questions."""
    import random

    from ops.bench.datasets import load_dataset

    passages: list[str] = []
    questions: list[str] = []
    for name in ("musique", "hotpotqa"):
        dataset = load_dataset(name, data_dir)
        passages += dataset.passages
        questions += [q.text for q in dataset.questions]
    locomo = data_dir / "locomo_dev" / "locomo_dev.json"
    for conversation in json.loads(locomo.read_text(encoding="utf-8")):
        talk = conversation["conversation"]
        for key, turns in talk.items():
            if key.startswith("session_") and isinstance(turns, list):
                passages += [f"{turn['speaker']}: {turn['text']}" for turn in turns if turn.get("text")]
        questions += [qa["question"] for qa in conversation.get("qa", []) if qa.get("question")]
    passages = list(dict.fromkeys(passages))
    sentences = [s.strip() for p in passages for s in _SENTENCE.split(p) if len(s.split()) >= 4]
    rng = random.Random(seed)
    seen = set(passages)
    while len(passages) < size:
        text = " ".join(rng.sample(sentences, rng.randint(3, 5)))
        if text not in seen:
            seen.add(text)
            passages.append(text)
    return passages[:size], list(dict.fromkeys(questions))


def entities_of(text: str) -> list[str]:
    """A passage's names as the rules extractor reads them, sentence by sentence (capitalised
    spans, values and a sentence's opening common words left out), at most four, first seen
    first. Its capitalised word runs were the bench's entities before: "The" (3,796 of 20,000
    passages), "It" (3,291), "He", "In", "She", "Wow", "Thanks" were its largest hubs — nodes the
    product never makes — and a walk through "It" searched 1,846 facts; read so, the largest
    are "American" (1,102), "United States" (547), "British" (315); 3.57 entities a passage
    against 3.95."""
    from workers.models.mentions import capitalised_spans, naming_mentions

    names = [
        surface
        for sentence in _SENTENCE.split(text)
        for _, _, surface in naming_mentions(sentence, capitalised_spans(sentence))
    ]
    return list(dict.fromkeys(names))[:4]


# ---- run: both trees, interleaved rounds ------------------------------------------------------
def run_scale_bench(
    sizes: list[int],
    queries: int,
    rounds: int,
    baseline_tree: str | None,
    data_dir: Path,
    as_json: bool,
    http: bool = True,
    one_redis: bool = False,
) -> int:
    from ops.bench.trees import baseline_checkout, percentiles, phase_in_tree, ratios
    from ops.stack.services import Stack, free_port, stderr
    from topics import BadInput  # here: this file also runs over a baseline tree's packages
    from workers.query.modes import table_order  # this tree's: a baseline's children get the built-in names
    from workers.settings import Settings

    if not sizes or min(sizes) < 1 or queries < 1 or rounds < 1:
        raise BadInput("bench scale: --sizes, --queries and --rounds must be positive")
    if one_redis and not baseline_tree:
        raise BadInput("bench scale: --one-redis pairs this tree with --baseline-tree; name one")
    trees = [("this", ROOT)]
    if baseline_tree:
        trees.append(("baseline", baseline_checkout(baseline_tree, "store/memory.py")))
    work = Path(tempfile.mkdtemp(prefix="memstream-scalebench-"))
    results = []
    try:
        passages, questions = build_corpus(Path(data_dir), max(sizes))
        if len(questions) < queries * rounds:
            stderr(f"bench scale: {len(questions)} questions; rounds reuse them with a suffix")
        corpus = work / "corpus.json"
        stderr(f"bench scale: reading the entities of {len(passages):,} passages")
        corpus.write_text(
            json.dumps({"passages": passages, "entities": [entities_of(p) for p in passages]}), encoding="utf-8"
        )
        for size in sizes:
            stacks, children = [], {}
            try:
                rows: dict[str, dict] = {}
                written: dict = {}  # this tree's memory (written first), which --one-redis's baseline reads
                for name, tree in trees:
                    if one_redis and name != "this":  # this tree's memory, read by the baseline's code
                        rows[name] = {"tree": name, "directory": str(tree), "size": size, "one_redis": True}
                        children[name] = _QueryProcess(tree, {**written, "http": http})
                        continue
                    stacks.append(redis_stack := Stack(Settings(home=work / f"{name}-{size}", redis_port=free_port())))
                    redis_stack.service_up("redis", stderr)
                    url = f"redis://127.0.0.1:{redis_stack.redis.port}/0"
                    stderr(f"bench scale: {name} ({tree}): writing {size:,} passages")
                    spec = {"redis_url": url, "corpus": str(corpus), "size": size}
                    written = written or spec
                    rows[name] = {
                        "tree": name,
                        "directory": str(tree),
                        "size": size,
                        **phase_in_tree(
                            Path(__file__), tree, ["write", json.dumps(spec)], f"bench scale: the write phase in {tree}"
                        ),
                    }
                    children[name] = _QueryProcess(tree, {**spec, "http": http})
                for name, child in children.items():
                    rows[name].update(child.ask({"do": "warm", "query": questions[0]}))
                samples: dict[str, dict[str, list[float]]] = {name: {} for name in rows}
                by_round: dict[str, dict[str, list[float]]] = {name: {} for name in rows}
                order = list(children)
                for n in range(rounds):
                    stderr(f"bench scale: {size:,} passages, round {n + 1}/{rounds}")
                    asked = [_question(questions, n * queries + i) for i in range(queries)]
                    if one_redis:
                        _paired_round(children, asked, list(table_order()), samples, n)
                        continue
                    for name in order if n % 2 == 0 else order[::-1]:
                        got = children[name].ask({"do": "round", "queries": asked, "modes": list(table_order())})
                        for key, values in got.items():
                            samples[name].setdefault(key, []).extend(values)
                            by_round[name].setdefault(key, []).append(percentiles(values)[0])
                if one_redis:
                    rows["this"].update(_paired_ratios(samples))
                for name, row in rows.items():
                    row["latency_ms"] = {k: [round(x, 2) for x in percentiles(v)] for k, v in samples[name].items()}
                    if name != "this" and "this" in rows and not one_redis:
                        rows["this"]["ratio_by_round"] = {
                            k: ratios(by_round["this"][k], by_round[name][k]) for k in by_round["this"]
                        }
                results += list(rows.values())
                if not as_json:  # each size's table as soon as it is measured: a long run cut off keeps them
                    _print_table(list(rows.values()), rounds * queries)
                    sys.stdout.flush()
            finally:
                for child in children.values():
                    child.close()
                for redis_stack in stacks:
                    try:
                        redis_stack.service_down("redis")
                    except Exception as exc:
                        stderr(f"bench scale: stopping the Redis in {redis_stack.settings.home} failed: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        print(json.dumps(results, indent=1))
    return 0


def _paired_round(children: dict, asked: list[str], modes: list[str], samples: dict, n: int) -> None:
    """One round of --one-redis: each question of each mode asked of one tree and at once of the
    other (which first alternates), both answering from the same Redis: each question's two
    times are a pair, and each answer's signature (samples' "answer <mode>") says whether the
    two trees answered it the same."""
    names = list(children)
    for mode in modes:
        for i, query in enumerate(asked):
            for name in names if (n + i) % 2 == 0 else names[::-1]:
                got = children[name].ask({"do": "round", "queries": [query], "modes": [mode], "sign": True})
                for key, values in got.items():
                    samples[name].setdefault(key, []).extend(values)


def _paired_ratios(samples: dict) -> dict:
    """--one-redis: this tree's time over the baseline's, question by question (median and
    quartiles, each mode and path), and how many answers were the same in both trees."""
    this, base = samples["this"], samples["baseline"]
    out: dict = {"ratio_paired": {}, "same_answers": {}}
    for key in list(this):
        if key.startswith("answer "):
            out["same_answers"][key[len("answer ") :]] = [
                sum(a == b for a, b in zip(this[key], base[key])),
                len(this[key]),
            ]
            del this[key], base[key]
            continue
        by_question = sorted(a / b for a, b in zip(this[key], base[key]))
        quartile = len(by_question) // 4
        out["ratio_paired"][key] = {
            "median": round(statistics.median(by_question), 3),
            "q1": round(by_question[quartile], 3),
            "q3": round(by_question[-1 - quartile], 3),
        }
    return out


def _question(questions: list[str], n: int) -> str:
    """The n-th question asked: each once (the engine caches answers), a suffix past the last."""
    text = questions[n % len(questions)]
    return text if n < len(questions) else f"{text} ({n // len(questions)})"


class _QueryProcess:
    """A tree's query process: one JSON request a line in, one JSON answer a line out."""

    def __init__(self, tree: Path, spec: dict):
        from ops.bench.trees import tree_env

        self.tree = tree
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "serve", json.dumps(spec)],
            cwd=tree,
            env=tree_env(tree),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, request: dict) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench scale: the query process of {self.tree} ended (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _print_table(rows: list[dict], asked: int) -> None:
    for size in sorted({r["size"] for r in rows}):
        group = [r for r in rows if r["size"] == size]
        names = [r["tree"] for r in group]
        paired = group[0].get("ratio_paired")  # --one-redis
        print(f"\none tenant of {size:,} passages ({asked} questions a mode, p50 / p99 ms)")
        ratio_header = (
            " | this / baseline, question by question on one Redis: median (quartiles)"
            if paired
            else " | this / baseline p50 (by round: median, min-max)"
        )
        print("| | " + " | ".join(names) + (ratio_header if len(group) > 1 else "") + " |")
        print("|---|" + "---:|" * len(group) + ("---|" if len(group) > 1 else ""))
        for key in group[0]["latency_ms"]:
            cells = [f"{r['latency_ms'][key][0]:.1f} / {r['latency_ms'][key][1]:.1f}" for r in group]
            extra = ""
            if paired:
                by = paired.get(key, {})
                extra = f" | {by.get('median', 0):.2f}x ({by.get('q1', 0):.2f}-{by.get('q3', 0):.2f})"
            elif len(group) > 1:
                pooled = group[0]["latency_ms"][key][0] / max(group[1]["latency_ms"][key][0], 1e-9)
                by = group[0].get("ratio_by_round", {}).get(key, {})
                extra = f" | {pooled:.2f}x ({by.get('median', 0):.2f}x, {by.get('min', 0):.2f}-{by.get('max', 0):.2f})"
            print(f"| {key} | " + " | ".join(cells) + extra + " |")
        if paired:
            same = ", ".join(f"{mode} {n} of {of}" for mode, (n, of) in group[0]["same_answers"].items())
            print(f"| the same answer in both trees | {same} |" + " |" * len(group))
        for label, field, unit in (
            ("write", "write_s", "s"),
            ("lexical promotion", "promote_s", "s"),
            ("vector indexes promotion (HNSW)", "vectors_s", "s"),
            ("Redis memory per passage", "bytes_per_passage", "B"),
            ("graph cache load (first ppr query)", "graph_load_ms", "ms"),
            ("graph cache resident per passage (VmRSS growth)", "graph_rss_per_passage", "B"),
        ):
            cells = [f"{r[field]:,.1f} {unit}" if r.get(field) is not None else "—" for r in group]
            print(f"| {label} | " + " | ".join(cells) + (" | |" if len(group) > 1 else " |"))


# ---- the phases, in a subprocess importing one tree's code ------------------------------------
async def _write(spec: dict) -> dict:

    from store import Memory
    from store.facts import Fact, Triple
    from store.keys import entity_node, passage_node
    from store.records import EmbedderId
    from topics.records import Chunk
    from workers.algorithms.normalize import entity_id, fact_id, schema_id

    corpus = json.loads(Path(spec["corpus"]).read_text(encoding="utf-8"))
    texts, entities = corpus["passages"][: spec["size"]], corpus["entities"]
    embedder = WordHashEmbedder()
    memory = Memory.from_url(spec["redis_url"])
    relation, kind = "appears with", "ENTITY"
    sid = schema_id(kind, relation, kind)
    try:
        await memory.claim_embedder(TENANT, EmbedderId(embedder.name, embedder.dims), True)
        await memory.ensure_indexes(TENANT)
        base = await _used_memory(memory)
        started = time.perf_counter()
        for start in range(0, len(texts), WRITE_BATCH):
            version = await memory.bump_graph_version(TENANT)
            pipe = _pipeline(memory, TENANT)
            for i in range(start, min(start + WRITE_BATCH, len(texts))):
                text = texts[i]
                chunk = Chunk(TENANT, f"s{i:07d}", f"doc-{i}", 0, 1, text)
                names = entities[i]
                ids = [entity_id(n) for n in names]
                memory.stage_passage(pipe, TENANT, chunk, ids, embedder.vector(text))
                for name, eid in zip(names, ids):
                    memory.stage_entity(pipe, TENANT, eid, name, kind, embedder.vector(name), chunk.chunk_id)
                    memory.stage_edge(
                        pipe, TENANT, version, entity_node(eid), passage_node(chunk.chunk_id), 1.0, "passage"
                    )
                for (head, hid), (tail, tid) in zip(zip(names, ids), list(zip(names, ids))[1:]):
                    if hid == tid:
                        continue
                    fid = fact_id(hid, relation, tid)
                    fact = Fact.extracted(fid, Triple(head, relation, tail, kind, kind), hid, tid, sid)
                    memory.stage_new_fact(pipe, TENANT, fact, embedder.vector(f"{head} {relation} {tail}"))
                    memory.stage_fact_update(pipe, TENANT, fid, {"status": "active"})
                    memory.stage_fact_passage(pipe, TENANT, fid, chunk.chunk_id)
                    memory.stage_fact_edge(pipe, TENANT, version, entity_node(hid), entity_node(tid), fid)
                if i < 2:  # two passages: the schema stable at τ = 2
                    memory.stage_schema(
                        pipe, TENANT, sid, kind, relation, kind, embedder.vector(relation), chunk.chunk_id
                    )
            await pipe.execute()
            if (start // WRITE_BATCH) % 50 == 0:
                print(f"bench scale: written {start + WRITE_BATCH:,} of {len(texts):,}", file=sys.stderr, flush=True)
        write_s = time.perf_counter() - started
        await _indexed(memory, len(texts))
        promote_s = None
        if hasattr(memory, "promote_lexical"):  # this tree: the tenant's own lexical index
            started = time.perf_counter()
            await memory.promote_lexical(TENANT)
            promote_s = time.perf_counter() - started
        vectors_s = None
        if hasattr(memory, "promote_vectors") and len(texts) >= memory.vector_own_index_at:  # ... its own HNSW indexes
            started = time.perf_counter()
            await memory.promote_vectors(TENANT)
            vectors_s = time.perf_counter() - started
        used = await _used_memory(memory) - base
        return {
            "write_s": round(write_s, 1),
            "promote_s": None if promote_s is None else round(promote_s, 2),
            "vectors_s": None if vectors_s is None else round(vectors_s, 2),
            "bytes_per_passage": round(used / len(texts), 1),
        }
    finally:
        await memory.close()


async def _used_memory(memory) -> int:
    return int((await memory.redis.info("memory"))["used_memory"])


async def _indexed(memory, count: int) -> None:
    """Until the shared passages index holds them all (it indexes in the background)."""
    for _ in range(6000):
        info = await memory.redis.ft(f"ms:index:passages:{DIMS}:f16").info()
        if int(info["num_docs"]) >= count and float(info.get("percent_indexed", 1)) >= 1:
            return
        await asyncio.sleep(0.05)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def _serve(spec: dict) -> None:
    """Answer the parent's requests, one a line: warm (the first PPR query: graph load), round."""
    import logging

    from aiohttp import ClientSession, web

    from store import Memory
    from workers.query.engine import QueryEngine, QueryRequest
    from workers.query.modes import query_mode  # a baseline tree's too: its names only
    from workers.query.server import query_app
    from workers.settings import Settings

    logging.disable(logging.INFO)  # the HTTP app's access log: a line a request
    embedder = WordHashEmbedder()
    memory = Memory.from_url(spec["redis_url"])
    engine = QueryEngine(memory, embedder)
    runner = session = None
    if spec.get("http"):
        try:  # this code runs over a baseline tree's packages too: ops/stack.py before the ops/ split
            from ops.stack.services import free_port
        except ImportError:
            from ops.stack import free_port  # type: ignore[attr-defined,no-redef]

        settings = Settings.from_env({"MEMSTREAM_REDIS_URL": spec["redis_url"], "MEMSTREAM_TENANT": TENANT})
        runner = web.AppRunner(query_app(settings, embedder))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        session = ClientSession(f"http://127.0.0.1:{port}")

    signed: dict[str, list[str]] = {}  # "answer <mode>" → its answers' signatures (a round with "sign")
    signing = False

    async def ask_engine(query: str, mode: str) -> float:
        started = time.perf_counter()
        answer = await engine.answer(QueryRequest(query, TENANT, 5, query_mode(mode) or "ppr"))
        elapsed = (time.perf_counter() - started) * 1000
        if signing:
            shown = {k: v for k, v in answer.to_json().items() if k != "timings_ms"}
            signed.setdefault(f"answer {mode}", []).append(
                hashlib.sha1(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:16]
            )
        return elapsed

    async def ask_http(query: str, mode: str) -> float:
        assert session is not None
        started = time.perf_counter()
        async with session.post("/v1/query", json={"query": query, "top_k": 5, "mode": mode}) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        return (time.perf_counter() - started) * 1000

    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            request = json.loads(line)
            if request["do"] == "warm":
                rss = _rss_bytes()
                load_ms = await ask_engine(request["query"], "ppr")
                grown = _rss_bytes() - rss
                if session is not None:
                    await ask_http(request["query"] + " (warm)", "ppr")
                size = int(spec["size"])
                warmed = {"graph_load_ms": round(load_ms, 1), "graph_rss_per_passage": round(grown / size, 1)}
                print(json.dumps(warmed), flush=True)
                continue
            timed: dict[str, list] = {}
            signing = bool(request.get("sign"))
            signed.clear()
            for mode in request["modes"]:
                for query in request["queries"]:
                    timed.setdefault(f"{mode} (engine)", []).append(await ask_engine(query, mode))
                    if session is not None:
                        timed.setdefault(f"{mode} (HTTP)", []).append(await ask_http(query, mode))
            print(json.dumps({**timed, **signed}), flush=True)
    finally:
        if session is not None:
            await session.close()
        if runner is not None:
            await runner.cleanup()
        engine.close()
        await memory.close()


def _pipeline(memory, tenant: str):
    """memory.pipeline(tenant): a baseline tree's store from before it routed by tenant takes none."""
    try:
        return memory.pipeline(tenant)
    except TypeError:
        return memory.pipeline()


if __name__ == "__main__":
    phase, given = sys.argv[1], json.loads(sys.argv[2])
    if phase == "write":
        print(json.dumps(asyncio.run(_write(given))))
    else:
        asyncio.run(_serve(given))
