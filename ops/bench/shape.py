"""`memstream bench shape`: the shape of the graph indexing builds from each dev set — entities a
passage, the share of passages joined to another through an entity that is not a hub, the share
of junk entities (values, pronouns, discourse words: workers.algorithms.graph_shape) — for this
tree and (with `baseline_tree`) an older one, side by side.

Each tree indexes the set in a process of its own (PYTHONPATH at the tree; the phase below
imports nothing of ops.bench, which an older tree may lack) through its own pipeline
(ops.testing's LocalIndexer; ops.local_run's in a tree from before it) over its in-memory store:
HotpotQA-100 with the rules extractor, MuSiQue-100 with the replayed OpenIE triples, the LoCoMo
dev conversations (a tenant each, turn by turn) with the rules extractor — the extractors
`bench recall` and `bench conversation` use. The documents are titled by their first line, as
`bench recall` titles them, where the tree's Document has a title. Vectors are a hash of each
text (no model: entity ids follow names, so the passage–entity joins measured here do not
depend on the embedder; the similarity bridges, which do, are not counted). The phase hands back
each tenant's passages, entity names and passage joins; this tree measures both with one
definition."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

DATASETS = ("hotpotqa", "musique", "locomo")


def run_shape_bench(datasets: list[str], data_dir: Path, baseline_tree: str | None, as_json: bool) -> int:
    from ops.bench.trees import baseline_checkout, phase_in_tree
    from topics import BadInput

    unknown = [d for d in datasets if d not in DATASETS]
    if unknown:
        raise BadInput(f"bench shape: unknown dataset {', '.join(unknown)}; choose from {', '.join(DATASETS)}")
    root = Path(__file__).resolve().parents[2]
    trees = [("this", root)]
    if baseline_tree:
        trees.append(("baseline", baseline_checkout(baseline_tree, "ops/testing.py", "ops/local_run.py")))
    rows = []
    for dataset in datasets:
        for name, tree in trees:
            print(f"shape: {dataset} in {name} ({tree})", file=sys.stderr, flush=True)
            spec = {"dataset": dataset, "data": str(Path(data_dir).resolve())}
            got = phase_in_tree(Path(__file__), tree, [json.dumps(spec)], f"bench shape: {dataset} in {tree}")
            shape = shape_of(got["tenants"])
            rows.append(
                {"dataset": dataset, "tree": name, "directory": str(tree), "index_s": got["seconds"], **shape.to_json()}
            )
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        print(format_table(rows))
    return 0


def format_table(rows: list[dict]) -> str:
    lines = [
        "| set | tree | passages | entities (walked) | entities a passage | no entity | hubs | joined (non-hub) | junk | junk by kind | most frequent junk |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        kinds = ", ".join(f"{k} {v}" for k, v in r["junk_by_kind"].items()) or "—"
        lines.append(
            f"| {r['dataset']} | {r['tree']} | {r['passages']:,} | {r['entities']:,} ({r['walked']:,}) | {r['entities_per_passage']:.2f} "
            f"| {100 * r['passages_without_entity']:.1f}% | {r['hubs']} | {100 * r['joined']:.1f}% "
            f"| {100 * r['junk']:.1f}% | {kinds} | {', '.join(r['junk_examples'][:5]) or '—'} |"
        )
    return "\n".join(lines)


# ---- the phase: run over a tree's packages (this file as a script, PYTHONPATH at the tree) ----


class _HashEmbedder:
    """A text's vector from its hash: deterministic, no model (the phase measures joins, not vectors)."""

    name = "shape-hash"
    dims = 64

    async def embed(self, texts):
        import hashlib

        import numpy as np

        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).standard_normal(self.dims).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows) if rows else np.zeros((0, self.dims), np.float32)


def _document(tenant: str, doc_id: str, text: str):
    from topics import Document

    try:
        return Document(tenant=tenant, doc_id=doc_id, text=text, title=text.partition("\n")[0] or None)
    except TypeError:  # a tree from before documents had subjects
        return Document(tenant=tenant, doc_id=doc_id, text=text)


