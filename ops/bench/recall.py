"""`memstream bench recall`: index a multi-hop QA corpus through the real pipeline (Kafka +
Redis, `memstream worker` processes), then rank passages for every question with the query
worker's own code — every mode (lexical, dense, hybrid, memory-guided PPR, reconstruct) with the
same embedder — and report R@2/R@5
(HippoRAG's definition) with the ablation rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import asdict
from pathlib import Path

from ops.bench.corpora import index_corpus, passage_index
from ops.bench.datasets import Dataset, load_dataset, recall_at
from ops.bench.shape import measure_shape, shape_line
from ops.stack.services import Stack, stderr
from store import Memory
from workers.algorithms.retrieval import NO_LINKS, RetrievalParams
from workers.models.embedding import BatchingEmbedder, LocalEmbedder
from workers.query.engine import QueryEngine, QueryRequest
from workers.query.modes import QueryMode, table_order
from workers.settings import Settings

# name → (mode, RetrievalParams overrides, worker environment overrides for indexing)
ABLATIONS: dict[str, tuple[QueryMode, dict[str, float | bool], dict[str, str]]] = {
    "no_schema_filter": ("ppr", {}, {"MEMSTREAM_SCHEMA_FILTER": "off"}),  # τ = 1: every schema stable at once
    "no_conflict_resolution": ("ppr", {}, {"MEMSTREAM_CONFLICTS": "off"}),
    # the first stage alone: what the graph adds (the walk, and the pages and passages the top
    # passage's links join to it: workers.algorithms.subjects)
    "no_walk": ("ppr", {"walk_weight": 0.0, **NO_LINKS}, {}),
    "no_subject_pages": ("ppr", NO_LINKS, {}),  # the walk alone (no pages, no bridge passages)
    "no_named_pages": ("ppr", {"named_pages": 0}, {}),
    "no_linked_pages": ("ppr", {"linked_pages": 0}, {}),
    "no_bridge_passages": ("ppr", {"bridge_passages": 0}, {}),
    "subject_pages_no_walk": ("ppr", {"walk_weight": 0.0}, {}),  # the links alone (pages and bridges)
    "reconstruct_no_subject_pages": ("reconstruct", NO_LINKS, {}),  # nor bridge passages
    "walk_weight_1": ("ppr", {"walk_weight": 1.0}, {}),
    "walk_weight_0.25": ("ppr", {"walk_weight": 0.25}, {}),  # the weight over conversation turns
    "with_entity_links": ("ppr", {"entity_links": True}, {}),
    "no_hub_suppression": ("ppr", {"hub_suppression": False}, {}),
    "no_information_density": ("ppr", {"information_density": False}, {}),
    # the first stage's top passage kept in place (first_kept 1), or not: the walk re-ranks it all
    "first_kept_0": ("ppr", {"first_kept": 0}, {}),
    "first_kept_2": ("ppr", {"first_kept": 2}, {}),
    "reconstruct_first_kept_0": ("reconstruct", {"first_kept": 0}, {}),
}


async def evaluate(
    settings: Settings, dataset: Dataset, tenant: str, runs: dict[str, tuple[QueryMode, RetrievalParams]], embedder=None
) -> dict:
    """R@2 and R@5 (percent) of each named (mode, params) run, with the query worker's engine."""
    memory = Memory.from_url(settings.redis_url)
    engine = QueryEngine(memory, embedder or BatchingEmbedder(LocalEmbedder()))
    out = {}
    try:
        for name, (mode, params) in runs.items():
            r2, r5, fallbacks = [], [], 0
            for question in dataset.questions:
                result = await engine.answer(QueryRequest(question.text, tenant, 5, mode, params))
                fallbacks += bool(result.fallback)
                ranked = [passage_index(p.doc_id) for p in result.passages]
                r2.append(recall_at(ranked, question.gold, 2))
                r5.append(recall_at(ranked, question.gold, 5))
            out[name] = {"R@2": round(100 * sum(r2) / len(r2), 1), "R@5": round(100 * sum(r5) / len(r5), 1)}
            if mode == "ppr":
                out[name]["first_stage_fallbacks"] = fallbacks
    finally:
        await memory.close()
    return out


def run_recall_bench(
    settings: Settings,
    dataset_name: str,
    extractor: str,
    data_dir: Path,
    as_json: bool,
    tenant: str | None = None,
    index_ablations: bool = True,
) -> int:
    Stack(settings).up(stderr)
    dataset = load_dataset(dataset_name, data_dir)
    tenant = tenant or f"{dataset_name}-{extractor}-{uuid.uuid4().hex[:6]}"
    stderr(
        f"recall: indexing {len(dataset.passages)} {dataset_name} passages as tenant {tenant} ({extractor} extractor)"
    )
    seconds = index_corpus(settings, dataset, tenant, extractor)
    stderr(f"recall: indexed in {seconds:.0f} s; ranking {len(dataset.questions)} questions")
    shape = asyncio.run(_shape(settings, tenant))
    defaults = RetrievalParams()
    embedder = BatchingEmbedder(LocalEmbedder())
    main = asyncio.run(
        evaluate(settings, dataset, tenant, {mode: (mode, defaults) for mode in table_order()}, embedder)
    )
    ablations = {}
    for name, (mode, retrieval, indexing) in ABLATIONS.items():
        if indexing and not index_ablations:
            continue
        ablation_tenant = tenant
        if indexing:
            ablation_tenant = f"{tenant}-{name.replace('_', '')}"
            stderr(f"recall: ablation {name}: indexing again as tenant {ablation_tenant}")
            # workers named: else mypy matches **indexing (str values) to it
            index_corpus(settings, dataset, ablation_tenant, extractor, workers=1, **indexing)
        params = RetrievalParams(**{**asdict(defaults), **retrieval})
        ablations[name] = asyncio.run(evaluate(settings, dataset, ablation_tenant, {name: (mode, params)}, embedder))[
            name
        ]
    result = {
        "dataset": dataset_name,
        "questions": len(dataset.questions),
        "passages": len(dataset.passages),
        "extractor": extractor,
        "embedder": "all-MiniLM-L6-v2",
        "tenant": tenant,
        "index_seconds": round(seconds, 1),
        "graph_shape": shape,
        **main,
        "ablations": ablations,
        "params": asdict(defaults),
    }
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{dataset_name}: {len(dataset.questions)} questions, {len(dataset.passages)} passages, {extractor} extractor, all-MiniLM-L6-v2"
        )
        print(f"{'run':<38} {'R@2':>6} {'R@5':>6}")
        for name, row in list(main.items()) + [(f"{ABLATIONS[k][0]} {k}", v) for k, v in ablations.items()]:
            print(f"{name:<38} {row['R@2']:>6} {row['R@5']:>6}")
        print(shape_line(shape))
    return 0


async def _shape(settings: Settings, tenant: str) -> dict:
    """The indexed tenant's graph shape (workers.algorithms.graph_shape), printed beside its runs."""
    memory = Memory.from_url(settings.redis_url)
    try:
        return await measure_shape(memory, [tenant])
    finally:
        await memory.close()
