"""The vector indexes of the memory layers, declared as redisvl schemas: one per layer and vector
size, shared by every tenant, each record tagged with its tenant (TENANT_FIELD).

Shared, not per tenant: RediSearch allocates vectors in blocks of 1,024 and runs a GC timer per
index, so four indexes per tenant cost ~7.8 MB of Redis and an idle core at a few hundred
tenants (`memstream bench tenants` measures both). A search reaches an index only through
TenantIndex, which ANDs the tenant's tag into every query it sends: no caller can forget it.
For a small tenant the query engine computes distances over the tag's few records only
(ad-hoc brute force), so its latency does not grow with the other tenants.

One index per vector size rather than per embedder name: a tenant's records all come from the
embedder recorded for it (Memory.claim_embedder) and every search is filtered on the tenant,
so two embedders of one size never meet in an answer. Records whose vectors have another size
fail to index there (RediSearch counts them in hash_indexing_failures and stores nothing).

Vectors are float16 (store.records.vector_bytes; the index name ends in `:f16`): each is held
twice, in its record and in the index's copy, and a float32 pair was most of a tenant's memory.
`memstream migrate` re-encodes the records of the float32 indexes from before and drops them.

FLAT by default: below ~50k vectors per tenant it loads far faster than HNSW at the same query
latency (docs/architecture.md §4); HNSW keeps KNN time flat for larger memories. The algorithm is fixed when
the shared index is created."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Mapping, NamedTuple

from redis.commands.search.aggregation import AggregateRequest
from redis.commands.search.query import Query
from redisvl.index import AsyncSearchIndex
from redisvl.query.filter import FilterExpression, Tag
from redisvl.schema import IndexSchema

from store.keys import TenantKeys, layer_prefix, shared_index_name
from store.lexical import LEXICAL_FIELD, LEXICAL_LENGTH_FIELD
from store.records import ENTITIES_FIELD, TENANT_FIELD, VECTOR_TYPE
from store.redis import connection as redis_connection

LEXICAL_TEXT_FIELD = {"name": LEXICAL_FIELD, "type": "text", "attrs": {"no_stem": True}}

# layer → its filterable fields besides the tenant and the vector (redisvl field specs, JSON-like)
_LAYER_FIELDS: dict[str, list[dict[str, Any]]] = {
    # the lexical leg: BM25 over the passage's terms, stemmed and stopped already (store.lexical);
    # their count sortable, so a tenant's average length is summed from the index alone
    "passages": [
        {"name": "doc_id", "type": "tag"},
        LEXICAL_TEXT_FIELD,
        {"name": LEXICAL_LENGTH_FIELD, "type": "numeric", "attrs": {"sortable": True}},
    ],
    "facts": [
        {"name": "status", "type": "tag", "attrs": {"sortable": True}},
        {"name": "category", "type": "tag"},
        {"name": "head_id", "type": "tag"},
        {"name": "tail_id", "type": "tag"},
    ],
    "entities": [{"name": "type", "type": "tag"}],
    "schemas": [{"name": "status", "type": "tag"}],
}


ALGORITHMS = ("flat", "hnsw")

# How long a writer trusts that the shared indexes exist before checking again: Redis may
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


def layer_schema(layer: str, dims: int, algorithm: str = "flat", shard_tag: str | None = None) -> IndexSchema:
    """The shared index of a layer's records with `dims`-sized vectors, every tenant's (on a
    Redis Cluster, every tenant's of the shard whose `shard_tag` it is named with)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"vector index algorithm {algorithm!r}: expected flat or hnsw")
    return IndexSchema.from_dict(
        {
            # no stop words: the lexical terms are final (store.lexical); no other field is TEXT
            "index": {
                "name": shared_index_name(layer, dims, shard_tag),
                "prefix": layer_prefix(layer),
                "storage_type": "hash",
                "stopwords": [],
            },
            # the tenant sortable: the metrics census groups every record by it without reading a hash
            "fields": [
                {"name": TENANT_FIELD, "type": "tag", "attrs": {"sortable": True}},
                *_LAYER_FIELDS[layer],
                {
                    "name": "vec",
                    "type": "vector",
                    "attrs": {
                        "dims": dims,
                        "algorithm": algorithm,
                        "distance_metric": "cosine",
                        "datatype": VECTOR_TYPE,
                    },
                },
            ],
        }
    )


# A large tenant's own vector indexes (store.redis.vector_index): HNSW, searched at this EF_RUNTIME.
# On `bench scale`'s 50,000 passages (word-hash vectors, a hard case for HNSW) the top 10 of 50
# questions agreed with the exact FLAT search for 90.4% of hits at 100 (0.40 ms a search against
# FLAT's 2.7-3.2 ms), 97.6% at 400 (1.1 ms), 99% at 1,000 (2.5 ms).
OWN_VECTOR_EF_RUNTIME = 200
OWN_VECTOR_LAYERS = ("passages", "facts", "entities")  # schemas stay few


# A large tenant's own passages index also tags each passage with its entities: reconstruct's
# entity cue asks for the passages of an entity nearest the query in one search, exact over all
# of them, where the shared path reads the first ENTITY_PASSAGES_READ by id and their vectors
# (~920 vectors a query at 50,000 passages). Only there: a shared index's tag would cost every
# small tenant's records, and an entity of theirs is in a few passages.
OWN_PASSAGE_FIELDS: list[dict[str, Any]] = [{"name": ENTITIES_FIELD, "type": "tag", "attrs": {"separator": ","}}]
# The own vector indexes' schema, recorded with their state: a tenant promoted under an older
# one (2: the entity tag) is promoted again by a writer's check, its searches on the shared
# index (exact) meanwhile.
OWN_VECTOR_SCHEMA = 2
OWN_ENTITY_TAG_SCHEMA = 2  # the first schema whose passages index tags entities


@functools.lru_cache(maxsize=4096)  # every KNN search of a promoted tenant: building it cost ~50 us
def own_vector_schema(tenant: str, layer: str, dims: int, tagged: bool = False) -> IndexSchema:
    """A large tenant's own HNSW index of a layer: its records alone (the layer's prefix for the
    tenant), the shared index's tag fields for filters and no text (its lexical search has an
    index of its own). Over existing keys: a record written during its scan is indexed again,
    which for a vector only replaces the first (no statistics to double, unlike BM25's).
    `tagged`: named for a Redis Cluster (TenantKeys.tagged_indexes)."""
    keys = TenantKeys(tenant, tagged)
    return IndexSchema.from_dict(
        {
            "index": {
                "name": keys.vector_index_name(layer, dims),
                "prefix": keys.prefix(layer),
                "storage_type": "hash",
                "stopwords": [],
            },
            "fields": [
                *(f for f in _LAYER_FIELDS[layer] if f["type"] == "tag"),
                *(OWN_PASSAGE_FIELDS if layer == "passages" else []),
                {
                    "name": "vec",
                    "type": "vector",
                    "attrs": {
                        "dims": dims,
                        "algorithm": "hnsw",
                        "distance_metric": "cosine",
                        "datatype": VECTOR_TYPE,
                        "ef_runtime": OWN_VECTOR_EF_RUNTIME,
                    },
                },
            ],
        }
    )


def own_lexical_schema(tenant: str, generation: int = 0, tagged: bool = False) -> IndexSchema:
    """A large tenant's own lexical index (store.redis.lexical_index): the terms of its passages'
    copies and nothing else, so the query engine's BM25STD counts this tenant's statistics alone
    — its passage count (retired and erased passages too, as the shared index's tenant count
    does), their average length, each term's document frequency — and scores exactly what
    store.lexical.bm25 does. No vector, no tag: a text index of 50,000 passages answers in
    1-3 ms where moving their terms to the client took 20-900 ms. `tagged`: named for a Redis
    Cluster (TenantKeys.tagged_indexes)."""
    keys = TenantKeys(tenant, tagged)
    return IndexSchema.from_dict(
        {
            "index": {
                "name": keys.lexical_generation_index(generation),
                "prefix": keys.lexical_mirror_prefix(generation),
                "storage_type": "hash",
                "stopwords": [],
            },
            "fields": [LEXICAL_TEXT_FIELD],
        }
    )


def tenant_filter(tenant: str, where: Mapping[str, str] | None = None) -> FilterExpression:
    """The tenant's tag, and every tag field in `where` equal to its value (redisvl escapes them)."""
    expression = Tag(TENANT_FIELD) == tenant
    for field, value in (where or {}).items():
        expression = expression & (Tag(field) == value)
    return expression


def tags_filter(where: Mapping[str, str] | None) -> str:
    """Every tag field in `where` equal to its value; `*` (every record) for none."""
    return _tags_filter(tuple((where or {}).items()))


# A reconstruct walk filters ~45 searches a query on its cues' ids, ~60 of them new to the cache:
# redisvl's expression objects cost 7.2 µs a filter where the same text written here costs 1.0
# (its escaper, its syntax: tests/test_indexes_filters.py holds them equal)
@functools.lru_cache(maxsize=4096)
def _tags_filter(where: tuple[tuple[str, str], ...]) -> str:
    return _all_of(where) or "*"


@functools.lru_cache(maxsize=4096)
def _tenant_filter_text(tenant: str, where: tuple[tuple[str, str], ...]) -> str:
    return _all_of(((TENANT_FIELD, tenant), *where))


def _all_of(where: tuple[tuple[str, str], ...]) -> str:
    """`Tag(field) == value & ...` as redisvl writes it: each value escaped by its tag escaper,
    each conjunction in parentheses, left to right, an empty value no clause (redisvl's "any");
    "" for none."""
    text = ""
    for field, value in where:
        if not value:
            continue
        clause = f"@{field}:{{{_TAG_ESCAPER.escape(value)}}}"
        text = f"({text} {clause})" if text else clause
    return text


_TAG_ESCAPER = Tag.escaper  # redisvl's own, so its escaping rules and ours never differ


def _text(value):
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


def reply_rows(reply) -> tuple[int, list[tuple[str | None, dict[str, str]]]]:
    """An unparsed FT.SEARCH or FT.AGGREGATE reply (RESP2 list or RESP3 map, as the server
    speaks) as its total and its rows: (key, or None for an aggregate row; fields)."""
    if isinstance(reply, dict):
        rows = [
            (
                _text(r[b"id"]) if b"id" in r else None,
                {_text(k): _text(v) for k, v in (r.get(b"extra_attributes") or {}).items()},
            )
            for r in reply.get(b"results", [])
        ]
        return int(reply.get(b"total_results", len(rows))), rows
    total, rest = int(reply[0]), reply[1:]
    if rest and isinstance(rest[0], list):  # an aggregate: each row a flat field list
        return total, [(None, {_text(k): _text(v) for k, v in zip(row[::2], row[1::2])}) for row in rest]
    return total, [
        (_text(key), {_text(k): _text(v) for k, v in zip(fields[::2], fields[1::2])})
        for key, fields in zip(rest[::2], rest[1::2])
    ]


DISTANCE = "vector_distance"  # what a KNN search names each hit's cosine distance


class HitRead(NamedTuple):
    """A read TenantIndex.knn_each_read applies to each hit of its searches: `command` (one of
    _HIT_READS) on the hit's own key (key_prefix None) or on key_prefix + the hit's record id +
    key_suffix (another key of the record: a fact's passages set)."""

    command: str
    arguments: tuple[str, ...] = ()
    key_prefix: str | None = None
    key_suffix: str = ""


_HIT_READS = frozenset({"HGET", "HMGET", "SMEMBERS"})
FILTER_SLOT = "\0"  # _SEARCH_READ writes each search's filter here, in the KNN search's query

# ARGV: the vectors' count and the vectors; the KNN search once (its argument count, the places
# of its query and its vector among them, then TenantIndex._knn_search's arguments with
# FILTER_SLOT for the filter); the records' key prefix; the reads (their count; each: command,
# on the hit's key or not, key prefix, suffix, argument count, arguments), then which read's
# reply holds the checked field and where in it (0 0: none, an HGET checks it); the searches
# (their count; each: its vector's place among the vectors, its filter, then '0', or '1', a
# field, its value and the filter to search instead where a hit's field holds another value,
# its hits then read again). A search's
# reply beside, for each of its hits, the reads' replies. Each search sent whole, a call carried
# its vector once a search and twice where checked — a reconstruct step's fact searches were
# ~700 arguments and ~25 KB to pack, send and parse, 50,000 passages; now ~80 and one vector.
# On a Redis Cluster the index's name is a key of another slot (of the same shard) than the
# tenant's route key: allow-cross-slot-keys (tests/test_redis_cluster.py pins it).
_SEARCH_READ = """#!lua flags=no-writes,allow-cross-slot-keys
local vectors, i = {}, 2
for v = 1, tonumber(ARGV[1]) do vectors[v] = ARGV[i]; i = i + 1 end
local argc, at_query, at_vector = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
local template = {unpack(ARGV, i + 3, i + 2 + argc)}
local slot = string.find(template[at_query], '\\0', 1, true)
local before, after = string.sub(template[at_query], 1, slot - 1), string.sub(template[at_query], slot + 1)
i = i + 3 + argc
local prefix, reads = ARGV[i], {}
i = i + 2
for r = 1, tonumber(ARGV[i - 1]) do
  local n = tonumber(ARGV[i + 4])
  reads[r] = {ARGV[i], ARGV[i + 1] == '1', ARGV[i + 2], ARGV[i + 3], {unpack(ARGV, i + 5, i + 4 + n)}}
  i = i + 5 + n
end
local check_read, check_at = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
i = i + 2
local function knn(filter, vector)
  template[at_query], template[at_vector] = before .. filter .. after, vector
  return redis.call(unpack(template))
end
local function read(reply)
  local found = {}
  for h = 2, #reply, 2 do
    local key = reply[h]
    local id = string.sub(key, #prefix + 1)
    local got = {}
    for r, spec in ipairs(reads) do
      got[r] = redis.call(spec[1], spec[2] and key or (spec[3] .. id .. spec[4]), unpack(spec[5]))
    end
    found[#found + 1] = got
  end
  return found
end
local out = {}
for s = 1, tonumber(ARGV[i]) do
  local vector, filter = vectors[tonumber(ARGV[i + 1])], ARGV[i + 2]
  local reply = knn(filter, vector)
  local found = read(reply)
  if ARGV[i + 3] == '1' then
    local field, value = ARGV[i + 4], ARGV[i + 5]
    for n, got in ipairs(found) do
      local held
      if check_read > 0 then held = got[check_read][check_at] else held = redis.call('HGET', reply[2 * n], field) end
      if held ~= value then
        reply = knn(ARGV[i + 6], vector)
        found = read(reply)
        break
      end
    end
    i = i + 6
  else
    i = i + 3
  end
  out[#out + 1] = {reply, found}
end
return out
"""


# An FT.SEARCH whose RETURN fields are read from each hit's hash, on a Redis Cluster's shard
# (where the query engine returns none of them): the reply shaped as the search's own (RESP2:
# total, then each key, its score WITHSCORES, its fields). KEYS: a key of the tenant (its slot).
# ARGV: WITHSCORES or not ('1'/'0'), the field count, the fields, the search with NOCONTENT.
_SEARCH_FIELDS = """#!lua flags=no-writes,allow-cross-slot-keys
local withscores, n = ARGV[1] == '1', tonumber(ARGV[2])
local fields = {unpack(ARGV, 3, 2 + n)}
local reply = redis.call(unpack(ARGV, 3 + n, #ARGV))
local out, h = {reply[1]}, 2
while h <= #reply do
  local key = reply[h]
  out[#out + 1] = key
  if withscores then h = h + 1; out[#out + 1] = reply[h] end
  local values, row = redis.call('HMGET', key, unpack(fields)), {}
  for f = 1, n do
    if values[f] then row[#row + 1] = fields[f]; row[#row + 1] = values[f] end
  end
  out[#out + 1] = row
  h = h + 1
end
return out
"""


# _SEARCH_READ registered once a client: register_script hashes the script's source each call
_SEARCH_READ_SCRIPTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _search_read(client):
    """_SEARCH_READ registered with `client` (EVALSHA; EVAL where the server has not cached it)."""
    script = _SEARCH_READ_SCRIPTS.get(client)
    if script is None:
        script = _SEARCH_READ_SCRIPTS[client] = client.register_script(_SEARCH_READ)
    return script


async def search_with_fields(client, command: list | tuple, route_key: str | None = None):
    """Send an FT.SEARCH (its fields asked with RETURN). With `route_key` (a key of the tenant:
    a store on a Redis Cluster) the fields are read from the hits' hashes by _SEARCH_FIELDS in
    the same command, the reply shaped the same."""
    if route_key is None:
        return await client.execute_command(*command)
    words = [w.upper() if isinstance(w, str) else w for w in command]
    at = words.index("RETURN")
    count = int(command[at + 1])
    fields = list(command[at + 2 : at + 2 + count])
    searched = [*command[:at], "NOCONTENT", *command[at + 2 + count :]]
    withscores = "1" if "WITHSCORES" in words else "0"
    return await client.eval(_SEARCH_FIELDS, 1, route_key, withscores, len(fields), *fields, *searched)


class TenantIndex:
    """A layer's shared index as one tenant sees it: every query it sends is ANDed with the
    tenant's tag, and the ids it returns are the tenant's record ids. The only way the store
    searches (store.memory.Memory.searchable)."""

    def __init__(self, redis, index: AsyncSearchIndex, tenant: str, layer: str, clustered: bool = False):
        self.redis = redis
        self.index = index
        self.tenant = tenant
        self.prefix = TenantKeys(tenant).prefix(layer)
        # on a Redis Cluster's shard the query engine returns no stored field of a hit (only
        # what it computes, as a KNN distance): they are read from the records (knn_each)
        self.clustered = clustered

    @property
    def name(self) -> str:
        return self.index.name

    def query_text(self, query: str = "") -> str:
        """`query` (RediSearch syntax, dialect 2) within the tenant's records."""
        own = str(tenant_filter(self.tenant))
        return f"{own} ({query})" if query else own

    def filter(self, where: Mapping[str, str] | None = None) -> str:
        """The tenant's records whose tag fields equal every value in `where`."""
        return _tenant_filter_text(self.tenant, tuple((where or {}).items()))

    def record_id(self, key: str | bytes) -> str:
        return (key.decode() if isinstance(key, bytes) else key).removeprefix(self.prefix)

    def _knn_command(self, vector: bytes, where: Mapping[str, str] | None, k: int, return_fields: list[str]) -> tuple:
        return self._knn_search(vector, self.filter(where), k, return_fields)

    def _knn_search(self, vector: bytes, filter_text: str, k: int, return_fields: list[str]) -> tuple:
        return (
            "FT.SEARCH",
            self.name,
            f"({filter_text})=>[KNN {int(k)} @vec $vector AS {DISTANCE}]",
            "PARAMS",
            2,
            "vector",
            vector,
            "RETURN",
            len(return_fields) + 1,
            *return_fields,
            DISTANCE,
            "SORTBY",
            DISTANCE,
            "ASC",
            "LIMIT",
            0,
            int(k),
            "DIALECT",
            2,
        )

    def _knn_rows(self, reply) -> list[tuple[str, float, dict[str, str]]]:
        rows = []
        for key, fields in reply_rows(reply)[1]:
            assert key is not None  # an FT.SEARCH row has its key (only an aggregate's has none)
            rows.append((self.record_id(key), float(fields.pop(DISTANCE)), fields))
        return rows

    async def knn_each(
        self, searches: list[tuple[bytes, Mapping[str, str] | None]], k: int, return_fields: list[str]
    ) -> list[list[tuple[str, float, dict[str, str]]]]:
        """(record id, cosine distance, fields) of the `k` nearest records for each (vector, where)
        search — the tenant's records whose tag fields equal every value in `where` — nearest
        first, all searches in one round trip. Raw FT.SEARCH, not redisvl's query objects: for a
        small tenant their building and parsing cost more than the search (measured: 1.34 → 0.6
        ms p50 with 10,000 tenants in the index). On a cluster the fields come from the records,
        read by the search's script."""
        if self.clustered and return_fields:
            read = await self.knn_each_read(
                searches, k, [], [HitRead("HMGET", tuple(return_fields))], TenantKeys(self.tenant).base
            )
            return [
                [
                    (rid, distance, {f: _text(v) for f, v in zip(return_fields, got[0]) if v is not None})
                    for rid, distance, _, got in hits
                ]
                for hits in read
            ]
        commands = [self._knn_command(vector, where, k, return_fields) for vector, where in searches]
        if len(commands) == 1:  # a pipeline of one costs ~0.4 ms more than the command
            replies = [await self.redis.execute_command(*commands[0])]
        else:
            pipe = self.redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            replies = await pipe.execute()
        return [self._knn_rows(reply) for reply in replies]

    async def knn_each_read(
        self,
        searches: list[tuple[bytes, Mapping[str, str] | None]],
        k: int,
        return_fields: list[str],
        reads: list[HitRead],
        route_key: str,
        checked: str | None = None,
    ) -> list[list[tuple[str, float, dict[str, str], list]]]:
        """knn_each, each hit with the replies of `reads` applied to it, in one command
        (_SEARCH_READ): the searches run inside Redis and their records are read there, where a
        search and then a read of what it found cost two dependent round trips. `route_key`:
        a key of the tenant (one slot: the node that holds its records).

        `checked` (a tag field, e.g. "status"): where a search's filter holds it beside another
        tag (an entity's facts: head_id and status), the search leaves it out and its hits'
        field is checked instead; only if one holds another value does the whole filter's search
        run. The k nearest of the narrower set, all holding the value, are the k nearest of the
        whole filter's: the answer is the same. An intersection with a tag every record shares
        cost 14-45 µs of a 55-115 µs filtered search (a reconstruct walk's ~33 fact searches a
        query, 50,000 passages): RediSearch walks the large tag's postings beside the small one's.
        The check reads the field from what an HMGET of `reads` read of the hit's hash where it
        holds the field (else an HGET of its own); a search that fails it reads its new hits
        again: deciding on the fallback there saves the round trip a check after the reads would
        cost."""
        if not searches:
            return []
        for read in reads:
            if read.command not in _HIT_READS:
                raise ValueError(f"knn_each_read: {read.command!r} is not one of {sorted(_HIT_READS)}")
        vectors = list(dict.fromkeys(vector for vector, _ in searches))  # each sent once
        place = {vector: str(n) for n, vector in enumerate(vectors, 1)}
        template = self._knn_search(b"", FILTER_SLOT, k, return_fields)
        at_query = 1 + next(n for n, word in enumerate(template) if isinstance(word, str) and FILTER_SLOT in word)
        arguments: list = [len(vectors), *vectors, len(template), at_query, 1 + template.index(b""), *template]
        arguments += [self.prefix, len(reads)]
        for read in reads:
            arguments += [read.command, int(read.key_prefix is None), read.key_prefix or "", read.key_suffix]
            arguments += [len(read.arguments), *read.arguments]
        # the checked field read with the hit's fields where an HMGET of its hash reads it: a
        # lookup of the hash less a hit (an HGET of its own was ~130 a query, 2-8 us each at
        # 200,000 passages)
        arguments += next(
            (
                [r, read.arguments.index(checked) + 1]
                for r, read in enumerate(reads, 1)
                if read.command == "HMGET" and read.key_prefix is None and checked in read.arguments
            ),
            [0, 0],
        )
        arguments.append(len(searches))
        for vector, where in searches:
            if checked is not None and where and checked in where and len(where) > 1:
                narrower = {f: v for f, v in where.items() if f != checked}
                arguments += [place[vector], self.filter(narrower), "1", checked, where[checked], self.filter(where)]
            else:
                arguments += [place[vector], self.filter(where), "0"]
        replies = await redis_connection.run_script(_search_read(self.redis), [route_key], arguments)
        out = []
        for reply, found in replies:
            rows = self._knn_rows(reply)
            out.append([(rid, distance, fields, got) for (rid, distance, fields), got in zip(rows, found)])
        return out

    async def run(self, command: list | tuple):
        """A command of `command()` sent, its fields read from the records on a cluster
        (search_with_fields): the reply as the search's own."""
        if command[0] == "FT.SEARCH" and "RETURN" in command:
            return await search_with_fields(
                self.redis, command, TenantKeys(self.tenant).base if self.clustered else None
            )
        return await self.redis.execute_command(*command)

    def command(self, verb: str, query: str, *arguments) -> list:
        """A raw FT.SEARCH or FT.AGGREGATE of `query` within the tenant's records, for a pipeline
        (its reply unparsed)."""
        if verb not in ("FT.SEARCH", "FT.AGGREGATE"):
            raise ValueError(f"{verb}: expected FT.SEARCH or FT.AGGREGATE")
        return [verb, self.name, self.query_text(query), *arguments, "DIALECT", 2]

    async def search(self, query: str, configure=lambda q: q):
        """FT.SEARCH of `query` within the tenant's records; `configure` sets the rest (paging,
        scorer, fields) on the redis-py Query."""
        return await self.redis.ft(self.name).search(configure(Query(self.query_text(query)).dialect(2)))

    async def aggregate(self, query: str, configure=lambda r: r):
        """FT.AGGREGATE over the tenant's records matching `query`; `configure` adds the steps
        (load, filter, group, sort) to the redis-py AggregateRequest."""
        return await self.redis.ft(self.name).aggregate(configure(AggregateRequest(self.query_text(query)).dialect(2)))


class OwnVectorIndex(TenantIndex):
    """A large tenant's own vector index of a layer (own_vector_schema): it holds the tenant's
    records alone, so its queries carry no tenant clause — an HNSW search filtered on a tag
    that every record holds would run in batches instead of one graph walk."""

    def query_text(self, query: str = "") -> str:
        return f"({query})" if query else "*"

    def filter(self, where: Mapping[str, str] | None = None) -> str:
        return tags_filter(where)