async def tenant_joins(memory, tenant: str) -> dict:
    """One tenant's passage ids, entity names by id and (entity id, passage id) joins, read from
    its export (ops.export; any store) — what graph_shape measures. The phase runs it over older
    trees too, so it reads the export's node names ("e:…", "p:…") itself."""
    from ops.export import export_memory

    export = await export_memory(memory, tenant)
    names = {e["id"]: e.get("name") or "" for e in export["entities"]}
    edges = []
    for edge in export["edges"]:
        if edge["kind"] == "passage":
            ends = sorted((edge["source"], edge["target"]))  # "e:…" before "p:…"
            if ends[0].startswith("e:") and ends[1].startswith("p:"):
                edges.append((ends[0][2:], ends[1][2:]))
    return {"tenant": tenant, "passages": await memory.scan_ids(tenant, "passages"), "names": names, "edges": edges}


def shape_of(joins: list[dict]):
    """The shape (workers.algorithms.graph_shape.GraphShape) of tenants' joins (tenant_joins,
    or a phase's JSON of them), taken together."""
    from workers.algorithms.graph_shape import pooled

    return pooled((t["passages"], t["names"], [tuple(e) for e in t["edges"]]) for t in joins)


async def measure_shape(memory, tenants: list[str]) -> dict:
    """The shape of `tenants` of `memory` taken together, as JSON (bench recall, bench conversation)."""
    return shape_of([await tenant_joins(memory, tenant) for tenant in tenants]).to_json()


def shape_line(shape: dict) -> str:
    """A shape in one line, under a bench's table."""
    return (
        f"graph: {shape['entities_per_passage']:.2f} entities a passage, {100 * shape['joined']:.1f}% of passages "
        f"joined through a non-hub entity, {shape['hubs']} hubs, junk {100 * shape['junk']:.1f}% of the "
        f"{shape['walked']:,} entities joined to a passage ({', '.join(shape['junk_examples'][:5]) or 'none'})"
    )


async def _phase(spec: dict) -> dict:
    from store.in_memory import InMemoryStore
    from workers.models.extraction import make_extractor
    from workers.settings import Settings

    try:
        from ops.testing import LocalIndexer
    except ImportError:  # a tree from before the public testing module
        from ops.local_run import LocalIndexer  # type: ignore[no-redef]

    data = Path(spec["data"])
    settings = Settings.from_env({"MEMSTREAM_CHUNK_TOKENS": "100000"})  # a passage is a chunk, as in bench recall
    memory = InMemoryStore()
    started = time.perf_counter()
    tenants: list[str] = []
    if spec["dataset"] == "locomo":
        from topics.conversations import locomo_turns

        turns = locomo_turns(json.loads((data / "locomo_dev/locomo_dev.json").read_text()), "locomo_dev")
        samples = list(dict.fromkeys(turn.metadata["sample_id"] for turn in turns))
        tenant_of = {sample: f"shape-{i}" for i, sample in enumerate(samples)}
        indexer = LocalIndexer(settings, memory, _HashEmbedder(), make_extractor("rules"))
        for turn in turns:  # one turn at a time, as a conversation arrives (bench conversation)
            await indexer.index([turn.document(tenant_of[turn.metadata["sample_id"]])])
        tenants = list(tenant_of.values())
    else:
        folder = data / f"{spec['dataset']}_train_100"
        corpus = json.loads((folder / f"{spec['dataset']}_train_corpus.json").read_text())
        if spec["dataset"] == "musique":
            passages = [f"{p['title']}\n{p['text']}" for p in corpus]
            extractor = make_extractor("replay", str(sorted(folder.glob("openie_*.json"))[0]))
        else:
            passages = [f"{title}\n{''.join(corpus[title])}" for title in corpus]
            extractor = make_extractor("rules")
        indexer = LocalIndexer(settings, memory, _HashEmbedder(), extractor)
        await indexer.index(_document("shape", f"{spec['dataset']}-{i:05d}", t) for i, t in enumerate(passages))
        tenants = ["shape"]
    seconds = time.perf_counter() - started
    out = [await tenant_joins(memory, tenant) for tenant in tenants]
    return {"seconds": round(seconds, 1), "tenants": out}


if __name__ == "__main__":
    import asyncio

    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
    print(json.dumps(asyncio.run(_phase(json.loads(sys.argv[1])))))
