"""Topic names. A namespace (default `memstream`) lets several deployments, or test runs,
share one Kafka cluster without reading each other's topics."""

from dataclasses import dataclass

TOPIC_SUFFIXES = ("documents", "chunks", "candidate-facts", "conflict-sets", "indexed-facts", "dlq")


@dataclass(frozen=True)
class Topics:
    namespace: str = "memstream"

    def _name(self, suffix: str) -> str:
        return f"{self.namespace}.{suffix}"

    @property
    def documents(self) -> str:
        return self._name("documents")

    @property
    def chunks(self) -> str:
        return self._name("chunks")

    @property
    def candidate_facts(self) -> str:
        return self._name("candidate-facts")

    @property
    def conflict_sets(self) -> str:
        return self._name("conflict-sets")

    @property
    def indexed_facts(self) -> str:
        return self._name("indexed-facts")

    @property
    def dlq(self) -> str:
        return self._name("dlq")

    def all(self) -> list[str]:
        return [self._name(s) for s in TOPIC_SUFFIXES]
