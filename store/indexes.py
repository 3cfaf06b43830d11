"""The vector indexes of the memory layers, declared as redisvl schemas (one per layer and
tenant: a tenant's index only ever sees its own keys). FLAT by default: below ~50k vectors it
loads far faster than HNSW at the same query latency (DESIGN §4); HNSW keeps KNN time flat for
larger tenants. The algorithm is fixed when a tenant's index is created."""

from redisvl.schema import IndexSchema

from store.keys import TenantKeys
from store.lexical import LEXICAL_FIELD

LEXICAL_TEXT_FIELD = {"name": LEXICAL_FIELD, "type": "text", "attrs": {"no_stem": True}}

# layer → its filterable fields besides the vector
_LAYER_FIELDS = {
    # the lexical leg: BM25 over the passage's terms, stemmed and stopped already (store.lexical)
    "passages": [{"name": "doc_id", "type": "tag"}, LEXICAL_TEXT_FIELD],
    "facts": [
        {"name": "status", "type": "tag"},
        {"name": "category", "type": "tag"},
        {"name": "head_id", "type": "tag"},
        {"name": "tail_id", "type": "tag"},
    ],
    "entities": [{"name": "type", "type": "tag"}],
    "schemas": [{"name": "status", "type": "tag"}],
}


ALGORITHMS = ("flat", "hnsw")

# How long a writer trusts that a tenant's indexes exist before checking again: Redis may
# restart empty under a running worker, and a writer that never queries would not notice.
INDEX_RECHECK_S = 10.0

# the wordings RediSearch versions use for an index that does not exist
_MISSING_INDEX = ("no such index", "unknown index name")


def index_missing(exc: BaseException) -> bool:
    """Whether a search error says the index does not exist (dropped, or Redis restarted
    empty). Reads the Redis error under redisvl's wrapper: the wrapper's message also holds
    the index name."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return any(wording in str(cause).lower() for wording in _MISSING_INDEX)


def layer_schema(keys: TenantKeys, layer: str, dims: int, algorithm: str = "flat") -> IndexSchema:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"vector index algorithm {algorithm!r}: expected flat or hnsw")
    return IndexSchema.from_dict(
        {
            # no stop words: the lexical terms are final (store.lexical); no other field is TEXT
            "index": {"name": keys.index_name(layer), "prefix": keys.prefix(layer), "storage_type": "hash", "stopwords": []},
            "fields": _LAYER_FIELDS[layer]
            + [
                {
                    "name": "vec",
                    "type": "vector",
                    "attrs": {"dims": dims, "algorithm": algorithm, "distance_metric": "cosine", "datatype": "float32"},
                }
            ],
        }
    )
