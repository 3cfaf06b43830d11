"""Redis key layout. Every key of a tenant carries the hash tag `{tenant}`, so one tenant lives
in one Redis Cluster slot. The records of the four vector-indexed layers start with their
layer (`ms:pas:{tenant}:<id>`): one shared index per layer covers every tenant's records by
that prefix, and every search filters on the record's `tenant` tag (store.indexes). Every
other key starts with the tenant (`ms:{tenant}:...`)."""

from dataclasses import dataclass

from store.nodes import (  # noqa: F401 — re-exported: the bench phases that run over an older tree's packages import them from here
    ENTITY_NODE,
    PASSAGE_NODE,
    TYPE_NODE,
    entity_node,
    node_id,
    node_kind,
    passage_node,
    type_node,
)
from topics import validate_tenant

LAYERS = ("passages", "facts", "entities", "schemas")
_LAYER_KEY = {"passages": "pas", "facts": "fact", "entities": "ent", "schemas": "schema"}


def layer_prefix(layer: str) -> str:
    """Where every tenant's records of a layer start: the shared index's prefix."""
    return f"ms:{_LAYER_KEY[layer]}:"


SHARED_INDEX_PREFIX = "ms:index:"
OWN_INDEX_PREFIX = "ms:own:"  # a large tenant's own indexes (TenantKeys.lexical_index_name, vector_index_name)
VECTOR_TYPE_TAG = "f16"  # in the name: the float32 indexes before it (float32_index_name) held the same keys


def shared_index_name(layer: str, dims: int, shard_tag: str | None = None) -> str:
    """The index of a layer's records with vectors of `dims` (one per layer and vector size).
    The colons keep it apart from every per-tenant name (legacy_index_name) a tenant could make.
    On a Redis Cluster each shard has its own, named with a hash tag of a slot it serves (an
    index name is a key to the cluster: store.redis.base.RedisBase.index)."""
    tag = f"{{{shard_tag}}}:" if shard_tag is not None else ""
    return f"{SHARED_INDEX_PREFIX}{tag}{layer}:{dims}:{VECTOR_TYPE_TAG}"


def index_name_tag(name: str) -> str | None:
    """The hash tag a cluster shard's shared index is named with (shared_index_name), None
    for an untagged name."""
    named = name.removeprefix(SHARED_INDEX_PREFIX)
    return named[1:].partition("}")[0] if named.startswith("{") else None


def float32_index_name(layer: str, dims: int) -> str:
    """The shared index of the same records when vectors were held as float32 (memstream migrate
    re-encodes its records and drops it)."""
    return f"{SHARED_INDEX_PREFIX}{layer}:{dims}"


def parse_index_name(name: str) -> tuple[str, int, bool] | None:
    """(layer, dims, float16) of a shared index's name (this version's or a float32 one), None
    for any other name."""
    if not name.startswith(SHARED_INDEX_PREFIX):
        return None
    named = name.removeprefix(SHARED_INDEX_PREFIX)
    if named.startswith("{"):  # a cluster shard's (shared_index_name's shard_tag)
        named = named.partition("}:")[2]
    layer, _, rest = named.partition(":")
    dims, _, tag = rest.partition(":")
    if layer not in LAYERS or not dims.isdigit() or tag not in ("", VECTOR_TYPE_TAG):
        return None
    return layer, int(dims), tag == VECTOR_TYPE_TAG


def own_lexical_tenant(name: str) -> str | None:
    """The tenant of an own lexical index's name, of any generation (TenantKeys.lexical_index_name,
    lexical_generation_index: `ms:own:acme:lexical`, `ms:own:{acme}:lexical:2`); None for any
    other name."""
    named = name.removeprefix(OWN_INDEX_PREFIX)
    if named == name:
        return None
    tenant, _, rest = named.partition(":lexical")
    if tenant.startswith("{") and tenant.endswith("}"):  # a cluster's (tagged_indexes)
        tenant = tenant[1:-1]
    if rest and not (rest[:1] == ":" and rest[1:].isdigit()):
        return None
    try:
        validate_tenant(tenant)
    except ValueError:  # an index under the prefix of no tenant's (a foreign or a damaged name)
        return None
    return tenant


