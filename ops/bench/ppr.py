"""`memstream bench ppr`: the query worker's cached CSR PPR against igraph's
`personalized_pagerank` (prpack, damping 0.5 — HippoRAG's call) on the same graph and reset
vectors, side by side in one run: synthetic hub-skewed graphs of 10^4..10^6 edges and the graph
of the indexed MuSiQue corpus. Then end-to-end `POST /v1/query` latency over HTTP, PPR mode
against dense mode, on the MuSiQue tenant."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from ops.bench.corpora import corpus_worker_env, index_corpus
from ops.bench.datasets import load_dataset
from ops.stack.processes import WorkerProcess
from ops.stack.services import Stack, free_port, stderr
from store import Memory
from workers.algorithms.ppr import SparseGraph
from workers.query.graph_cache import TenantGraph, load_whole
from workers.settings import Settings

NODES_PER_EDGE = 0.37  # the indexed MuSiQue graph's shape: 20,960 nodes for 56,648 edges
SEEDS_PER_QUERY = 10  # nonzero reset entries, about what a query seeds (entities of 5 facts + passages)


def hub_skewed_edges(edges: int, seed: int = 0) -> list[tuple[str, str, float]]:
    """Endpoints drawn from a power law (a few hubs with huge degree, like type and frequent
    entity nodes), weights 1..3 like fact counts."""
    rng = np.random.default_rng(seed)
    nodes = max(int(edges * NODES_PER_EDGE), 10)
    popularity = 1.0 / np.arange(1, nodes + 1) ** 0.9
    popularity /= popularity.sum()
    found: dict[tuple[int, int], float] = {}
    while len(found) < edges:
        need = int((edges - len(found)) * 1.3) + 10
        a = rng.choice(nodes, need, p=popularity)
        b = rng.integers(0, nodes, need)
        for x, y in zip(a.tolist(), b.tolist()):
            if x != y:
                found.setdefault((min(x, y), max(x, y)), float(rng.integers(1, 4)))
                if len(found) == edges:
                    break
    return [(f"n{x}", f"n{y}", w) for (x, y), w in found.items()]


def compare(name: str, graph: SparseGraph, queries: int, candidates: np.ndarray, seed: int = 1) -> dict:
    import igraph

    adjacency = graph.matrix().tocoo()
    upper = adjacency.row < adjacency.col
    g = igraph.Graph(
        n=len(graph), edges=list(zip(adjacency.row[upper].tolist(), adjacency.col[upper].tolist())), directed=False
    )
    g.es["weight"] = adjacency.data[upper].tolist()
    rng = np.random.default_rng(seed)
    size = min(SEEDS_PER_QUERY, len(candidates))
    resets = []
    for _ in range(queries + 3):  # the first 3 of each side warm up
        reset = np.zeros(len(graph))
        reset[rng.choice(candidates, size, replace=False)] = rng.uniform(0.05, 1.0, size)
        resets.append(reset)
    # each side runs its queries back to back (as a query worker would), on the same resets
    graph.transition()  # the worker keeps it between queries; building it is not per query
    ours, ours_ms = [], []
    for reset in resets:
        t = time.perf_counter()
        scores = graph.pagerank(reset, 0.5, 1e-6)
        ours_ms.append((time.perf_counter() - t) * 1000)
        ours.append(scores.astype(np.float32))
    theirs_ms, equal, l1 = [], 0, 0.0
    for q, reset in enumerate(resets):
        reset_list = reset.tolist()
        t = time.perf_counter()
        theirs = np.array(
            g.personalized_pagerank(
                vertices=None, directed=False, damping=0.5, reset=reset_list, weights="weight", implementation="prpack"
            )
        )
        theirs_ms.append((time.perf_counter() - t) * 1000)
        if q >= 3:
            equal += list(np.argsort(-ours[q], kind="stable")[:10]) == list(np.argsort(-theirs, kind="stable")[:10])
            l1 = max(l1, float(np.abs(ours[q] - theirs).sum()))
    ours_ms, theirs_ms = ours_ms[3:], theirs_ms[3:]
    igraph_ms, memstream_ms = statistics.median(theirs_ms), statistics.median(ours_ms)
    return {
        "graph": name,
        "nodes": len(graph),
        "edges": graph.edges,
        "igraph_ms": round(igraph_ms, 2),
        "memstream_ms": round(memstream_ms, 2),
        "speedup": round(igraph_ms / memstream_ms, 2),
        "top10_equal": equal == queries,
        "top10_equal_share": round(equal / queries, 3),
        "max_l1_vs_igraph": float(f"{l1:.2g}"),
    }


async def load_tenant_graph(settings: Settings, tenant: str) -> TenantGraph:
    memory = Memory.from_url(settings.redis_url)
    try:
        return await load_whole(memory, tenant)  # not a graph whose changes were trimmed away during its load
    finally:
        await memory.close()


def http_latency(settings: Settings, tenant: str, questions: list[str], home: Path) -> dict:
    port = free_port()
    env = corpus_worker_env(settings, f"pprbench{port}", home, "rules", None, MEMSTREAM_HTTP_PORT=str(port))
    url = f"http://127.0.0.1:{port}/v1/query"

    def ask(text: str, mode: str) -> float:
        body = json.dumps({"query": text, "tenant": tenant, "top_k": 5, "mode": mode}).encode()
        started = time.perf_counter()
        with urllib.request.urlopen(
            urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}), timeout=60
        ) as response:
            response.read()
        return (time.perf_counter() - started) * 1000

    with WorkerProcess.spawn(home / "query-worker.log", env, role="query") as worker:
        worker.wait_healthy()
        ask("warm-up", "ppr")  # model, graph load, index handles
        for text in questions:  # every question's embedding cached, so both modes pay the same for it
            ask(text, "dense")
        times: dict[str, list[float]] = {"ppr": [], "dense": []}
        for text in questions:  # each text once per mode: no PPR result-cache hits
            for mode in ("ppr", "dense"):
                times[mode].append(ask(text, mode))
    out = {}
    for mode, values in times.items():
        out[f"{mode}_p50_ms"] = round(float(np.percentile(values, 50)), 1)
        out[f"{mode}_p99_ms"] = round(float(np.percentile(values, 99)), 1)
    out["p50_ratio"] = round(out["ppr_p50_ms"] / out["dense_p50_ms"], 2)
    out["queries"] = len(questions)
    return out


def run_ppr_bench(
    settings: Settings, sizes: list[int], queries: int, data_dir: Path, tenant: str | None, as_json: bool
) -> int:
    if importlib.util.find_spec("igraph") is None:
        print("memstream bench ppr needs igraph: pip install 'memstream[bench]'", file=sys.stderr)
        return 2
    rows = []
    for size in sizes:
        stderr(f"ppr: synthetic hub-skewed graph, {size} edges")
        graph = SparseGraph.from_edges(hub_skewed_edges(size))
        rows.append(compare("synthetic", graph, queries, np.arange(len(graph))))
    Stack(settings).up(stderr)
    dataset = load_dataset("musique", data_dir)
    if tenant is None:
        tenant = f"musique-replay-ppr{int(time.time())}"
        stderr(f"ppr: indexing the MuSiQue corpus as tenant {tenant} (pass --tenant to reuse an indexed one)")
        index_corpus(settings, dataset, tenant, "replay")
    tenant_graph = asyncio.run(load_tenant_graph(settings, tenant))
    seeds = np.sort(np.concatenate([tenant_graph.entity_index(), tenant_graph.passage_index()]))
    rows.append(compare(f"musique:{tenant}", tenant_graph.graph, queries, seeds))
    stderr("ppr: HTTP latency, ppr vs dense mode")
    http = http_latency(
        settings, tenant, [q.text for q in dataset.questions], Path(tempfile.mkdtemp(prefix="memstream-pprbench-"))
    )
    result = {"rows": rows, "http": http}
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{'graph':<28} {'nodes':>9} {'edges':>9} {'igraph ms':>10} {'memstream ms':>13} {'speedup':>8} {'top10 equal':>12} {'max L1 diff':>12}"
        )
        for r in rows:
            print(
                f"{r['graph']:<28} {r['nodes']:>9} {r['edges']:>9} {r['igraph_ms']:>10} {r['memstream_ms']:>13} {r['speedup']:>8} {str(r['top10_equal']):>12} {r['max_l1_vs_igraph']:>12}"
            )
        print(
            f"HTTP POST /v1/query over {http['queries']} MuSiQue questions: ppr p50 {http['ppr_p50_ms']} ms, p99 {http['ppr_p99_ms']} ms; "
            f"dense p50 {http['dense_p50_ms']} ms, p99 {http['dense_p99_ms']} ms; p50 ratio {http['p50_ratio']}"
        )
    return 0
