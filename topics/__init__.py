"""The message contract: topic names, versioned JSON records, validation, keys.

Every record is a JSON object carrying `v` (schema version) and `tenant`. Producers in any
language can publish to these topics by following docs/usage.md ("Publishing from your own producer"); this module is the
single place that decides what a valid message is.
"""

from topics.contract import BadInput
from topics.names import TOPIC_SUFFIXES, Topics
from topics.records import (
    SCHEMA_VERSION,
    CandidateFact,
    Chunk,
    ConflictSet,
    ContractError,
    DeadLetter,
    Document,
    DocumentDeletion,
    FactEvent,
    Record,
    decode,
    document_key,
    encode,
    parse_json,
    tenant_or_default,
    validate_tenant,
)

__all__ = [
    "SCHEMA_VERSION",
    "BadInput",
    "CandidateFact",
    "Chunk",
    "ConflictSet",
    "ContractError",
    "DeadLetter",
    "Document",
    "DocumentDeletion",
    "FactEvent",
    "Record",
    "TOPIC_SUFFIXES",
    "Topics",
    "decode",
    "document_key",
    "encode",
    "parse_json",
    "tenant_or_default",
    "validate_tenant",
]
