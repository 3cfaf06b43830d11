"""`memstream bench KIND`: one subcommand per benchmark (ops.bench), each with its own flags, so a
flag given to a bench that does not read it is argparse's error (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from topics import BadInput
from workers.settings import Settings

DEFAULT_DATA = Path("..") / "shared" / "data"
DEFAULT_SIZES = "5000,50000,200000"  # graph, scale: the tenant sizes


def add_parsers(sub) -> None:
    """`bench` and its kinds, in the order `memstream bench --help` lists them."""
    bench = sub.add_parser("bench", help="benchmarks (run on the local stack)")
    kinds = bench.add_subparsers(dest="kind", required=True, metavar="KIND")

    def kind(name: str, help: str) -> argparse.ArgumentParser:
        parser = kinds.add_parser(name, help=help)
        parser.add_argument("--json", action="store_true")
        return parser

    def data(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data", default=None, help="folder holding <dataset>_train_100/ (default ../shared/data)")

    def baseline(parser: argparse.ArgumentParser, what: str) -> None:
        parser.add_argument("--baseline-tree", default=None, metavar="DIR", help=what)

    def tenant_sizes(parser: argparse.ArgumentParser) -> None:
        sizes = parser.add_mutually_exclusive_group()  # the sizes, given once: as --sizes or as --passages
        sizes.add_argument(
            "--sizes", default=None, help=f"the tenant sizes in passages, comma-separated (default {DEFAULT_SIZES})"
        )
        sizes.add_argument("--passages", default=None, help="the tenant sizes, as --sizes")

    index = kind("index", "the indexing pipeline against a fake LLM of fixed latency (--rules: the rules pipeline)")
    index.add_argument("--sizes", default=None, help="memory sizes in passages (default 1000,5000,20000)")
    index.add_argument("--probe", type=int, default=20, help="documents timed one by one at each size")
    index.add_argument("--burst", type=int, default=200, help="documents published at once for throughput")
    index.add_argument("--latency-ms", type=int, default=200, help="the fake LLM's fixed latency")
    index.add_argument("--concurrency", type=int, default=8, help="LLM calls in flight per extractor process")
    index.add_argument(
        "--extractors", default="1", help="extractor processes, comma-separated counts measured side by side (e.g. 1,2)"
    )
    index.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    index.add_argument(
        "--embedder",
        choices=["local", "fake"],
        default="local",
        help="the local model, or a fake embeddings endpoint (CPU not the bound)",
    )
    # bench index --rules (ops/bench/rules.py)
    index.add_argument(
        "--rules", action="store_true", help="the rules pipeline on HotpotQA-100 against the embedding-bound limit"
    )
    index.add_argument(
        "--docs", type=int, default=None, help="--rules: the first N documents of HotpotQA-100 (default 100)"
    )
    baseline(
        index, "--rules: also run the workers of this checkout (e.g. a git worktree of an older commit), side by side"
    )
    data(index)

    recall = kind("recall", "R@2/R@5 of every query mode on a multi-hop QA set, with the ablations")
    recall.add_argument("--dataset", choices=["musique", "hotpotqa"], default="musique", help="the QA set")
    recall.add_argument(
        "--extractor", choices=["replay", "rules"], default="replay", help="how the corpus is extracted"
    )
    data(recall)
    recall.add_argument("--tenant", default=None, help="index into (or reuse) this tenant instead of a fresh one")
    recall.add_argument("--no-index-ablations", action="store_true", help="skip ablations that index the corpus again")

    ppr = kind("ppr", "the query worker's PPR against igraph's on synthetic graphs and a QA set's")
    ppr.add_argument("--edges", default="10000,100000,1000000", help="synthetic graph sizes in edges")
    ppr.add_argument("--queries", type=int, default=100, help="queries per measurement")
    data(ppr)
    ppr.add_argument("--tenant", default=None, help="index into (or reuse) this tenant instead of a fresh one")

    load = kind("load", "concurrent clients querying one query worker, level by level")
    load.add_argument("--dataset", choices=["musique", "hotpotqa"], default="musique", help="the QA set")
    data(load)
    load.add_argument("--tenant", default=None, help="index into (or reuse) this tenant instead of a fresh one")
    load.add_argument("--clients", default="1,16,64", help="concurrent clients, one level each")
    load.add_argument("--seconds", type=float, default=10.0, help="seconds per client level")
    load.add_argument(
        "--passages", type=int, default=50, help="passages indexed into a fresh tenant when --tenant is not given"
    )
    load.add_argument("--url", default=None, help="the query worker to load (default: one started here)")

    conversation = kind("conversation", "evidence recall on a conversation in the LoCoMo layout")
    conversation.add_argument(
        "file", nargs="?", metavar="FILE", help="a LoCoMo-layout file (default: the sample conversation)"
    )
    conversation.add_argument(
        "--modes", default=None, help="query modes, comma-separated (default: every mode of the query engine)"
    )
    conversation.add_argument(
        "--redis-url", default=None, help="index into fresh tenants of this Redis instead of an in-memory store"
    )
    conversation.add_argument(
        "--ablations",
        action="store_true",
        help="also ask each ablation of the graph modes (ops/bench/conversation.py ABLATIONS), and report "
        "how far a walk from the first stage's top 5 can reach (walk_reach)",
    )

    kind("memory-tax", "what an agent's memory injects for a decision and costs (offline, no stack)")

    wait = kind("wait", "what `publish --wait` costs while documents stay pending")
    wait.add_argument("--pending", type=int, default=5000, help="documents published that no worker consumes")
    wait.add_argument("--window", type=float, default=30.0, help="seconds of --wait measured")
    wait.add_argument(
        "--seen",
        action="store_true",
        help="each document's status recorded as the chunker does (no chunk done), as in a busy pipeline",
    )
    baseline(wait, "also measure the CLI of this checkout")

    tenants = kind("tenants", "what many small tenants cost Redis")
    tenants.add_argument("--tenants", type=int, default=10_000, help="how many small tenants")
    tenants.add_argument("--passages", type=int, default=20, help="passages per tenant")
    tenants.add_argument("--large", type=int, default=5_000, help="passages of the one large tenant")
    tenants.add_argument(
        "--dims",
        type=int,
        default=384,
        help="the vectors' size (384: the local embedder's; 1536: OpenAI's text-embedding-3-small)",
    )
    tenants.add_argument("--idle", type=float, default=60.0, help="seconds of idle Redis CPU measured")
    tenants.add_argument("--queries", type=int, default=100, help="per tenant and round")
    tenants.add_argument(
        "--rounds", type=int, default=5, help="query rounds, alternating between this tree and the baseline"
    )
    baseline(tenants, "measure this checkout too, interleaved")
    tenants.add_argument(
        "--baseline-tenants",
        type=int,
        default=None,
        help="how many small tenants the baseline tree writes (default --tenants)",
    )

    graph = kind("graph", "the query worker's graph cache for one large tenant, at each size")
    tenant_sizes(graph)
    graph.add_argument("--queries", type=int, default=100, help="per size and round")
    graph.add_argument("--rounds", type=int, default=2, help="measurements per tree and size, alternating")
    baseline(graph, "measure this checkout too, interleaved")
    graph.add_argument(
        "--redis-url", default=None, help="write the graphs there (kept, reused) instead of a Redis of its own"
    )

    scale = kind("scale", "every query mode on one tenant at each size, through the engine and over HTTP")
    tenant_sizes(scale)
    scale.add_argument("--queries", type=int, default=100, help="per mode and round")
    scale.add_argument("--rounds", type=int, default=3, help="query rounds, alternating between the trees")
    baseline(scale, "measure this checkout too, interleaved")
    scale.add_argument(
        "--one-redis",
        action="store_true",
        help="the baseline's queries read this tree's Redis (same format): each question timed in both trees in "
        "turn, ratios question by question, answers compared",
    )
    data(scale)

    shape = kind("shape", "the graph indexing builds from each dev set: entities a passage, joins, junk")
    shape.add_argument(
        "--datasets", default="hotpotqa,musique,locomo", help="comma-separated, of hotpotqa, musique, locomo"
    )
    baseline(shape, "measure this checkout's graph too, side by side")
    data(shape)


def _counts(text: str, flag: str = "--sizes") -> list[int]:
    """A flag's comma-separated counts (passages, edges, clients, processes); ValueError naming
    the flag and the part that is not one. `--extractors 1,x` read int("x") and said only
    "invalid literal for int()", and `--clients 0` measured no client at all."""
    counts = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit():
            raise BadInput(f"bench: {flag} takes counts, comma-separated; {part!r} is not one")
        counts.append(int(part))
    if flag != "--sizes" and (not counts or min(counts) < 1):  # a size of 0 is refused by its bench
        raise BadInput(f"bench: {flag} takes counts of at least 1, comma-separated, not {text!r}")
    return counts


def _data(args) -> Path:
    return Path(args.data) if args.data else DEFAULT_DATA


def bench_index(settings: Settings, args) -> int:
    if args.rules:
        if args.sizes:
            raise BadInput("--sizes is an option of bench index without --rules, not bench index --rules")
        from ops.bench.rules import DEFAULT_DOCS, run_rules_bench

        return run_rules_bench(
            settings,
            _data(args),
            args.docs or DEFAULT_DOCS,
            Path(args.baseline_tree) if args.baseline_tree else None,
            args.json,
        )
    from ops.bench.index import run_index_bench

    sizes = sorted(_counts(args.sizes if args.sizes is not None else "1000,5000,20000"))  # "": none (README)
    extractors = _counts(args.extractors, "--extractors")
    return run_index_bench(
        settings,
        sizes,
        args.probe,
        args.burst,
        args.latency_ms,
        args.concurrency,
        args.json,
        extractors,
        args.partitions,
        args.embedder,
    )


def bench_recall(settings: Settings, args) -> int:
    from ops.bench.recall import run_recall_bench

    return run_recall_bench(
        settings, args.dataset, args.extractor, _data(args), args.json, args.tenant, not args.no_index_ablations
    )


def bench_ppr(settings: Settings, args) -> int:
    from ops.bench.ppr import run_ppr_bench

    return run_ppr_bench(settings, _counts(args.edges, "--edges"), args.queries, _data(args), args.tenant, args.json)


def bench_load(settings: Settings, args) -> int:
    from ops.bench.load import run_load_bench

    clients = _counts(args.clients, "--clients")
    return run_load_bench(
        settings, clients, args.seconds, args.tenant, args.url, args.dataset, _data(args), args.passages, args.json
    )


def bench_conversation(settings: Settings, args) -> int:
    from ops.bench.conversation import run_conversation_bench

    return run_conversation_bench(
        settings, Path(args.file) if args.file else None, args.modes, args.redis_url, args.json, args.ablations
    )


def bench_memory_tax(settings: Settings, args) -> int:
    from ops.bench.memory_tax import run_memory_tax_bench  # offline: its own in-memory store, no stack

    return run_memory_tax_bench(args.json)


def bench_wait(settings: Settings, args) -> int:
    from ops.bench.wait import run_wait_bench

    return run_wait_bench(settings, args.pending, args.window, args.baseline_tree, args.seen, args.json)


def bench_tenants(settings: Settings, args) -> int:
    from ops.bench.tenants import run_tenant_bench

    return run_tenant_bench(
        settings,
        args.tenants,
        args.passages,
        args.large,
        args.idle,
        args.queries,
        args.baseline_tree,
        args.baseline_tenants,
        args.json,
        dims=args.dims,
        rounds=args.rounds,
    )


def bench_graph(settings: Settings, args) -> int:
    from ops.bench.graph import run_graph_bench

    sizes = _counts(args.sizes or args.passages or DEFAULT_SIZES)
    return run_graph_bench(settings, sizes, args.queries, args.rounds, args.baseline_tree, args.redis_url, args.json)


def bench_scale(settings: Settings, args) -> int:
    from ops.bench.scale import run_scale_bench

    sizes = _counts(args.sizes or args.passages or DEFAULT_SIZES)
    return run_scale_bench(
        sizes, args.queries, args.rounds, args.baseline_tree, _data(args), args.json, one_redis=args.one_redis
    )


def bench_shape(settings: Settings, args) -> int:
    from ops.bench.shape import run_shape_bench

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    return run_shape_bench(datasets, _data(args), args.baseline_tree, args.json)


BENCHES = {
    "index": bench_index,
    "recall": bench_recall,
    "ppr": bench_ppr,
    "load": bench_load,
    "conversation": bench_conversation,
    "memory-tax": bench_memory_tax,
    "wait": bench_wait,
    "tenants": bench_tenants,
    "graph": bench_graph,
    "scale": bench_scale,
    "shape": bench_shape,
}


def cmd_bench(settings: Settings, args) -> int:
    return BENCHES[args.kind](settings, args)


COMMANDS = {"bench": cmd_bench}
