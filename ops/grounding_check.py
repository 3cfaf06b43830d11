"""How much of an extraction its passages ground (workers.algorithms.grounding), on the shared
QA samples: the rules extractor on every set, and the recorded OpenIE of a set that has one (the
`replay` extractor's input). Prints, per extractor and set, the facts and entities, what would
be dropped (by reason) and demoted.

    python -m ops.grounding_check [--data ../shared/data] [--sets musique hotpotqa]
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from ops.bench.datasets import load_dataset
from workers.algorithms.grounding import Passage, ground
from workers.algorithms.normalize import content_hash
from workers.models.extraction import ReplayExtractor, RulesExtractor


def check(extractions) -> dict:
    """extractions: (passage text, Extraction) pairs → the counts."""
    facts = entities = demoted = 0
    dropped: Counter = Counter()
    for text, extraction in extractions:
        result = ground(extraction.facts, extraction.entities, Passage.of(text))
        facts, entities, demoted = (
            facts + len(extraction.facts),
            entities + len(extraction.entities),
            demoted + len(result.demoted),
        )
        dropped.update(f"fact {reason}" for _, reason in result.dropped)
        dropped.update(f"entity {reason}" for _, reason in result.dropped_entities)
    return {"facts": facts, "entities": entities, "dropped": dict(sorted(dropped.items())), "demoted": demoted}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data")
    parser.add_argument("--sets", nargs="+", default=["musique", "hotpotqa"])
    args = parser.parse_args(argv)
    for name in args.sets:
        dataset = load_dataset(name, args.data)
        rules = RulesExtractor()
        print(f"{name} rules:", check((text, rules.extract_sync(text)) for text in dataset.passages))
        if dataset.openie_file:
            replay = ReplayExtractor(dataset.openie_file)
            recorded = (
                (text, replay.by_sha[content_hash(text)])
                for text in dataset.passages
                if content_hash(text) in replay.by_sha
            )
            counts = check(recorded)
            lost = sum(n for reason, n in counts["dropped"].items() if reason.startswith("fact"))
            print(f"{name} openie: {counts} — {lost / max(counts['facts'], 1):.1%} of the facts dropped")


if __name__ == "__main__":
    main()
