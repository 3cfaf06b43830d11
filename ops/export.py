"""`memstream export`: a tenant's whole memory in a canonical, sorted form — JSON (for
comparing memories and moving them into other GraphRAG frameworks) or GraphML."""

from __future__ import annotations

import asyncio
import re
from typing import overload
from xml.etree import ElementTree as ET

from store import Memory
from store.base import MemoryStore
from store.nodes import entity_node, node_id, node_kind
from workers.query.graph_cache import load_whole
from workers.settings import Settings

# Characters XML 1.0 does not allow (control characters but tab, newline and carriage return; lone
# surrogates; U+FFFE, U+FFFF): one of them anywhere makes the whole document unreadable.
_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# GraphML node type by node kind; looked up with node_kind(), None for a name of no known kind
_NODE_TYPES: dict[str | None, str] = {"entity": "ENTITY", "passage": "PASSAGE", "type": "TYPE"}

FACT_FIELDS = (
    "head",
    "relation",
    "tail",
    "head_id",
    "tail_id",
    "head_type",
    "tail_type",
    "schema_id",
    "status",
    "category",
    "valid_from",
    "valid_to",
    "valid_at",
    "invalid_at",
    "created_at",
    "activated_at",
    "expired_at",
    "merged_into",
    "reason",
)


def export_tenant(settings: Settings, tenant: str) -> tuple[dict, bool]:
    """The tenant's export, and whether anything was ever indexed for it (an unknown tenant's
    export is empty, as a misspelt one's is: the CLI warns)."""
    return asyncio.run(_export(settings, tenant))


async def _export(settings: Settings, tenant: str) -> tuple[dict, bool]:
    memory = Memory.from_url(settings.redis_url)
    try:
        return await export_memory(memory, tenant), await memory.tenant_known(tenant)
    finally:
        await memory.close()


async def export_memory(memory: MemoryStore, tenant: str) -> dict:
    """The export of a tenant of any store (store.base.MemoryStore): Redis's Memory, or the
    in-memory store the tests compare it with."""
    schemas = [
        {
            "id": sid,
            "head_type": row.get("head_type"),
            "relation": row.get("relation"),
            "tail_type": row.get("tail_type"),
            "frequency": int(row.get("frequency", 0)),
            "status": row.get("status"),
        }
        for sid, row in await memory.records(tenant, "schemas")
    ]
    fact_ids = await memory.scan_ids(tenant, "facts")
    facts = []
    for fact in await memory.facts(tenant, fact_ids):
        if fact is not None:
            record = fact.to_json()
            facts.append(
                {
                    "id": fact.id,
                    **{k: (record[k] if record[k] not in ("", None) else None) for k in FACT_FIELDS},
                    "qualifiers": fact.qualifiers,
                    "passages": fact.passage_ids,
                }
            )
    entities = [
        {"id": eid, "name": row.get("name"), "type": row.get("type")}
        for eid, row in await memory.records(tenant, "entities")
    ]
    # the graph as the query worker reads it (type edges 1/|type|), with every change since its load
    graph = await load_whole(memory, tenant)
    edges = []
    for a, b, kind, weight in graph.graph.edge_weights():
        source, target = sorted((a, b))
        edges.append({"source": source, "target": target, "kind": kind, "weight": round(weight, 6)})
    edges.sort(key=lambda e: (e["source"], e["target"], e["kind"]))
    return {
        "tenant": tenant,
        "graph_version": await memory.graph_version(tenant),
        "schemas": schemas,
        "facts": facts,
        "entities": entities,
        "edges": edges,
    }


@overload
def xml_text(value: str) -> str: ...
@overload
def xml_text(value: None) -> None: ...
@overload
def xml_text(value: str | None) -> str | None: ...
def xml_text(value: str | None) -> str | None:
    """Text XML 1.0 can hold: each disallowed character becomes U+FFFD. Records refuse them on
    the way in, but a memory written before that (or by hand) may still hold one."""
    return None if value is None else _NOT_XML.sub("\ufffd", value)


def to_graphml(export: dict) -> str:
    """Entities, passages and types as nodes; every edge with its kind and weight. Every string
    goes through xml_text, so the output is always well-formed XML."""
    ns = "http://graphml.graphdrawing.org/xmlns"
    ET.register_namespace("", ns)
    root = ET.Element(f"{{{ns}}}graphml")
    for key_id, target, name, kind in (
        ("d0", "node", "name", "string"),
        ("d1", "node", "type", "string"),
        ("d2", "edge", "kind", "string"),
        ("d3", "edge", "weight", "double"),
    ):
        # one attrib dict: "for" and "attr.name" cannot be keyword arguments
        ET.SubElement(root, f"{{{ns}}}key", {"id": key_id, "for": target, "attr.name": name, "attr.type": kind})
    graph = ET.SubElement(root, f"{{{ns}}}graph", id=xml_text(export["tenant"]), edgedefault="undirected")
    nodes = {entity_node(e["id"]): (e["name"], e["type"]) for e in export["entities"]}
    for edge in export["edges"]:
        for node in (edge["source"], edge["target"]):
            nodes.setdefault(node, (node_id(node), _NODE_TYPES.get(node_kind(node), "NODE")))
    for name in sorted(nodes):
        element = ET.SubElement(graph, f"{{{ns}}}node", id=xml_text(name))
        ET.SubElement(element, f"{{{ns}}}data", key="d0").text = xml_text(nodes[name][0])
        ET.SubElement(element, f"{{{ns}}}data", key="d1").text = xml_text(nodes[name][1])
    for i, edge in enumerate(export["edges"]):
        element = ET.SubElement(
            graph, f"{{{ns}}}edge", id=f"x{i}", source=xml_text(edge["source"]), target=xml_text(edge["target"])
        )
        ET.SubElement(element, f"{{{ns}}}data", key="d2").text = xml_text(edge["kind"])
        ET.SubElement(element, f"{{{ns}}}data", key="d3").text = repr(edge["weight"])
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
