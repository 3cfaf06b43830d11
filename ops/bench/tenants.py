"""`memstream bench tenants`: what many small tenants cost Redis — memory, idle CPU, the time a
new tenant's first write spends on its indexes, and query latency for a small and a large tenant.

Each tree measured (this checkout, and with `baseline_tree` an older one, e.g. `git worktree add
--detach DIR a268134`) gets a Redis of its own (started on a free port, stopped at the end), and
writes through its own store (`python ops/bench/tenants.py` with PYTHONPATH at the tree): the
store's public staging calls only, which every version since the lexical leg has. A tenant is
`passages` passages of one short sentence (12 words of a 5,000-word vocabulary, Zipf-drawn), an entity and a fact
per passage and one schema, every record with a random 384-dim vector (the local embedder's
size); then one large tenant of `large` passages alike, promoted to its own lexical and vector
indexes where it is past their sizes and the tree has them (_promote_large). Measured, in this
order:

- index time: each tenant's `ensure_indexes` (its first write's index work) — mean and p99;
- memory: Redis's used_memory after the small tenants, less before, per tenant, and over the raw
  bytes written (vectors at 4 bytes a dimension, and texts);
- idle CPU: Redis's CPU (INFO used_cpu_user + used_cpu_sys) over `idle_s` seconds with no client,
  as a share of one core (the index GC timers run on their own);
- query p50 / p99: `queries` nearest-passage searches (k 10, a random vector) and as many BM25
  searches (three words drawn alike), against the middle small tenant and the large one, in
  `rounds` rounds that alternate between the trees (this, baseline; then baseline, this; ...),
  each round the same queries for both, every tree's Redis written and kept up throughout (so
  Redis memory is both trees' at once). Measured one tree after the other, the small-tenant BM25
  ratio moved between 0.66x and 1.49x over four runs (2,000 and 10,000 tenants), more than the
  changes between them did; interleaved rounds see the same load, and the ratio is given round by
  round (median, min-max) as well as of the pooled p50s.

The baseline can be run at fewer tenants (`baseline_tenants`): four indexes per tenant need
~7.8 MB each, so 10,000 of them would not fit this machine; its per-tenant figures are what
compares."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIMS = 384  # the default size: the local embedder's
VOCABULARY_SIZE = 5_000  # words drawn by Zipf's law (s = 1.1), as in prose: a few common, most rare
GOALS = {"idle_core_share": 0.05, "memory_vs_raw": 1.5, "two_document_tenant_kb": 150.0, "small_p50_vs_baseline": 1.2}


def run_tenant_bench(
    settings,
    tenants: int,
    passages: int,
    large: int,
    idle_s: float,
    queries: int,
    baseline_tree: str | None,
    baseline_tenants: int | None,
    as_json: bool,
    dims: int = DIMS,
    rounds: int = 5,
) -> int:
    from ops.bench.trees import baseline_checkout, percentiles, ratios
    from ops.stack.services import Stack, free_port, stderr
    from topics import BadInput  # here: this file also runs over a baseline tree's packages
    from workers.settings import Settings

    if tenants < 1 or passages < 1 or large < 1 or queries < 1 or idle_s <= 0 or dims < 1 or rounds < 1:
        raise BadInput(
            "bench tenants: --tenants, --passages, --large, --queries, --idle, --dims and --rounds must be positive"
        )
    trees = [("this", ROOT, tenants)]
    if baseline_tree:
        trees.append(("baseline", baseline_checkout(baseline_tree, "store/memory.py"), baseline_tenants or tenants))
    stacks: list = []
    works: list[Path] = []
    rows = []
    try:
        for name, tree, count in trees:
            works.append(work := Path(tempfile.mkdtemp(prefix="memstream-tenantbench-")))
            stacks.append(redis_stack := Stack(Settings(home=work, redis_port=free_port())))
            redis_stack.service_up("redis", stderr)  # both trees' stay up to the end: memory is their sum
            stderr(f"bench tenants: {name} ({tree}): {count} tenants of {passages} passages, one of {large}")
            spec = {
                "phase": "write",
                "redis_url": f"redis://127.0.0.1:{redis_stack.redis.port}/0",
                "tenants": count,
                "passages": passages,
                "large": large,
                "idle_s": idle_s,
                "dims": dims,
            }
            rows.append({"tree": name, "directory": str(tree), "spec": spec, **_phase(name, tree, spec)})
        latencies: dict[str, dict[str, list[float]]] = {row["tree"]: {} for row in rows}
        round_p50s: dict[str, dict[str, list[float]]] = {row["tree"]: {} for row in rows}
        for n in range(rounds):
            stderr(f"bench tenants: query round {n + 1}/{rounds}")
            for row in rows if n % 2 == 0 else rows[::-1]:  # each tree first in every other round
                spec = {**row["spec"], "phase": "query", "queries": queries, "seed": 1000 + n}
                for key, values in _phase(row["tree"], Path(row["directory"]), spec).items():
                    latencies[row["tree"]].setdefault(key, []).extend(values)
                    round_p50s[row["tree"]].setdefault(key, []).append(percentiles(values)[0])
    finally:
        for redis_stack in stacks:  # every one stopped, whatever stopping another raised
            try:
                redis_stack.service_down("redis")
            except Exception as exc:
                stderr(f"bench tenants: stopping the Redis in {redis_stack.settings.home} failed: {exc}")
        for work in works:
            shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        del row["spec"]
        row["rounds"] = rounds
        for key, values in latencies[row["tree"]].items():
            row[f"{key}_ms"] = [round(x, 3) for x in percentiles(values)]
            row[f"{key}_round_p50_ms"] = [round(x, 3) for x in round_p50s[row["tree"]][key]]
    if len(rows) > 1:
        rows[0]["small_p50_ratios"] = {
            key: ratios(round_p50s["this"][f"small_{key}"], round_p50s["baseline"][f"small_{key}"])
            for key in ("knn", "bm25")
        }
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    _print_table(rows, passages, dims)
    return 0


def _phase(name: str, tree: Path, spec: dict) -> dict:
    """One phase of the measurement (_write or _query), in a subprocess that imports the tree's
    store: this file's code, the tree's Memory."""
    from ops.bench.trees import phase_in_tree

    return phase_in_tree(
        Path(__file__), tree, [json.dumps(spec)], f"bench tenants: the {name} tree's {spec['phase']} phase"
    )


def _print_table(rows: list[dict], passages: int, dims: int) -> None:
    lines = [
        ("tenants", lambda r: f"{r['tenants']:,}"),
        ("Redis memory per tenant", lambda r: f"{r['memory_per_tenant_kb']:.1f} KB"),
        ("  over raw vectors + texts", lambda r: f"{r['memory_vs_raw']:.2f}x"),
        ("Redis memory, all", lambda r: f"{r['memory_mb']:.0f} MB"),
        ("indexes", lambda r: f"{r['indexes']:,}"),
        ("idle Redis CPU (share of a core)", lambda r: f"{100 * r['idle_core_share']:.2f}%"),
        ("index time per new tenant, mean", lambda r: f"{r['index_ms_mean']:.2f} ms"),
        ("  p99", lambda r: f"{r['index_ms_p99']:.2f} ms"),
        ("writing all tenants", lambda r: f"{r['write_s']:.0f} s"),
        ("small tenant: KNN p50 / p99", lambda r: f"{r['small_knn_ms'][0]:.2f} / {r['small_knn_ms'][1]:.2f} ms"),
        ("small tenant: BM25 p50 / p99", lambda r: f"{r['small_bm25_ms'][0]:.2f} / {r['small_bm25_ms'][1]:.2f} ms"),
        (
            f"large tenant ({rows[0]['large']:,}): KNN p50 / p99",
            lambda r: f"{r['large_knn_ms'][0]:.2f} / {r['large_knn_ms'][1]:.2f} ms",
        ),
        ("large tenant: BM25 p50 / p99", lambda r: f"{r['large_bm25_ms'][0]:.2f} / {r['large_bm25_ms'][1]:.2f} ms"),
        ("large tenant: promoted to its own", lambda r: ", ".join(r.get("large_promoted") or []) or "-"),
    ]
    print(f"{passages} passages per tenant (+ an entity and a fact each, one schema), {dims}-dim vectors:")
    print(f"{'':<40}" + "".join(f" {r['tree']:>22}" for r in rows))
    for label, cell in lines:
        print(f"{label:<40}" + "".join(f" {cell(r):>22}" for r in rows))
    this = rows[0]
    print(
        f"this tree: idle CPU {100 * this['idle_core_share']:.2f}% of a core (goal < {100 * GOALS['idle_core_share']:g}%); "
        f"memory {this['memory_vs_raw']:.2f}x the raw bytes (goal <= {GOALS['memory_vs_raw']}x), {this['memory_per_tenant_kb']:.1f} KB a tenant"
    )
    if len(rows) > 1:
        base = rows[1]
        print(
            f"baseline / this, per tenant: memory {base['memory_per_tenant_kb'] / this['memory_per_tenant_kb']:.1f}x, "
            f"idle CPU {base['idle_core_share'] / max(this['idle_core_share'], 1e-6):.1f}x (at {base['tenants']:,} vs {this['tenants']:,} tenants), "
            f"index time {base['index_ms_mean'] / max(this['index_ms_mean'], 1e-6):.1f}x; "
            f"small-tenant KNN p50 this / baseline {this['small_knn_ms'][0] / base['small_knn_ms'][0]:.2f} "
            f"(goal <= {GOALS['small_p50_vs_baseline']}), BM25 {this['small_bm25_ms'][0] / base['small_bm25_ms'][0]:.2f}"
        )
        for key, label in (("knn", "KNN"), ("bm25", "BM25")):
            ratio = this["small_p50_ratios"][key]
            print(
                f"small-tenant {label} p50 this / baseline, round by round ({this['rounds']} interleaved rounds): "
                f"median {ratio['median']:.2f}, {ratio['min']:.2f}-{ratio['max']:.2f}"
            )


# ---- the measurement, run in a subprocess against one tree's store ----------------------------
def _p99(values: list[float]) -> float:
    """ops.bench.trees.percentiles's p99, here: this runs over a baseline tree's packages, and a
    tree from before the ops/ split has no ops.bench.trees."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _words(rng):
    """n words drawn by Zipf's law from the bench's vocabulary, with `rng`."""
    import numpy as np

    vocabulary = [f"w{n}" for n in range(VOCABULARY_SIZE)]
    weights = 1.0 / np.arange(1, VOCABULARY_SIZE + 1) ** 1.1
    weights /= weights.sum()

    def words(n: int) -> str:
        return " ".join(vocabulary[i] for i in rng.choice(VOCABULARY_SIZE, n, p=weights))

    return vocabulary, words


