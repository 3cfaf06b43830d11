"""The chaos test's corpus: blocks of one-chunk documents whose scripted extractions exercise
every kind of conflict the resolver handles, under the τ gate.

Each block holds five people. Wave 1 states one value per (person, relation) plus a second,
identical passage for one fact (duplicate → merged); wave 2, published once wave 1 is indexed,
adds what conflicts with wave 1:

- mutual exclusion: P0 born in another city, one passage against two → that one is invalidated;
- temporal: P0 led a second company in a later, non-overlapping span → both qualified;
- granularity: P1 lives in the region that contains their town → both qualified by scope;
- symmetric swap: "P3 married P2" against "P2 married P3" → merged into the older fact;
- near duplicate: "P4 constructed L" against "P4 built L" (cosine 0.96) → merged;
- duplicate: a second passage for "P2 born in C" → merged (union of provenance).

Only one person in five has two values of a relation, so every relation stays single-valued
(policy.is_multi_valued) whatever the arrival order. Within a wave nothing depends on arrival
order; across waves the order is fixed, so an undisturbed run and a disrupted one must end in
the same memory. Schemas recur across blocks (τ = 2 promotes their pending facts, in wave 1
and, for PERSON–live in–REGION and 'write', in wave 2); 'paint' is seen once and stays pending.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FIRST = [
    "Ines",
    "Oren",
    "Tove",
    "Bram",
    "Lena",
    "Milo",
    "Saga",
    "Ravi",
    "Nora",
    "Ugo",
    "Edda",
    "Kai",
    "Astrid",
    "Birgit",
    "Casimir",
    "Dagny",
    "Eskil",
    "Freya",
    "Gunnar",
    "Hedda",
    "Ivar",
    "Jorunn",
    "Leif",
    "Marit",
    "Odd",
]
LAST = [
    "Falk",
    "Pike",
    "Okafor",
    "Reed",
    "Marrow",
    "Lindqvist",
    "Haugen",
    "Brenner",
    "Castell",
    "Dunmore",
    "Ekdahl",
    "Fairweather",
    "Grimsby",
    "Holloway",
    "Ingram",
    "Jessop",
    "Kettering",
    "Lockhart",
    "Mortimer",
    "Norcott",
    "Ormsby",
    "Pellow",
    "Quennell",
    "Rathbone",
    "Sallow",
]
CITIES = [
    "Bergen",
    "Oslo",
    "Tromso",
    "Narvik",
    "Lisbon",
    "Porto",
    "Ghent",
    "Bruges",
    "Lyon",
    "Nantes",
    "Turin",
    "Genoa",
    "Krakow",
    "Gdansk",
    "Tartu",
    "Riga",
    "Aarhus",
    "Odense",
    "Malmo",
    "Uppsala",
    "Cork",
    "Galway",
    "Leeds",
    "York",
    "Bilbao",
    "Seville",
    "Graz",
    "Linz",
    "Basel",
    "Bern",
]
TOWNS = [
    "Kestrel Point",
    "Brightwater",
    "Port Selka",
    "Calder Bay",
    "Ostra Haven",
    "Merrow Ford",
    "Halden Cross",
    "Ashby Mill",
    "Thornwick",
    "Colbeck",
    "Fennimore",
    "Gullhaven",
    "Harrowgate",
    "Ivybridge",
    "Juniper Hollow",
    "Kingsmere",
    "Larkspur",
    "Mossgiel",
    "Netherby",
    "Oakhurst",
    "Penmarch",
    "Quarrendon",
    "Rushmere",
    "Saltcote",
    "Tarrant",
    "Upwey",
    "Vellacott",
    "Wrexford",
    "Yarrowby",
    "Zennor",
]
REGIONS = [
    "Norland",
    "Westmark",
    "Eastvale",
    "Southreach",
    "Highmoor",
    "Lowfen",
    "Greywold",
    "Redcliffe",
    "Silverdale",
    "Blackmere",
    "Goldshire",
    "Whitestrand",
    "Greenhithe",
    "Bluewater Reach",
    "Ambervale",
]
COMPANY_A = [
    "Dunmore",
    "Pellow",
    "Harbor",
    "Crag",
    "Lantern",
    "Willow",
    "Saltmarsh",
    "Ironbridge",
    "Copperfield",
    "Juniper",
    "Northgate",
    "Foxglove",
    "Blackthorn",
    "Kingfisher",
    "Heron",
]
COMPANY_B = [
    "Cider",
    "Farms",
    "Ropeworks",
    "Shipyards",
    "Mills",
    "Press",
    "Brewery",
    "Foundry",
    "Textiles",
    "Canning",
    "Glassworks",
    "Tannery",
    "Dairy",
    "Lumber",
    "Salt Company",
]
LANDMARKS = [
    "Varn Lighthouse",
    "Carrick Tower",
    "Esk Viaduct",
    "Morrow Chapel",
    "Sable Bridge",
    "Tanner Observatory",
    "Gale Fort",
    "Hollin Aqueduct",
    "Brae Windmill",
    "Cobb Harbour Wall",
    "Drey Clocktower",
    "Fell Beacon",
    "Garth Lock",
    "Hythe Pier",
    "Ince Granary",
]
BLOCK_DOCS = 15  # 9 in wave 1, 6 in wave 2


@dataclass(frozen=True)
class Doc:
    doc_id: str
    text: str
    facts: tuple[dict, ...]
    wave: int


def fact(head, head_type, relation, tail, tail_type, valid_from=None, valid_to=None) -> dict:
    return {
        "head": head,
        "head_type": head_type,
        "relation": relation,
        "tail": tail,
        "tail_type": tail_type,
        "category": "DECLARATIVE",
        "valid_from": valid_from,
        "valid_to": valid_to,
    }


def person(i: int) -> str:
    # (i % 25, (i // 25 + i) % 25) is one-to-one for i < 625, and neighbours differ in both names
    return f"{FIRST[i % 25]} {LAST[(i // 25 + i) % 25]}"


def company(i: int) -> str:
    return f"{COMPANY_A[i % 15]} {COMPANY_B[(i // 15 + 2 * i) % 15]}"


def block(b: int) -> list[Doc]:
    p = [person(5 * b + k) for k in range(5)]
    city = [CITIES[(5 * b + k) % 30] for k in range(5)]
    other_city = CITIES[(5 * b + 13) % 30]  # never one of this block's five
    town = [TOWNS[(b + 7 * k) % 30] for k in range(5)]
    region, landmark = REGIONS[b % 15], LANDMARKS[b % 15]
    led = [company(6 * b + k) for k in range(6)]
    d = f"b{b:02d}"
    wave1 = [
        Doc(
            f"{d}-bio{k}",
            f"{p[k]} was born in {city[k]}. {p[k]} lives in {town[k]}. {p[k]} led {led[k]}"
            + (" from 1990 to 1999." if k == 0 else "."),
            (
                fact(p[k], "PERSON", "born in", city[k], "CITY"),
                fact(p[k], "PERSON", "lives in", town[k], "PLACE"),
                fact(p[k], "PERSON", "led", led[k], "COMPANY", *(("1990", "1999") if k == 0 else ())),
            ),
            1,
        )
        for k in range(5)
    ] + [
        Doc(
            f"{d}-parish",
            f"Parish records confirm {p[0]} was born in {city[0]}.",
            (fact(p[0], "PERSON", "born in", city[0], "CITY"),),
            1,
        ),
        Doc(
            f"{d}-geo",
            f"{town[1]} is located in {region}.",
            (fact(town[1], "PLACE", "located in", region, "REGION"),),
            1,
        ),
        Doc(f"{d}-wed", f"{p[2]} married {p[3]}.", (fact(p[2], "PERSON", "married", p[3], "PERSON"),), 1),
        Doc(f"{d}-built", f"{p[4]} built the {landmark}.", (fact(p[4], "PERSON", "built", landmark, "LANDMARK"),), 1),
    ]
    wave2 = [
        Doc(
            f"{d}-letter",
            f"{p[0]} was born in {other_city}, an old letter claims.",
            (fact(p[0], "PERSON", "born in", other_city, "CITY"),),
            2,
        ),
        Doc(
            f"{d}-later",
            f"{p[0]} led {led[5]} from 2000 to 2010.",
            (fact(p[0], "PERSON", "led", led[5], "COMPANY", "2000", "2010"),),
            2,
        ),
        Doc(
            f"{d}-region",
            f"{p[1]} lives in {region}, by the coast.",
            (fact(p[1], "PERSON", "lives in", region, "REGION"),),
            2,
        ),
        Doc(f"{d}-swap", f"{p[3]} married {p[2]} in June.", (fact(p[3], "PERSON", "married", p[2], "PERSON"),), 2),
        Doc(
            f"{d}-constructed",
            f"{p[4]} constructed the {landmark}.",
            (fact(p[4], "PERSON", "constructed", landmark, "LANDMARK"),),
            2,
        ),
        Doc(
            f"{d}-records",
            f"{p[2]} was born in {city[2]}, the records say.",
            (fact(p[2], "PERSON", "born in", city[2], "CITY"),),
            2,
        ),
    ]
    return wave1 + wave2


def corpus(min_docs: int) -> list[Doc]:
    """At least `min_docs` documents (and at least two blocks, so every schema recurs)."""
    blocks = max(2, -(-max(min_docs - 3, 0) // BLOCK_DOCS))
    if blocks > 15:
        raise ValueError(
            f"the chaos corpus has names for 15 blocks ({15 * BLOCK_DOCS + 3} documents); {min_docs} asked"
        )
    docs = [doc for b in range(blocks) for doc in block(b)]
    a, b = person(0), person(5)
    docs += [
        Doc(
            "lone-paint", f"{a} painted The Grey Quay.", (fact(a, "PERSON", "painted", "The Grey Quay", "ARTWORK"),), 1
        ),
        Doc("book-1", f"{a} wrote The Salt Road.", (fact(a, "PERSON", "wrote", "The Salt Road", "BOOK"),), 1),
        Doc("book-2", f"{b} wrote Winter Harbour.", (fact(b, "PERSON", "wrote", "Winter Harbour", "BOOK"),), 2),
    ]
    return docs


def extraction(doc: Doc) -> str:
    """The fake LLM's answer for a document's text: its scripted entities and facts."""
    entities = sorted(
        {(f["head"], f["head_type"]) for f in doc.facts} | {(f["tail"], f["tail_type"]) for f in doc.facts}
    )
    return json.dumps({"entities": [{"name": n, "type": t} for n, t in entities], "facts": list(doc.facts)})