# Namespaces of memstream's own, shared by every tenant. They start with "_", which no tenant
# name can (topics.records.validate_tenant: a letter or digit first), so a tenant named
# "llm-cache" has keys of its own and can never read, write or scan the caches.
LLM_CACHE_NAMESPACE = "_llm-cache"
EMBEDDING_CACHE_NAMESPACE = "_embedding-cache"
INTERNAL_NAMESPACES = (LLM_CACHE_NAMESPACE, EMBEDDING_CACHE_NAMESPACE)


def llm_cache_key(model: str, prompt_sha256: str) -> str:
    # one cache for all tenants: the answer is a function of the prompt alone
    return f"ms:{{{LLM_CACHE_NAMESPACE}}}:{model}:{prompt_sha256}"


def embedding_cache_key(embedder: str, text_sha256: str) -> str:
    return f"ms:{{{EMBEDDING_CACHE_NAMESPACE}}}:{embedder}:{text_sha256}"


LLM_CACHE_PATTERN = f"ms:{{{LLM_CACHE_NAMESPACE}}}:*"


@dataclass(frozen=True)
class TenantKeys:
    tenant: str
    # a store on a Redis Cluster: the tenant's own index names carry its hash tag (an index name
    # is a key to the cluster: in the tenant's slot, on its shard); on one server they keep the
    # names they were made with
    tagged_indexes: bool = False

    def __post_init__(self):
        validate_tenant(self.tenant)

    @property
    def base(self) -> str:
        return f"ms:{{{self.tenant}}}"

    # vector-indexed hashes, one prefix per layer, under the shared index's (layer_prefix)
    def prefix(self, layer: str) -> str:
        return f"{layer_prefix(layer)}{{{self.tenant}}}:"

    def patterns(self) -> tuple[str, ...]:
        """SCAN patterns that together match every key of the tenant."""
        return (f"{self.base}:*", *(self.prefix(layer) + "*" for layer in LAYERS))

    # before shared indexes (memstream migrate moves a tenant off them)
    def legacy_prefix(self, layer: str) -> str:
        return f"{self.base}:{_LAYER_KEY[layer]}:"

    def legacy_index_name(self, layer: str) -> str:
        return f"ms_{self.tenant}_{layer}"

    def passage(self, chunk_id: str) -> str:
        return self.prefix("passages") + chunk_id

    # a large tenant's lexical index of its own (store.redis.lexical_index), in generations: a
    # rebuild writes generation g+1's copies and index beside g's, then moves the alias
    @property
    def lexical_mirror_base(self) -> str:
        """What every generation's copy key starts with (the mirror script builds them from it)."""
        return f"{self.base}:lex"

    def lexical_mirror_prefix(self, generation: int = 0) -> str:
        """Where a generation's copies of its passages' lexical fields start: that generation's
        index prefix (generation 0's `ms:{t}:lex:` predates generations)."""
        return f"{self.lexical_mirror_base}{generation or ''}:"

    def lexical_mirror(self, passage_id: str, generation: int = 0) -> str:
        return self.lexical_mirror_prefix(generation) + passage_id

    def lexical_copy_passage(self, copy_key: str) -> str:
        """The passage id of a copy's key, of any generation."""
        return copy_key[len(self.lexical_mirror_base) :].split(":", 1)[1]

    @property
    def lexical_index_state(self) -> str:
        """Hash fields 'state': 'building' (its passages are being copied) or 'ready' (searched);
        'gen': the generation searched (none: 0); 'next': the generation a rebuild is copying."""
        return f"{self.base}:lexindex"

    @property
    def lexical_rebuild_lease(self) -> str:
        """Held (SET NX EX) by the one process promoting the tenant to its own lexical index or
        building that index again once it drifted (the name predates promotions taking it)."""
        return f"{self.base}:lexrebuild"

    @property
    def lexical_index_name(self) -> str:
        """What its searches name: generation 0's index, or the alias of a later one's (an index
        name, not a key: FT.DROPINDEX removes the index it names)."""
        return f"{OWN_INDEX_PREFIX}{self._index_tenant}:lexical"

    def lexical_generation_index(self, generation: int) -> str:
        """A generation's own index (0: the name searched; later ones are reached by its alias)."""
        return self.lexical_index_name + (f":{generation}" if generation else "")

    @property
    def vector_index_state(self) -> str:
        """Hash field 'state': 'ready' once its own vector indexes scanned its records (field
        'dims': their vectors' size)."""
        return f"{self.base}:vecindex"

    def vector_index_name(self, layer: str, dims: int) -> str:
        """Its own HNSW index of a layer's records (store.redis.vector_index)."""
        return f"{OWN_INDEX_PREFIX}{self._index_tenant}:{layer}:{dims}:{VECTOR_TYPE_TAG}"

    @property
    def _index_tenant(self) -> str:
        return f"{{{self.tenant}}}" if self.tagged_indexes else self.tenant

    def fact(self, fact_id: str) -> str:
        return self.prefix("facts") + fact_id

    def entity(self, entity_id: str) -> str:
        return self.prefix("entities") + entity_id

    def schema(self, schema_id: str) -> str:
        return self.prefix("schemas") + schema_id

    # sets: counting with sets keeps replays from counting twice
    def fact_passages(self, fact_id: str) -> str:
        return f"{self.base}:factpas:{fact_id}"

    def entity_passages(self, entity_id: str) -> str:
        return f"{self.base}:entpas:{entity_id}"

    def schema_passages(self, schema_id: str) -> str:
        return f"{self.base}:schemapas:{schema_id}"

    # a passage's side of the counting sets, so a version that retires it takes back what it counted
    def passage_facts(self, passage_id: str) -> str:
        """The facts whose support holds this passage (fact_passages, the other way round)."""
        return f"{self.base}:pasfacts:{passage_id}"

    def passage_schemas(self, passage_id: str) -> str:
        """The schemas whose frequency counts this passage (schema_passages, the other way round)."""
        return f"{self.base}:passchemas:{passage_id}"

    def passage_revision(self, passage_id: str) -> str:
        """Hash field 'n': bumped by every write to the passage's side of the counting sets
        (its facts, its documents), so a version that retires the passage fails its commit
        when support arrived after it read them (Memory.expect_passage)."""
        return f"{self.base}:pasrev:{passage_id}"

    def passage_documents(self, passage_id: str) -> str:
        """The documents whose current version holds this passage (the same text in two documents is one passage)."""
        return f"{self.base}:pasdocs:{passage_id}"

    # what an erasure (workers.stages.erasure) needs to find: never emptied by a retirement
    def document_passages(self, doc_id: str) -> str:
        """Every passage any version of the document held and no erasure has removed yet."""
        return f"{self.base}:docpas:{doc_id}"

    def passage_extracted(self, passage_id: str) -> str:
        """The facts the passage's extractions wrote (fact_sources, the other way round)."""
        return f"{self.base}:pasext:{passage_id}"

    def fact_set_aside(self, fact_id: str) -> str:
        """The passages a retraction set aside (stage_unsupport): where a retracted fact came from."""
        return f"{self.base}:factaside:{fact_id}"

    def fact_said(self, fact_id: str) -> str:
        """Hash: doc id → when that document first said the fact (the conflict policy's tie-break)."""
        return f"{self.base}:factsaid:{fact_id}"

    def fact_sources(self, fact_id: str) -> str:
        """The passages whose extraction wrote the fact, current or retired."""
        return f"{self.base}:factsrc:{fact_id}"

    def schema_pending(self, schema_id: str) -> str:
        return f"{self.base}:schemapending:{schema_id}"

    def group(self, head_id: str, relation: str) -> str:
        return f"{self.base}:group:{head_id}|{relation}"

    def facts_with_tail(self, tail_id: str) -> str:
        return f"{self.base}:bytail:{tail_id}"

    def relation_heads(self, relation: str) -> str:
        return f"{self.base}:relheads:{relation}"

    def relation_multi_heads(self, relation: str) -> str:
        return f"{self.base}:relmulti:{relation}"

    # episodes: a session's turns in order (reconstruct's contiguity)
    def session_turns(self, session_id: str) -> str:
        """Sorted set: the passage ids of a session's turns, scored by their turn number."""
        return f"{self.base}:session:{session_id}"

    def session_turn_changes(self, session_id: str) -> str:
        """Hash: turn number → how many times a passage was indexed at that turn of the session
        (the fence of a decision that read the session's turns: expect_session_turns)."""
        return f"{self.base}:sessionchg:{session_id}"

    @property
    def similarity_bridged(self) -> str:
        return f"{self.base}:simbridged"

    @property
    def aliases(self) -> str:
        return f"{self.base}:alias"

    @property
    def relation_cardinality(self) -> str:
        return f"{self.base}:relcard"

    def edge_facts(self, a: str, b: str) -> str:
        return f"{self.base}:edgefacts:{min(a, b)}|{max(a, b)}"

    def adjacency(self, node: str) -> str:
        return f"{self.base}:adj:{node}"

    @property
    def graph_version(self) -> str:
        return f"{self.base}:graph:version"

    @property
    def graph_changes(self) -> str:
        return f"{self.base}:graph:changes"

    @property
    def graph_nodes(self) -> str:
        """Every node that ever had an edge, so a graph load reads the tenant's adjacency
        hashes without scanning the keyspace."""
        return f"{self.base}:graph:nodes"

    @property
    def graph_nodes_complete(self) -> str:
        """Set once `graph_nodes` also holds the nodes written before it existed."""
        return f"{self.base}:graph:nodes-complete"

    # document progress
    def document(self, doc_id: str) -> str:
        return f"{self.base}:doc:{doc_id}"

    @property
    def chunks_done(self) -> str:
        return f"{self.base}:chunks:done"

    def chunk_facts_done(self, chunk_id: str) -> str:
        return f"{self.base}:chunkfacts:{chunk_id}"

    def chunk_outstanding(self, chunk_id: str) -> str:
        return f"{self.base}:chunkwork:{chunk_id}"

    # effectively-once processing of one message
    def done_mark(self, mark: str) -> str:
        return f"{self.base}:done:{mark}"

    def outbox(self, mark: str) -> str:
        return f"{self.base}:outbox:{mark}"

    @property
    def outboxes(self) -> str:
        """Sorted set of marks whose committed outbox is not yet published (score: commit
        time), so a sweep can publish what a worker committed but never sent."""
        return f"{self.base}:outboxes"

    @property
    def outbox_sweep_lock(self) -> str:
        return f"{self.base}:outboxes:sweeping"

    # time in memory: TTLs (store.memory.Memory.stage_new_fact)
    @property
    def expiry(self) -> str:
        """Sorted set of fact ids by `expires_at` (facts that never lapse are not in it): where
        the expiry sweep finds lapsed facts without scanning."""
        return f"{self.base}:expiry"

    # the embedder the tenant's indexes were built with (Memory.claim_embedder)
    @property
    def embedder(self) -> str:
        return f"{self.base}:embedder"

    def cardinality_flip(self, mark: str) -> str:
        """Set when the message behind `mark` flipped a relation's cardinality verdict, so its
        redelivery spawns the same re-adjudications."""
        return f"{self.base}:flip:{mark}"


# Tenants that have committed an outbox: the sweep's list of where to look. Not under a
# tenant's hash tag, so it is written outside the tenant's transactions.
TENANTS_WITH_OUTBOXES = "ms:tenants:outboxes"


def applied_offsets_key(group: str, shard_tag: str | None = None) -> str:
    """Hash of a consumer group's applied offsets: field '<topic>:<partition>' → the last offset
    whose effects Redis holds (store.redis.outbox: record_applied). On a Redis Cluster one per
    shard, in a slot of that shard (`shard_tag`): each proves what its own shard holds."""
    if shard_tag is not None:
        return f"ms:applied:{{{shard_tag}}}:{group}"
    return f"ms:applied:{{{group}}}"
