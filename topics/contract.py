"""What every record module checks against: the contract's error, the fact categories and the
symmetric relations (topics.records and topics.times both build on this module, not on each other);
and how an error message quotes a caller's input (`quoted`, `quoted_names`)."""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence, get_args

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


# How much of a caller's input an error message repeats: a request of megabytes (a 6 MB tenant,
# 300,000 unknown field names) came back whole in its 400 body, and took seconds to describe
QUOTED_CHARS = 80
NAMED_AT_MOST = 5


def quoted(value: Any) -> str:
    """`value` as an error message quotes it: its repr, cut after QUOTED_CHARS characters of
    a string (or of a non-string's repr) with an ellipsis and how long it was."""
    if isinstance(value, str):
        return repr(value) if len(value) <= QUOTED_CHARS else f"{value[:QUOTED_CHARS]!r}… ({len(value):,} characters)"
    shown = repr(value)
    return shown if len(shown) <= QUOTED_CHARS else f"{shown[:QUOTED_CHARS]}… ({len(shown):,} characters)"


def quoted_names(names: Sequence[Any], describe: Callable[[Any], str] = quoted) -> str:
    """The first NAMED_AT_MOST of `names`, each `describe`d (quoted), and how many more there
    are: "'a', 'b' and 7 more"."""
    shown = ", ".join(describe(name) for name in names[:NAMED_AT_MOST])
    return shown + (f" and {len(names) - NAMED_AT_MOST:,} more" if len(names) > NAMED_AT_MOST else "")
