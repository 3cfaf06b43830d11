"""GraphML export: every entity, passage and type node and every edge with kind and weight."""

from xml.etree import ElementTree as ET

from ops.export import to_graphml

NS = {"g": "http://graphml.graphdrawing.org/xmlns"}


def test_graphml_has_nodes_and_weighted_edges():
    memory = {
        "tenant": "acme",
        "graph_version": 3,
        "schemas": [],
        "facts": [],
        "entities": [{"id": "ada", "name": "Ada", "type": "PERSON"}, {"id": "notes", "name": "Notes", "type": "WORK"}],
        "edges": [
            {"source": "e:ada", "target": "e:notes", "kind": "fact", "weight": 1.0},
            {"source": "e:ada", "target": "p:abc", "kind": "passage", "weight": 1.0},
            {"source": "e:ada", "target": "t:PERSON", "kind": "type", "weight": 0.5},
        ],
    }
    root = ET.fromstring(to_graphml(memory))
    graph = root.find("g:graph", NS)
    nodes = {n.get("id"): [d.text for d in n.findall("g:data", NS)] for n in graph.findall("g:node", NS)}
    assert nodes == {
        "e:ada": ["Ada", "PERSON"],
        "e:notes": ["Notes", "WORK"],
        "p:abc": ["abc", "PASSAGE"],
        "t:PERSON": ["PERSON", "TYPE"],
    }
    edges = [
        (e.get("source"), e.get("target"), *[d.text for d in e.findall("g:data", NS)])
        for e in graph.findall("g:edge", NS)
    ]
    assert ("e:ada", "t:PERSON", "type", "0.5") in edges and len(edges) == 3
