"""What every record module checks against: the contract's error, the fact categories and the
symmetric relations (topics.records and topics.times both build on this module, not on each other)."""

from __future__ import annotations

from typing import Literal, get_args

FactCategory = Literal["DECLARATIVE", "HARD_CONSTRAINT", "REJECTED_OPTION", "TOOL_FAILURE"]
FACT_CATEGORIES: tuple[FactCategory, ...] = get_args(FactCategory)
# Most specific first: a sentence's category is its first cue's in this order
# (workers.algorithms.categories), and a fact extracted with several keeps the first (store.facts).


def fact_category(name: str) -> FactCategory:
    """`name` as a fact category; ContractError when it is none (a record's category is checked
    when it is decoded: topics.records.Triple)."""
    for category in FACT_CATEGORIES:
        if name == category:
            return category
    raise ContractError(f"category {name!r} is not one of {', '.join(FACT_CATEGORIES)}")


CATEGORY_PRECEDENCE: tuple[FactCategory, ...] = ("TOOL_FAILURE", "REJECTED_OPTION", "HARD_CONSTRAINT", "DECLARATIVE")

# Relations whose head and tail may be swapped without changing the fact (as normalised by
# workers.algorithms.normalize.relation_name). Part of the contract: a candidate fact's partition
# key is the smaller end of a symmetric pair (topics.records.candidate_key), and the conflict
# policy (workers.algorithms.policy) reads the same set.
SYMMETRIC_RELATIONS = frozenset(
    {
        "marry",
        "married to",
        "spouse of",
        "spouse",
        "sibling of",
        "sibling",
        "twin of",
        "cousin of",
        "partner of",
        "related to",
        "neighbour of",
        "neighbor of",
    }
)


class BadInput(ValueError):
    """Input that memstream refuses — a flag, a setting, a file, a request, a message — with a
    message saying what is wrong and what it expects. The CLI exits 2 with the message and the
    HTTP API answers 400; any other exception is a bug (the CLI shows its traceback, exit 1).
    A ValueError, so every caller that handled bad input as one still does."""


class ContractError(BadInput):
    """A message that does not follow the contract of its topic."""
