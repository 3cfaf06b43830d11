import asyncio
import json
from pathlib import Path

import pytest

from workers.algorithms.normalize import content_hash
from workers.models.extraction import ReplayExtractor, RulesExtractor, make_extractor, type_of

OPENIE = (
    Path(__file__).resolve().parents[2]
    / "shared/data/musique_train_100/openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"
)


def test_rules_extractor_is_deterministic_and_entity_centric():
    text = "Captain Ilse Marrow built the Varn Lighthouse in 1871. The Varn Lighthouse stands on Kestrel Point."
    first = RulesExtractor().extract_sync(text)
    assert first == RulesExtractor().extract_sync(text)
    names = {e.name: e.type for e in first.entities}
    assert names == {
        "Captain Ilse Marrow": "PERSON",
        "Varn Lighthouse": "ENTITY",
        "1871": "DATE",
        "Kestrel Point": "ENTITY",
    }
    triples = {(f.head, f.relation, f.tail) for f in first.facts}
    assert ("Captain Ilse Marrow", "build", "Varn Lighthouse") in triples
    assert ("Varn Lighthouse", "stand on", "Kestrel Point") in triples


def test_typer():
    assert type_of("1999") == "DATE"
    assert type_of("University of Oslo") == "ORGANIZATION"
    assert type_of("Rhine River") == "LOCATION"
    assert type_of("Dr Ada Byron") == "PERSON"
    assert type_of("Zephyr") == "ENTITY"


def test_replay_extractor_returns_exactly_the_script(tmp_path):
    text = "Ada wrote Notes."
    line = {
        "text_sha256": content_hash(text),
        "entities": [{"name": "Ada", "type": "PERSON"}],
        "facts": [
            {
                "head": "Ada",
                "head_type": "PERSON",
                "relation": "wrote",
                "tail": "Notes",
                "tail_type": "WORK",
                "category": "DECLARATIVE",
                "valid_from": None,
                "valid_to": None,
            }
        ],
    }
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(line) + "\n\n")
    ex = make_extractor("replay", str(path))
    result = asyncio.run(ex.extract(text))
    assert [(f.head, f.relation, f.tail, f.tail_type) for f in result.facts] == [("Ada", "wrote", "Notes", "WORK")]
    assert asyncio.run(ex.extract("unknown text")).facts == []


def test_replay_file_errors_point_at_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"text_sha256": "x", "facts": [{"head": "a"}]}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:1: bad replay line: .*missing required field 'relation'"):
        ReplayExtractor(path)
    with pytest.raises(FileNotFoundError):
        ReplayExtractor(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="needs MEMSTREAM_REPLAY_FILE"):
        make_extractor("replay", "")


@pytest.mark.skipif(not OPENIE.exists(), reason="shared MuSiQue data not present")
def test_replay_reads_hipporag_openie_keyed_by_passage_text():
    ex = ReplayExtractor(OPENIE)
    assert len(ex.by_sha) >= 1880
    doc = json.loads(OPENIE.read_text())["docs"][0]
    result = asyncio.run(ex.extract(doc["passage"]))
    expected = [t for t in doc["extracted_triples"] if len(t) == 3]
    assert [(f.head, f.relation, f.tail) for f in result.facts] == [tuple(t) for t in expected]
    assert all(f.head_type == type_of(f.head) for f in result.facts)


def test_rules_extractor_takes_no_opening_words_or_first_person_for_names():
    """Turns open with "It's", "Wow Caroline", "Thanks, Mel", "I'm": none is an entity (they
    were the tenant's largest hubs on LoCoMo: "It's" in 70 of 419 turns), the name after an
    opener is; a capitalised common word inside a sentence stays a name."""
    rules = RulesExtractor()
    names = lambda text: [e.name for e in rules.extract_sync(text, "Melanie (8 May 2023):").entities]  # noqa: E731
    assert names("It's so nice. I'm going to Paris with Caroline.") == ["Paris", "Caroline"]
    assert names("Wow Caroline, that is great!") == ["Caroline"]
    assert names("Thanks, Mel! My dog Biscuit loves the LGBTQ center.") == ["Mel", "Biscuit", "LGBTQ"]
    assert names("What did you do in May?") == ["May"]
    # Wikipedia sentences keep names that open with a common word
    assert names("New York is the largest city in the United States.") == ["New York", "United States"]
    assert names("Grace Hopper invented COBOL.") == ["Grace Hopper", "COBOL"]


def test_passive_and_active_voice_of_a_making_verb_are_one_relation_and_conflict():
    """ "X was designed by Y" and "Z designed X": one relation, (X, designed by, …), so two
    designers of one lighthouse are a conflict (before: "designed by" and "design" were two
    relations, both facts active)."""
    from tests.inprocess import InProcess

    async def main():
        stages = InProcess(None, RulesExtractor(), tau=1)
        try:
            await stages.publish("d1", "The Varn Lighthouse was designed by Ada Holm.")
            await stages.publish("d2", "Pieter Brandt designed the Varn Lighthouse.")
            return (await stages.export())["facts"], [e["event"] for e in stages.events()]
        finally:
            await stages.close()

    facts, events = asyncio.run(main())
    assert {(f["head"], f["relation"], f["tail"]) for f in facts} == {
        ("Varn Lighthouse", "designed by", "Ada Holm"),
        ("Varn Lighthouse", "designed by", "Pieter Brandt"),
    }
    assert sorted(f["status"] for f in facts) == ["active", "invalid"] and "invalidated" in events


def test_canonical_fact_turns_a_making_verb_passive_and_leaves_others():
    from topics.records import Triple
    from workers.algorithms.normalize import canonical_fact

    built = canonical_fact(
        Triple(head="Ada Holm", relation="built", tail="Varn Lighthouse", head_type="PERSON", tail_type="LOCATION")
    )
    assert (built.head, built.relation, built.tail, built.head_type, built.tail_type) == (
        "Varn Lighthouse",
        "built by",
        "Ada Holm",
        "LOCATION",
        "PERSON",
    )
    lives = canonical_fact(Triple(head="Ada Holm", relation="lives in", tail="Brest"))
    assert (lives.head, lives.relation, lives.tail) == ("Ada Holm", "live in", "Brest")
    found = canonical_fact(Triple(head="I", relation="found", tail="keys"))  # "found" may be "find": left alone
    assert (found.head, found.relation) == ("I", "found")
