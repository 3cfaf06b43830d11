"""ppr and reconstruct answer with the first stage's ranking fused with their walk's
(workers.algorithms.retrieval.fuse_walk): the first stage's top passages stay in place
(RetrievalParams.first_kept) and the walk ranks what follows them, so a walk can bring a second
hop up but never push down the passage that matches the question best. Over documents the walk
weighs 8 against the first stage's 1, and it re-ranked the whole list: on a 2Wiki-style set that
cost ppr five points of R@2 under hybrid."""

from tests import inprocess
from tests.chaos_corpus import block
from tests.inprocess import answers_to, doc_ids
from workers.algorithms.retrieval import RetrievalParams, fuse, fuse_walk, keep_first

real_embedder = inprocess.real_embedder  # the fixture, for this module's tests


def test_the_first_stages_top_passages_stay_in_place_and_scores_still_fall():
    first, walked = ["a", "b", "c"], ["c", "d", "b"]
    fused = fuse([first, walked], 1.0, [1.0, 8.0])
    assert [pid for pid, _ in fused][:2] == ["c", "d"]  # the walk alone decides the order
    for kept in (1, 2):
        ranked = keep_first(fused, first, kept)
        assert [pid for pid, _ in ranked][:kept] == first[:kept]
        assert sorted(pid for pid, _ in ranked) == sorted(pid for pid, _ in fused)
        scores = [score for _, score in ranked]
        assert scores == sorted(scores, reverse=True)
    # the walk favours the second kept passage over the first: scores still fall
    favoured = fuse([first, ["b", "d"]], 1.0, [1.0, 8.0])
    ranked = keep_first(favoured, first, 2)
    assert [pid for pid, _ in ranked][:2] == ["a", "b"]
    assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
    assert keep_first(fused, first, 0) == fused
    params = RetrievalParams()
    assert fuse_walk(first, walked, params, 8.0) == keep_first(fused, first, params.first_kept)
    assert [pid for pid, _ in fuse_walk(first, [], params, 8.0)] == first  # nothing walked: the first stage
    # pages (workers.algorithms.subjects) follow the kept ones, once each, in their order; scores still fall
    paged = keep_first(fused, first, 1, ["d", "c", "a"])
    assert [pid for pid, _ in paged] == ["a", "d", "c", "b"]
    assert [score for _, score in paged] == sorted((score for _, score in paged), reverse=True)


def test_the_walk_never_moves_the_first_stages_top_passage_down(real_embedder):
    """'Who records confirm Edda Ekdahl was?' names the parish record's words: the first stage
    ranks it first. The walk, drawn to Edda Ekdahl's two birthplace claims, ranked the old
    letter above it, and ppr answered with the letter (first_kept 0: the fusion before)."""
    question = "Who records confirm Edda Ekdahl was?"

    runs = [
        ("hybrid", "hybrid", {}),
        ("ppr", "ppr", {}),
        ("reconstruct", "reconstruct", {}),
        ("ppr before", "ppr", {"first_kept": 0}),
    ]
    documents = [(doc.doc_id, None, doc.text) for doc in block(2)]
    top = {name: doc_ids(answer) for name, answer in answers_to(None, real_embedder, documents, question, runs).items()}
    assert top["hybrid"][0] == top["ppr"][0] == top["reconstruct"][0] == "b02-parish", top
    assert top["ppr before"][0] != "b02-parish", top  # the walk's order, had it decided alone
