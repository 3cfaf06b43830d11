"""The conflict policy, as pure functions: cardinality, time spans, adjudication per kind."""

import itertools

from workers.algorithms.policy import GroupFact, adjudicate, is_multi_valued, parse_time, spans_overlap


def never(a, b):
    return False


def test_cardinality_needs_two_heads_and_a_quarter_of_them():
    assert not is_multi_valued(heads_seen=1, heads_with_many_tails=1)
    assert is_multi_valued(heads_seen=2, heads_with_many_tails=2)
    assert is_multi_valued(heads_seen=8, heads_with_many_tails=2)
    assert not is_multi_valued(heads_seen=9, heads_with_many_tails=2)


def test_time_parsing_and_overlap():
    assert parse_time("1998") == (1998, 1, 1) and parse_time("1998", end=True) == (1998, 12, 31)
    assert parse_time("2001-05-17") == (2001, 5, 17) and parse_time("soon") is None
    assert not spans_overlap("1990", "1999", "2000", "2010")
    assert spans_overlap("1990", "2000", "2000", "2010")  # closed intervals share 2000
    assert spans_overlap("1990", None, "2000", "2010")  # open end reaches forward


def test_mutual_exclusion_keeps_the_better_supported_fact():
    oslo = GroupFact("f-oslo", "oslo", support=2, said_at=1.0, passage_ids=("p1", "p2"))
    bergen = GroupFact("f-bergen", "bergen", support=1, said_at=9.0, passage_ids=("p3",))
    decisions = adjudicate([bergen, oslo], never)
    assert decisions["f-oslo"].status == "active" and decisions["f-oslo"].kind == ""
    assert decisions["f-bergen"].status == "invalid" and decisions["f-bergen"].kind == "mutual_exclusion"
    assert set(decisions["f-bergen"].evidence) == {"p1", "p2", "p3"}


def test_support_tie_goes_to_the_later_statement_never_to_a_version_number():
    """Equal support: the fact first said later wins (when a document that still says it
    first said it), and a time the text gives counts over that; the reason says which."""
    first, later = GroupFact("a", "x", 1, said_at=1_700_000_000.0), GroupFact("b", "y", 1, said_at=1_700_000_060.0)
    decided = adjudicate([first, later], never)
    assert decided["a"].status == "invalid" and decided["b"].status == "active"
    assert (
        decided["a"].reason
        == "excluded by b (1 vs 1 supporting passages, first said later by a document that still says it)"
    )
    # "moved to Lindqvist in 2021" against a fact first said (in the system's time) later: the text's time counts
    lindqvist = GroupFact("lindqvist", "lindqvist", 1, said_at=1_600_000_000.0, valid_from="2021")
    tessaly = GroupFact("tessaly", "tessaly", 1, said_at=1_500_000_000.0, valid_from="2019")
    decided = adjudicate([tessaly, lindqvist], never)
    assert decided["tessaly"].status == "invalid" and decided["tessaly"].reason.endswith(
        "the later time its text gives: 2021 vs 2019)"
    )
    # the same time: the smaller id, said so
    tie = adjudicate([GroupFact("b", "y", 1, said_at=5.0), GroupFact("a", "x", 1, said_at=5.0)], never)
    assert tie["b"].status == "invalid" and tie["b"].reason.endswith("stated at the same time: the smaller id)")
    # no such day: as if the text gave no time
    assert GroupFact("c", "z", 1, said_at=7.0, valid_from="2021-02-31").stated_at == (7.0, "")
    # one time from a text, the other when first said: said so
    mixed = adjudicate(
        [GroupFact("m", "y", 1, said_at=9e9), GroupFact("n", "x", 1, said_at=1.0, valid_from="2021")], never
    )
    assert mixed["n"].reason.endswith("stated later: when it was first said vs 2021)")


def test_non_overlapping_spans_qualify_both():
    a = GroupFact("a", "acme", 1, 1.0, "1990", "1999")
    b = GroupFact("b", "globex", 3, 2.0, "2000", "2010")
    decisions = adjudicate([a, b], never)
    assert {d.status for d in decisions.values()} == {"active"}
    assert decisions["a"].qualifiers == {"time": {"from": "1990", "to": "1999"}} and decisions["a"].kind == "temporal"
    overlapping = GroupFact("c", "initech", 1, 3.0, "1995", "2005")
    assert adjudicate([a, b, overlapping], never)["c"].status == "invalid"


def test_a_containment_path_qualifies_the_scope():
    city = GroupFact("city", "kestrel_point", 1, 1.0)
    region = GroupFact("region", "norland", 1, 2.0)
    decisions = adjudicate([city, region], lambda a, b: (a, b) == ("norland", "kestrel_point"))
    assert decisions["city"].qualifiers == {"scope": {"narrower_than": ["region"], "broader_than": []}}
    assert decisions["region"].qualifiers == {"scope": {"narrower_than": [], "broader_than": ["city"]}}
    assert all(d.status == "active" and d.kind == "granularity" for d in decisions.values())


def test_decisions_do_not_depend_on_input_order():
    facts = [GroupFact(str(i), f"t{i}", support=s, said_at=float(i)) for i, s in enumerate([1, 3, 2, 3])]
    outcomes = {
        tuple(sorted((k, d.status) for k, d in adjudicate(list(p), never).items()))
        for p in itertools.permutations(facts)
    }
    assert len(outcomes) == 1
