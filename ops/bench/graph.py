"""`memstream bench graph`: the query worker's graph cache for one large tenant — cold load
time, resident memory, applying a batch of changes from the change stream, and the walk per
query — at each size in passages, for this tree and (with `baseline_tree`, e.g. `git worktree
add --detach /tmp/base HEAD`) an older one, side by side.

The graph is synthetic, written once per size through this tree's store (its graph write roles:
stage_edge, stage_fact_edge, stage_type_member — store/graph_log.py's format, which both trees
read) into a Redis of the bench's own (started on a free port, stopped at the end) or
`redis_url`'s (then left there, reused by the next run; tenant `graph-bench-<N>`):

- N passages, each mentioning 5–8 distinct entities out of N/3, drawn by a Zipf law (s = 1:
  a few entities in many passages, most in one or two) — entity–passage edges, weight 1;
- N/2 facts between two entities of one passage (fact edges; a pair named by several facts
  weighs their number), N/20 similarity edges (cosine 0.8–1) between entities of one passage;
- every entity a member of one of 24 types (Zipf too): entity–type edges, 1/|type| when read.

Then, per size and round, each tree in a process of its own (PYTHONPATH at the tree; the trees
alternate which goes first), against the same Redis:

- load: a cold `GraphCache.current` (the adjacency hashes read, the graph built), then the first
  `transition()` (the matrix the walk reads, built on the first query);
- memory: the cache's resident bytes, as tracemalloc counts them (every Python object and numpy
  buffer the loaded graph and its transition hold once the load's temporaries are gone — numpy
  reports its buffers to tracemalloc; exact, unlike the process's RSS, which keeps what the
  allocator does not return), in the first round, by loading again under tracemalloc; the
  load's peak too. RSS after the timed load, less before, is printed beside it;
- delta: 100 new passages (600-ish edges, two new entities) written through the store, then the
  cache brought current (the change stream read and applied: `catch_up`) and the next query's
  `transition()` (the deltas folded in) — what a query pays after ingestion;
- walk: `queries` PPR walks from a few seeds — three entities drawn by their mentions, a fact
  between two of them, five passages of theirs, weighted as the engine would — each timed as
  the transition's solve alone and as the engine's whole walk (`workers.query.engine._walk`: the
  solve, then the top passages and entities ranked), p50 and p99.

Both trees walk from the same seeds (drawn from node names, not indexes)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOALS = {"bytes_per_passage": 1500, "query_p50_ms": 40.0}
TYPES = 24
DELTA_PASSAGES = 100
WRITE_BATCH = 2_000  # edges staged per round trip


def tenant_of(passages: int) -> str:
    return f"graph-bench-{passages}"


def run_graph_bench(
    settings,
    sizes: list[int],
    queries: int,
    rounds: int,
    baseline_tree: str | None,
    redis_url: str | None,
    as_json: bool,
) -> int:
    from ops.bench.trees import baseline_checkout
    from ops.stack.services import Stack, free_port, stderr
    from topics import BadInput  # here: this file also runs over a baseline tree's packages
    from workers.settings import Settings

    if not sizes or min(sizes) < 10 or queries < 1 or rounds < 1:
        raise BadInput("bench graph: --graph-passages needs sizes of at least 10, --queries and --rounds positive")
    trees = [("this", ROOT)]
    if baseline_tree:
        trees.append(("baseline", baseline_checkout(baseline_tree, "workers/query/graph_cache.py")))
    stack, work = None, None
    rows: list[dict] = []
    try:
        if redis_url is None:
            work = Path(tempfile.mkdtemp(prefix="memstream-graphbench-"))
            stack = Stack(Settings(home=work, redis_port=free_port()))
            stack.service_up("redis", stderr)
            redis_url = f"redis://127.0.0.1:{stack.redis.port}/0"
        for size in sizes:
            stderr(f"bench graph: writing {size:,} passages (skipped when written already)")
            written = _phase("this", ROOT, {"phase": "write", "redis_url": redis_url, "passages": size})
            results: dict[str, list[dict]] = {name: [] for name, _ in trees}
            for n in range(rounds):
                for name, tree in trees if n % 2 == 0 else trees[::-1]:
                    stderr(f"bench graph: {size:,} passages, round {n + 1}/{rounds}, {name} tree")
                    spec = {
                        "phase": "measure",
                        "redis_url": redis_url,
                        "passages": size,
                        "queries": queries,
                        "round": n,
                        "memory": n == 0,
                        "seed": 1000 + n,
                    }
                    results[name].append(_phase(name, tree, spec))
            for name, tree in trees:
                rows.append({"tree": name, "directory": str(tree), **written, **_pooled(results[name])})
    finally:
        if stack is not None:
            stack.service_down("redis")
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        _print_table(rows, rounds, queries)
    return 0


def _phase(name: str, tree: Path, spec: dict) -> dict:
    """One phase in a subprocess that imports the tree's code (this file's measurement)."""
    from ops.bench.trees import phase_in_tree

    return phase_in_tree(
        Path(__file__), tree, [json.dumps(spec)], f"bench graph: the {name} tree's {spec['phase']} phase"
    )


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _pooled(results: list[dict]) -> dict:
    """A tree's rounds at one size: medians of the once-per-round figures, percentiles of the pooled walks."""
    from ops.bench.trees import percentiles

    out: dict = {"rounds": len(results)}
    for key in ("load_s", "transition_s", "rss_mb", "delta_read_ms", "delta_fold_ms", "nodes", "edges"):
        out[key] = _median([r[key] for r in results])
    first = results[0]
    for key in ("traced_bytes", "traced_peak_bytes"):
        out[key] = first.get(key)
    for key in ("solve_ms", "walk_ms", "seed_ms"):
        out[key] = percentiles([x for r in results for x in r[key]])
    out["passes"] = _median([p for r in results for p in r["passes"]])
    return out


