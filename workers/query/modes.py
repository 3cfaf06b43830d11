"""The query modes, in one light module: the engine answers them, and the CLI and MCP offer
them without importing the engine (numpy, scipy, the store)."""

MODES = ("ppr", "dense", "lexical", "hybrid", "reconstruct")
