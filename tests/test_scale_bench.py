"""`memstream bench scale`, small: one tenant of a few hundred passages from the shared corpora,
each tree on a Redis of its own (this tree as its own baseline), every mode timed through the
engine and over HTTP, the figures present and plausible."""

from __future__ import annotations

import json

import pytest

from ops.bench.scale import WordHashEmbedder, build_corpus, entities_of
from tests.conftest import ROOT, Cli
from tests.shared_data import SHARED_DATA as DATA
from tests.shared_data import needs_shared

pytestmark = pytest.mark.stack
corpora = needs_shared("musique_train_100")  # build_corpus reads MuSiQue-100, HotpotQA-100 and LoCoMo dev


def _scale_with_itself(stack_env, *options: str) -> list[dict]:
    """`bench scale` of 300 passages, 2 questions a round, 2 rounds, this tree as its own
    baseline: the rows."""
    args = ["--passages", "300", "--queries", "2", "--rounds", "2", "--baseline-tree", str(ROOT), *options]
    out = Cli(stack_env).run("bench", "scale", *args, "--data", str(DATA), "--json")
    return json.loads(out.stdout)


@corpora
def test_the_corpus_is_the_shared_sets_then_their_sentences_recombined():
    passages, questions = build_corpus(DATA, 6_000)
    assert len(passages) == len(set(passages)) == 6_000
    assert "\n" in passages[0]  # MuSiQue's "title\ntext" first
    assert len(questions) > 300
    assert entities_of("Ada Quill met Bo at Orsk Mills in May.")[:2] == ["Ada Quill", "Bo"]
    embedder = WordHashEmbedder()
    a, b, c = (embedder.vector(t) for t in ("the red lighthouse", "a red lighthouse", "quarterly tax forms"))
    assert float(a @ b) > float(a @ c)


@corpora
def test_bench_scale_measures_this_tree_and_a_baseline_side_by_side(stack_env):
    rows = _scale_with_itself(stack_env)
    assert [r["tree"] for r in rows] == ["this", "baseline"]
    for row in rows:
        assert row["size"] == 300 and row["write_s"] > 0 and row["bytes_per_passage"] > 0
        assert row["promote_s"] is not None  # the same tree: its own lexical index
        assert row["graph_load_ms"] > 0
        for mode in ("dense", "lexical", "hybrid", "ppr", "reconstruct"):
            for path in ("engine", "HTTP"):
                p50, p99 = row["latency_ms"][f"{mode} ({path})"]
                assert 0 < p50 <= p99
    assert set(rows[0]["ratio_by_round"]) == set(rows[0]["latency_ms"])


def test_bench_scale_reads_its_sizes_from_sizes_and_refuses_it_where_no_bench_reads_it(stack_env):
    """`bench scale --sizes 50000` ran every default size (5,000, 50,000 and 200,000, most of an
    hour): --sizes was bench index's, and scale read --passages alone. The other count lists
    (--edges, --clients, --extractors) said only "invalid literal for int()", or took 0."""
    cli = Cli(stack_env)
    for argv, said in [
        (["scale", "--sizes", "0"], "must be positive"),  # read: refused before anything is written
        (["scale", "--sizes", "5k"], "'5k' is not one"),
        (["ppr", "--edges", "1000,1e6"], "--edges takes counts, comma-separated; '1e6' is not one"),
        (["load", "--clients", "0"], "--clients takes counts of at least 1"),
        (["index", "--extractors", "1,x"], "--extractors takes counts, comma-separated; 'x' is not one"),
        (["scale", "--sizes", "300", "--passages", "300"], "not allowed with argument --sizes"),
        (["recall", "--sizes", "300"], "unrecognized arguments: --sizes 300"),  # argparse: not recall's flag
        (["index", "--rules", "--sizes", "300"], "not bench index --rules"),
    ]:
        proc = cli.run("bench", *argv, check=False, timeout=60)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert said in proc.stderr, (argv, proc.stderr)


@corpora
def test_bench_scale_on_one_redis_pairs_each_question_and_compares_the_answers(stack_env):
    """--one-redis: the baseline's code queries this tree's memory, so each question's two times
    are a pair on the same Redis (two Redis instances built apart differed by 10-25% on modes
    no change touched) and each answer is compared; this tree as its own baseline answers alike."""
    this, baseline = _scale_with_itself(stack_env, "--one-redis")
    assert (this["tree"], baseline["tree"]) == ("this", "baseline")
    assert this["write_s"] > 0 and baseline.get("write_s") is None and baseline["one_redis"]  # one memory, written once
    assert set(this["ratio_paired"]) == set(this["latency_ms"]) == set(baseline["latency_ms"])
    for key, ratio in this["ratio_paired"].items():
        assert 0 < ratio["q1"] <= ratio["median"] <= ratio["q3"], key
    assert this["same_answers"] == {mode: [4, 4] for mode in ("dense", "lexical", "hybrid", "ppr", "reconstruct")}
    for row in (this, baseline):
        for mode in ("dense", "lexical", "hybrid", "ppr", "reconstruct"):
            assert len([k for k in row["latency_ms"] if k.startswith(f"{mode} (")]) == 2
    refused = Cli(stack_env).run("bench", "scale", "--passages", "300", "--one-redis", check=False, timeout=60)
    assert refused.returncode == 2 and "--one-redis pairs this tree with --baseline-tree" in refused.stderr


def test_bench_index_sizes_empty_skips_the_growth_run_as_readme_says(monkeypatch):
    """README: "`--sizes ""` skips it" (bench index's per-document time as memory grows); the
    code read an empty --sizes as not given and ran the three default sizes (a docs audit)."""
    from ops import cli
    from ops.bench import index

    asked: list = []
    monkeypatch.setattr(index, "run_index_bench", lambda settings, sizes, *rest, **kw: asked.append(sizes) or 0)
    assert cli.main(["bench", "index", "--sizes", ""]) == 0
    assert cli.main(["bench", "index"]) == 0
    assert asked == [[], [1000, 5000, 20000]]
