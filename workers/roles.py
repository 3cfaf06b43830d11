"""The worker roles `memstream worker --role` accepts: each indexing role is the agent of one
topic (one faust app runs them) — a consuming stage of the stage graph (topics.graph); `query` is
the HTTP API, which needs Redis only."""

from __future__ import annotations

from topics import BadInput
from topics.graph import CONSUMES

ROLE_TOPICS: dict[str, str] = dict(CONSUMES)  # role → the topic suffix its agent consumes
ROLES = ("all", *ROLE_TOPICS, "query")
EMBEDDING_ROLES = frozenset({"extractor", "query"})  # the roles that load MEMSTREAM_EMBEDDER


def parse_roles(spec: str) -> set[str]:
    """The roles of a comma-separated spec (`all` = every role); ValueError names unknown ones."""
    roles = {r.strip() for r in spec.split(",") if r.strip()}
    unknown = roles - set(ROLES)
    if unknown or not roles:
        raise BadInput(f"unknown role(s) {sorted(unknown)}; choose from {', '.join(ROLES)}")
    return set(ROLE_TOPICS) | {"query"} if "all" in roles else roles
