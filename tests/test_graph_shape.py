"""The graph's shape (workers.algorithms.graph_shape) and `memstream bench shape`, which reports it
for a dev set indexed by this tree and by a baseline tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workers.algorithms.graph_shape import HUB_MIN_PASSAGES, graph_shape, junk_kind, pooled

ROOT = Path(__file__).resolve().parents[1]


def test_junk_names_are_values_pronouns_and_discourse_words():
    for name in ("3", "000", "EUR", "3,000", "10:30", "2nd", "1990s", "$5", "45%"):
        assert junk_kind(name) == "value", name
    for name in ("It", "it's", "They", "That", "Those"):
        assert junk_kind(name) == "pronoun", name
    for name in ("Wow", "Thanks", "Yeah", "Oh wow", "Congrats!"):
        assert junk_kind(name) == "discourse", name
    for name in (
        "Braga",
        "The car-rental API",
        "Edda Ekdahl",
        "Route 66",
        "It Follows",
        "Thanks Giving Day",
        "US",
        "IT",
    ):
        assert junk_kind(name) is None, name


def test_a_passage_is_joined_only_through_an_entity_that_is_not_a_hub():
    # 40 passages: every one names the hub "Ann" (a speaker); p0 and p1 share "Braga", p2 and
    # p3 share "2010" (a value: junk, yet a join as the graph holds it); the rest name only Ann
    passages = [f"p{i}" for i in range(40)]
    names = {"ann": "Ann", "braga": "Braga", "y2010": "2010", "solo": "Tromsø", "oslo": "Oslo"}
    edges = [("ann", p) for p in passages]
    edges += [("braga", "p0"), ("braga", "p1"), ("y2010", "p2"), ("y2010", "p3"), ("solo", "p4")]
    shape = graph_shape(passages + ["p_empty"], names, edges)
    assert shape.passages == 41
    assert shape.entities == 5 and shape.walked == 4  # "Oslo" is joined to no passage
    assert shape.hubs == 1  # Ann, in 40 of 41 passages (more than max(10, 5%))
    assert shape.joined == round(4 / 41, 4)  # p0..p3; p4's Tromsø is in one passage, Ann is a hub
    assert shape.passages_without_entity == round(1 / 41, 4)
    assert shape.entities_per_passage == round(45 / 41, 2)
    assert shape.junk == 0.25 and shape.junk_by_kind == {"value": 1} and shape.junk_examples == ["2010"]


def test_hubs_are_each_tenants_own():
    """Pooled over tenants (a conversation each), a name in every passage of a small tenant is
    no hub there (at most HUB_MIN_PASSAGES passages), and shares are over all passages."""
    small = ([f"a{i}" for i in range(HUB_MIN_PASSAGES)], {"x": "Xu"}, [("x", f"a{i}") for i in range(HUB_MIN_PASSAGES)])
    big = ([f"b{i}" for i in range(30)], {"y": "Yan"}, [("y", f"b{i}") for i in range(30)])
    shape = pooled([small, big])
    assert shape.hubs == 1  # Yan, in 30 passages; Xu in 10 is not above the floor
    assert shape.joined == round(HUB_MIN_PASSAGES / (HUB_MIN_PASSAGES + 30), 4)


def test_bench_shape_measures_a_set_in_this_tree_and_a_baseline_tree(tmp_path):
    """`memstream bench shape` over a three-page HotpotQA-layout set, with this checkout as its own
    baseline: each tree indexes the set in a process of its own and both get one shape."""
    folder = tmp_path / "hotpotqa_train_100"
    folder.mkdir()
    corpus = {
        "Edda Ekdahl": ["Edda Ekdahl was a painter born in Varn. ", "She studied in Braga."],
        "Varn": ["Varn is a town in Norland. ", "Its lighthouse was built by Karl Moe."],
        "Karl Moe": ["Karl Moe was an engineer from Braga. ", "In 2010 he retired."],
    }
    (folder / "hotpotqa_train_corpus.json").write_text(json.dumps(corpus))
    (folder / "hotpotqa_train.json").write_text("[]")
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "shape", "--datasets", "hotpotqa", "--data", str(tmp_path),
         "--baseline-tree", str(ROOT), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert [(r["dataset"], r["tree"]) for r in rows] == [("hotpotqa", "this"), ("hotpotqa", "baseline")]
    this, base = rows
    shape_fields = ("passages", "entities", "entities_per_passage", "hubs", "joined", "junk", "junk_examples")
    assert {k: this[k] for k in shape_fields} == {k: base[k] for k in shape_fields}
    assert this["passages"] == 3 and this["walked"] >= 4
    assert this["joined"] == 1.0  # each page names another's subject (Varn, Braga, Karl Moe)
    assert this["junk"] == 0.0  # "2010" is a value, never an entity


def test_bench_shape_refuses_an_unknown_set():
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "shape", "--datasets", "hotpotqa,wiki"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unknown dataset wiki" in proc.stderr


def test_turns_about_the_same_thing_are_joined_through_their_tag():
    """Two turns in different sessions that name no one but share a topic ("pottery") are joined
    to another through an entity — the tag — where without tags neither turn had one (no name,
    no first-person fact)."""
    import asyncio

    from ops.bench.shape import _HashEmbedder, measure_shape, tenant_joins
    from ops.testing import LocalIndexer
    from store.in_memory import InMemoryStore
    from topics import Document
    from workers.models.extraction import RulesExtractor
    from workers.settings import Settings

    turns = [
        ("s1", 1, "Joanna", "I signed up for a pottery class, it is so relaxing."),
        ("s1", 2, "Nate", "That sounds great, enjoy it!"),
        ("s2", 1, "Nate", "Guess what, my first pottery bowl came out of the kiln today."),
    ]

    async def run():
        memory = InMemoryStore()
        indexer = LocalIndexer(Settings.from_env({}), memory, _HashEmbedder(), RulesExtractor())
        for n, (session, turn, speaker, text) in enumerate(turns):
            doc = Document(tenant="tags", doc_id=f"t{n}", text=text, session_id=session, turn=turn, speaker=speaker)
            await indexer.index([doc])
        return await tenant_joins(memory, "tags"), await measure_shape(memory, ["tags"])

    joins, shape = asyncio.run(run())
    pottery = [p for e, p in joins["edges"] if joins["names"][e] == "pottery"]
    assert len(pottery) == 2  # the first and the third turn, a session apart
    assert shape["joined"] == round(2 / 3, 4)  # the second turn shares nothing but a speaker
