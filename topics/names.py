"""Topic names. A namespace (default `memstream`) lets several deployments, or test runs,
share one Kafka cluster without reading each other's topics. The suffixes are the records'
TOPIC, in the stage graph's order (topics.graph)."""

from dataclasses import dataclass

from topics.graph import TOPIC_SUFFIXES
from topics.records import CandidateFact, Chunk, ConflictSet, DeadLetter, Document, FactEvent

__all__ = ["TOPIC_SUFFIXES", "Topics"]


@dataclass(frozen=True)
class Topics:
    namespace: str = "memstream"

    def _name(self, suffix: str) -> str:
        return f"{self.namespace}.{suffix}"

    @property
    def documents(self) -> str:
        return self._name(Document.TOPIC)

    @property
    def chunks(self) -> str:
        return self._name(Chunk.TOPIC)

    @property
    def candidate_facts(self) -> str:
        return self._name(CandidateFact.TOPIC)

    @property
    def conflict_sets(self) -> str:
        return self._name(ConflictSet.TOPIC)

    @property
    def indexed_facts(self) -> str:
        return self._name(FactEvent.TOPIC)

    @property
    def dlq(self) -> str:
        return self._name(DeadLetter.TOPIC)

    def all(self) -> list[str]:
        return [self._name(s) for s in TOPIC_SUFFIXES]
