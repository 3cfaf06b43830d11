"""Graph node names: what the graph's adjacency, its change stream, PPR, the graph cache and the
exports call an entity, a passage and an entity type ("e:<id>", "p:<id>", "t:<type>"). Pure:
stages and algorithms read them without a Redis key format (store.keys builds keys from them)."""

from __future__ import annotations

ENTITY_NODE, PASSAGE_NODE, TYPE_NODE = "e:", "p:", "t:"


def entity_node(entity_id: str) -> str:
    return ENTITY_NODE + entity_id


def passage_node(passage_id: str) -> str:
    return PASSAGE_NODE + passage_id


def type_node(entity_type: str) -> str:
    return TYPE_NODE + entity_type


def node_kind(node: str) -> str | None:
    """ "entity", "passage" or "type": what a graph node name stands for (None: no known kind)."""
    for prefix, kind in _NODE_KINDS:
        if node.startswith(prefix):
            return kind
    return None


_NODE_KINDS = ((ENTITY_NODE, "entity"), (PASSAGE_NODE, "passage"), (TYPE_NODE, "type"))


def node_id(node: str) -> str:
    """The entity id, passage id or type behind a node name."""
    return node[2:]