def _print_table(rows: list[dict], rounds: int, queries: int) -> None:
    sizes = sorted({r["passages"] for r in rows})
    lines = [
        ("graph nodes / edges", lambda r: f"{r['nodes'] / 1000:.0f}k / {r['edges'] / 1e6:.2f}M"),
        ("cold load (Redis → graph)", lambda r: f"{r['load_s']:.2f} s"),
        ("  first transition", lambda r: f"{1000 * r['transition_s']:.0f} ms"),
        ("resident (tracemalloc)", lambda r: f"{r['traced_bytes'] / 2**20:.0f} MB"),
        ("  per passage", lambda r: f"{r['traced_bytes'] / r['passages']:.0f} B"),
        ("  load's peak", lambda r: f"{r['traced_peak_bytes'] / 2**20:.0f} MB"),
        ("  RSS growth of the load", lambda r: f"{r['rss_mb']:.0f} MB"),
        (f"delta: {DELTA_PASSAGES} passages read", lambda r: f"{r['delta_read_ms']:.1f} ms"),
        ("  folded (next query)", lambda r: f"{r['delta_fold_ms']:.1f} ms"),
        ("seed p50 / p99", lambda r: f"{r['seed_ms'][0]:.2f} / {r['seed_ms'][1]:.2f} ms"),
        ("solve p50 / p99", lambda r: f"{r['solve_ms'][0]:.2f} / {r['solve_ms'][1]:.2f} ms"),
        ("walk p50 / p99 (solve + ranking)", lambda r: f"{r['walk_ms'][0]:.2f} / {r['walk_ms'][1]:.2f} ms"),
        ("matrix passes (median)", lambda r: f"{r['passes']:.0f}"),
    ]
    trees = list(dict.fromkeys(r["tree"] for r in rows))
    print(f"bench graph: {rounds} round(s) per tree, alternating; {queries} walks a round")
    for size in sizes:
        at = {r["tree"]: r for r in rows if r["passages"] == size}
        print(f"\n{size:,} passages ({at['this']['entities']:,} entities):")
        print(f"{'':<36}" + "".join(f" {t:>22}" for t in trees) + ("  this / baseline" if len(trees) > 1 else ""))
        for label, cell in lines:
            cells = []
            for t in trees:
                try:
                    cells.append(cell(at[t]))
                except (TypeError, KeyError):
                    cells.append("-")
            print(f"{label:<36}" + "".join(f" {c:>22}" for c in cells))
        if len(trees) > 1:
            this, base = at["this"], at["baseline"]
            ratios = [
                ("load", this["load_s"] / base["load_s"]),
                ("resident", this["traced_bytes"] / base["traced_bytes"]),
                (
                    "delta",
                    (this["delta_read_ms"] + this["delta_fold_ms"]) / (base["delta_read_ms"] + base["delta_fold_ms"]),
                ),
                ("solve p50", this["solve_ms"][0] / base["solve_ms"][0]),
                ("walk p50", this["walk_ms"][0] / base["walk_ms"][0]),
                ("walk p99", this["walk_ms"][1] / base["walk_ms"][1]),
            ]
            print("this / baseline: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios))
        this = at["this"]
        print(
            f"goals: resident {this['traced_bytes'] / this['passages']:.0f} B a passage (goal <= "
            f"{GOALS['bytes_per_passage']}); walk p50 {this['walk_ms'][0]:.1f} ms of the query's {GOALS['query_p50_ms']:g} ms"
        )


# ---- the measurement, run in a subprocess against one tree ------------------------------------
def synthetic_graph(passages: int, seed: int = 7) -> dict:
    """The bench's graph as arrays: passage → its entities (`mentions`, `offsets`), entity types,
    facts and similarity edges (pairs of entity numbers). Deterministic in `passages` and `seed`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    entities = max(passages // 3, 8)
    zipf = 1.0 / np.arange(1, entities + 1)
    zipf /= zipf.sum()
    rank_to_entity = rng.permutation(entities)  # hubs are not the first ids
    counts = rng.integers(5, 9, passages)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    drawn = rng.choice(entities, int(offsets[-1] * 1.3) + 64, p=zipf)
    mentions = np.empty(offsets[-1], dtype=np.int64)
    cursor = 0
    for p in range(passages):  # distinct entities per passage, in draw order
        need, got = int(counts[p]), list[int]()
        while len(got) < need:
            if cursor >= len(drawn):
                drawn, cursor = rng.choice(entities, 4096, p=zipf), 0
            e = int(drawn[cursor])
            cursor += 1
            if e not in got:
                got.append(e)
        mentions[offsets[p] : offsets[p + 1]] = got
    mentions = rank_to_entity[mentions]
    type_weights = 1.0 / np.arange(1, TYPES + 1)
    types = rng.choice(TYPES, entities, p=type_weights / type_weights.sum())
    fact_passages = rng.choice(passages, passages // 2)
    facts = np.stack([mentions[offsets[fact_passages]], mentions[offsets[fact_passages] + 1]], axis=1)
    similar_passages = rng.choice(passages, passages // 20)
    similar = np.stack([mentions[offsets[similar_passages] + 2], mentions[offsets[similar_passages] + 3]], axis=1)
    return {
        "entities": entities,
        "mentions": mentions,
        "offsets": offsets,
        "types": types,
        "facts": facts,
        "similar": similar,
        "similarity": rng.uniform(0.8, 1.0, len(similar)),
    }


def _names(passages: int):
    from store.keys import entity_node, passage_node, type_node

    return (
        lambda p: passage_node(f"bp{p}"),
        lambda e: entity_node(f"be{e}"),
        lambda t: type_node(f"T{t}"),
    )


async def _write_edges(memory, tenant: str, edges) -> None:
    """Stage (method, args) rows through the store, WRITE_BATCH a round trip."""
    pipe, staged = _pipeline(memory, tenant), 0
    for method, args in edges:
        getattr(memory, method)(pipe, tenant, 1, *args)
        staged += 1
        if staged == WRITE_BATCH:
            await pipe.execute()
            pipe, staged = _pipeline(memory, tenant), 0
    if staged:
        await pipe.execute()


def _graph_edges(graph: dict, passages: int):
    p_name, e_name, t_name = _names(passages)
    mentions, offsets = graph["mentions"], graph["offsets"]
    for p in range(passages):
        for e in mentions[offsets[p] : offsets[p + 1]].tolist():
            yield "stage_edge", (e_name(e), p_name(p), 1.0, "passage")
    for n, (a, b) in enumerate(graph["facts"].tolist()):
        yield "stage_fact_edge", (e_name(a), e_name(b), f"bf{n}")
    for (a, b), w in zip(graph["similar"].tolist(), graph["similarity"].tolist()):
        yield "stage_edge", (e_name(a), e_name(b), round(w, 4), "similar")
    for e, t in enumerate(graph["types"].tolist()):
        yield "stage_type_member", (e_name(e), f"T{t}")


async def _write(spec: dict) -> dict:
    """The synthetic graph written through the store, unless a complete one is there (its graph
    version set last)."""
    from store import Memory

    passages, tenant = spec["passages"], tenant_of(spec["passages"])
    graph = synthetic_graph(passages)
    memory = Memory.from_url(spec["redis_url"])
    try:
        t = time.perf_counter()
        if not await memory.graph_version(tenant):
            await _write_edges(memory, tenant, _graph_edges(graph, passages))
            await memory.bump_graph_version(tenant)
        return {
            "passages": passages,
            "entities": graph["entities"],
            "write_s": round(time.perf_counter() - t, 1),
        }
    finally:
        await memory.close()


def _delta_edges(graph: dict, round_: int, run: str):
    """DELTA_PASSAGES new passages of existing entities (and two new entities), their edges:
    new nodes in every run and tree (`run`), so no delta is one applied before."""
    import numpy as np

    from store.keys import entity_node, passage_node

    rng = np.random.default_rng(50_000 + round_)
    mentions = graph["mentions"]
    _, e_name, _ = _names(0)
    for k in range(DELTA_PASSAGES):
        passage = passage_node(f"delta-{run}-{k}")
        for e in dict.fromkeys(rng.choice(mentions, 6).tolist()):
            yield "stage_edge", (e_name(e), passage, 1.0, "passage")
        head, tail = rng.choice(mentions, 2).tolist()
        yield "stage_fact_edge", (e_name(head), e_name(tail), f"delta-{run}-{k}")
    for k in range(2):
        new = entity_node(f"delta-{run}-{k}")
        yield "stage_edge", (new, passage_node(f"delta-{run}-{k}"), 1.0, "passage")
        yield "stage_type_member", (new, "T0")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _walk_seeds(graph: dict, passages: int, rng, tenant_graph):
    """The reset vector of one query, the engine's way (retrieval.seed): three entities drawn by
    their mentions, a fact between the first two, five of their passages."""
    import numpy as np

    from workers.algorithms.retrieval import FactHit, RetrievalParams, seed

    p_name, e_name, _ = _names(passages)
    mentions, offsets = graph["mentions"], graph["offsets"]
    picked = rng.choice(len(mentions), 3, replace=False)
    entities = [e_name(int(mentions[i])) for i in picked]
    passage_of = np.searchsorted(offsets, picked, side="right") - 1
    passage_hits = [(p_name(int(p)), float(rng.uniform(0.4, 0.7))) for p in passage_of.tolist()]
    passage_hits += [(p_name(int(p)), float(rng.uniform(0.3, 0.5))) for p in rng.choice(passages, 2).tolist()]
    facts = [FactHit("bench-fact", entities[0], entities[1], float(rng.uniform(0.5, 0.8)), "DECLARATIVE")]
    linked = {entities[2]: 0.5}
    passage_count = len(tenant_graph.passage_index())
    return seed(
        tenant_graph.graph,
        tenant_graph.stats,
        tenant_graph.type_sizes(),
        passage_count,
        facts,
        [],
        passage_hits,
        RetrievalParams(),
        linked,
    )


async def _measure(spec: dict) -> dict:
    import gc
    import tracemalloc
    import uuid

    import numpy as np

    from store import Memory
    from workers.algorithms.retrieval import RetrievalParams
    from workers.query.engine import _walk
    from workers.query.graph_cache import GraphCache

    passages, tenant = spec["passages"], tenant_of(spec["passages"])
    graph = synthetic_graph(passages)
    memory = Memory.from_url(spec["redis_url"])
    out: dict = {}
    try:
        await memory.graph_version(tenant)  # connected before anything is timed
        if spec["memory"]:  # resident bytes: a load under tracemalloc, then dropped
            gc.collect()
            tracemalloc.start()
            traced = await GraphCache(memory).current(tenant)
            traced.graph.transition()
            gc.collect()
            out["traced_bytes"], out["traced_peak_bytes"] = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del traced
            gc.collect()
        rss = _rss()
        cache = GraphCache(memory)
        t = time.perf_counter()
        tenant_graph = await cache.current(tenant)
        out["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        tenant_graph.graph.transition()
        out["transition_s"] = time.perf_counter() - t
        gc.collect()
        out["rss_mb"] = (_rss() - rss) / 2**20
        out["nodes"], out["edges"] = len(tenant_graph.graph), tenant_graph.graph.edges

        params = RetrievalParams()
        rng = np.random.default_rng(spec["seed"])
        walks: dict[str, list[float]] = {"seed_ms": [], "solve_ms": [], "walk_ms": [], "passes": []}

        def one_walk() -> None:
            t = time.perf_counter()
            seeds = _walk_seeds(graph, passages, rng, tenant_graph)
            walks["seed_ms"].append(1000 * (time.perf_counter() - t))
            transition = tenant_graph.graph.transition()
            passage_index, entity_index = tenant_graph.passage_index(), tenant_graph.entity_index()
            outside = np.fromiter(seeds.outside.values(), np.float64)
            t = time.perf_counter()
            ppr = transition.solve(seeds.reset, params.damping, params.tolerance, outside=outside)
            walks["solve_ms"].append(1000 * (time.perf_counter() - t))
            walks["passes"].append(ppr.passes)
            t = time.perf_counter()
            _walk(tenant_graph.graph, transition, seeds, params, passage_index, entity_index, 10)
            walks["walk_ms"].append(1000 * (time.perf_counter() - t))

        for _ in range(3):  # warm: first touches of the arrays
            one_walk()
        for values in walks.values():
            values.clear()
        for _ in range(spec["queries"]):
            one_walk()
        out.update(walks)

        await _write_edges(memory, tenant, _delta_edges(graph, spec["round"], uuid.uuid4().hex[:8]))
        t = time.perf_counter()
        tenant_graph = await cache.current(tenant)
        out["delta_read_ms"] = 1000 * (time.perf_counter() - t)
        t = time.perf_counter()
        tenant_graph.graph.transition()
        out["delta_fold_ms"] = 1000 * (time.perf_counter() - t)
        return out
    finally:
        await memory.close()


def _pipeline(memory, tenant: str):
    """memory.pipeline(tenant): a baseline tree's store from before it routed by tenant takes none."""
    try:
        return memory.pipeline(tenant)
    except TypeError:
        return memory.pipeline()


if __name__ == "__main__":
    import asyncio

    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
    spec = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(_write(spec) if spec["phase"] == "write" else _measure(spec))))