def _small_tenant(spec: dict) -> str:
    return f"t{spec['tenants'] // 2:05d}"


async def _write(spec: dict) -> dict:
    """Every tenant written; memory, index time and idle CPU measured."""
    import asyncio

    import numpy as np
    import redis

    from store import Memory
    from store.facts import Fact
    from topics.records import Chunk

    dims = spec.get("dims", DIMS)
    rng = np.random.default_rng(1)
    vocabulary, words = _words(rng)
    sync = redis.Redis.from_url(spec["redis_url"])
    memory = Memory.from_url(spec["redis_url"], dims=dims)
    raw = 0

    async def write(tenant: str, count: int, start: int = 0) -> None:
        nonlocal raw
        pipe = _pipeline(memory, tenant)
        for i in range(start, start + count):
            text, name = words(12), f"{vocabulary[i % VOCABULARY_SIZE]} {i}"
            chunk = Chunk(
                tenant=tenant,
                chunk_id=f"p{i}",
                doc_id=f"d{i}",
                seq=0,
                n_chunks=1,
                text=text,
                doc_version=1,
                doc_hash=f"h{i}",
            )
            memory.stage_passage(pipe, tenant, chunk, [f"e{i}"], rng.normal(size=dims))
            memory.stage_entity(pipe, tenant, f"e{i}", name, "thing", rng.normal(size=dims), f"p{i}")
            fact = Fact(
                id=f"f{i}",
                head=name,
                relation="mentions",
                tail="note",
                head_type="thing",
                tail_type="thing",
                head_id=f"e{i}",
                tail_id="e0",
                schema_id="s0",
                text=f"{name} mentions a note",
            )
            memory.stage_new_fact(pipe, tenant, fact, rng.normal(size=dims), passage_id=f"p{i}")
            raw += 3 * 4 * dims + len(text) + len(name) + len(fact.text)
        if start == 0:
            memory.stage_schema(pipe, tenant, "s0", "thing", "mentions", "thing", rng.normal(size=dims), "p0")
            raw += 4 * dims + len("thingmentionsthing")
        await pipe.execute()

    before = sync.info("memory")["used_memory"]
    index_ms, started = [], time.monotonic()
    for n in range(spec["tenants"]):
        tenant = f"t{n:05d}"
        t0 = time.perf_counter()
        await memory.ensure_indexes(tenant)
        index_ms.append(1000 * (time.perf_counter() - t0))
        await write(tenant, spec["passages"])
        if (n + 1) % 1000 == 0:
            print(f"  {n + 1:,} tenants written ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    write_s = time.monotonic() - started
    await asyncio.sleep(2.0)  # background indexing settles
    small_memory, small_raw = sync.info("memory")["used_memory"] - before, raw
    await memory.ensure_indexes("large")
    for start in range(0, spec["large"], 500):
        await write("large", min(500, spec["large"] - start), start)
    promoted = await _promote_large(memory, spec["large"])
    await asyncio.sleep(2.0)
    indexes = len(sync.execute_command("FT._LIST"))
    print(f"  idle for {spec['idle_s']:g} s", file=sys.stderr, flush=True)
    cpu0, t0 = _cpu(sync), time.monotonic()
    await asyncio.sleep(spec["idle_s"])
    idle_share = (_cpu(sync) - cpu0) / (time.monotonic() - t0)
    await memory.close()
    return {
        "tenants": spec["tenants"],
        "passages": spec["passages"],
        "large": spec["large"],
        "indexes": indexes,
        "memory_mb": round(small_memory / 2**20, 1),
        "memory_per_tenant_kb": round(small_memory / spec["tenants"] / 1024, 2),
        "raw_per_tenant_kb": round(small_raw / spec["tenants"] / 1024, 2),
        "memory_vs_raw": round(small_memory / small_raw, 3),
        "idle_core_share": round(idle_share, 4),
        "index_ms_mean": round(sum(index_ms) / len(index_ms), 3),
        "index_ms_p99": round(_p99(index_ms), 3),
        "write_s": round(write_s, 1),
        "large_promoted": promoted,
    }


async def _promote_large(memory, passages: int) -> list[str]:
    """The large tenant's own indexes, made as a writer's background check makes them past their
    sizes (store.redis.lexical_index, store.redis.vector_index), where the tree's store has them:
    its queries measure the tenant as it is held, not as in the seconds before a check (10,000
    tenants: BM25 over a 5,000-passage tenant 11.9 ms p50 unpromoted). Which were made."""
    made = []
    if hasattr(memory, "promote_lexical") and passages >= memory.lexical_own_index_at:
        await memory.promote_lexical("large")
        made.append("lexical")
    if hasattr(memory, "promote_vectors") and passages >= memory.vector_own_index_at:
        await memory.promote_vectors("large")
        made.append("vectors")
    return made


async def _query(spec: dict) -> dict[str, list[float]]:
    """One round of queries against the middle small tenant and the large one: their latencies
    in ms, after a few unmeasured ones (the connection, the engine's first touch). The same
    queries for every tree (`seed`)."""
    import numpy as np

    from store import Memory

    dims = spec.get("dims", DIMS)
    rng = np.random.default_rng(spec["seed"])
    _, words = _words(rng)
    memory = Memory.from_url(spec["redis_url"], dims=dims)
    out: dict[str, list[float]] = {}
    try:
        for tenant, name in ((_small_tenant(spec), "small"), ("large", "large")):
            for _ in range(5):
                await memory.knn(tenant, "passages", rng.normal(size=dims), 10, ["doc_id"])
                await memory.lexical(tenant, words(3), 10)
            knn, bm25 = out.setdefault(f"{name}_knn", []), out.setdefault(f"{name}_bm25", [])
            for _ in range(spec["queries"]):
                vector = rng.normal(size=dims)
                t = time.perf_counter()
                assert await memory.knn(tenant, "passages", vector, 10, ["doc_id"])
                knn.append(1000 * (time.perf_counter() - t))
                query = words(3)
                t = time.perf_counter()
                await memory.lexical(tenant, query, 10)
                bm25.append(1000 * (time.perf_counter() - t))
    finally:
        await memory.close()
    return out


def _cpu(client) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def _pipeline(memory, tenant: str):
    """memory.pipeline(tenant): a baseline tree's store from before it routed by tenant takes none."""
    try:
        return memory.pipeline(tenant)
    except TypeError:
        return memory.pipeline()


if __name__ == "__main__":
    import asyncio

    sys.path[:] = [
        p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent
    ]  # ops/bench/ itself shadows nothing
    spec = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(_write(spec) if spec["phase"] == "write" else _query(spec))))
