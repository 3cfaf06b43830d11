"""The query modes and the bound on top_k, in one light module: the engine answers them, and
the CLI and MCP offer them without importing the engine (numpy, scipy, the store)."""

from typing import Literal, get_args

QueryMode = Literal["ppr", "dense", "lexical", "hybrid", "reconstruct"]
MODES: tuple[QueryMode, ...] = get_args(QueryMode)
MAX_TOP_K = 100  # passages a query may ask for (top_k from 1 to this)


def query_mode(value: object) -> QueryMode | None:
    """`value` as a query mode, None when it is none."""
    return next((mode for mode in MODES if value == mode), None)
