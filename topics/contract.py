"""What every record module checks against: the contract's error and the fact categories
(topics.records and topics.times both build on this module, not on each other)."""

from __future__ import annotations

FACT_CATEGORIES = ("DECLARATIVE", "HARD_CONSTRAINT", "REJECTED_OPTION", "TOOL_FAILURE")
# Most specific first: a sentence's category is its first cue's in this order
# (workers.algorithms.categories), and a fact extracted with several keeps the first (store.facts).
CATEGORY_PRECEDENCE = ("TOOL_FAILURE", "REJECTED_OPTION", "HARD_CONSTRAINT", "DECLARATIVE")


class ContractError(ValueError):
    """A message that does not follow the contract of its topic."""
