"""memstream's own shared keys (the LLM and embedding caches) live in namespaces no tenant can be
named: a tenant called "llm-cache" or "embedding-cache" used to share the caches' hash tag, so its
keys, scans and deletions reached the caches (internal namespaces cannot collide with
tenant names)."""

import re

import pytest

from store.keys import INTERNAL_NAMESPACES, LLM_CACHE_PATTERN, TenantKeys, embedding_cache_key, llm_cache_key
from topics import ContractError, validate_tenant


def hash_tag(key: str) -> str:
    """Redis Cluster's rule: what the first {...} holds."""
    return re.search(r"\{([^}]*)\}", key).group(1)


@pytest.mark.parametrize(
    "key", [llm_cache_key("gpt-x", "ab" * 32), embedding_cache_key("local", "cd" * 32), LLM_CACHE_PATTERN]
)
def test_no_tenant_can_be_named_like_a_cache_namespace(key):
    with pytest.raises(ContractError):
        validate_tenant(hash_tag(key))


@pytest.mark.parametrize("tenant", ["llm-cache", "embedding-cache", "_llm-cache", "LLM-cache"])
def test_a_tenant_named_like_a_cache_has_keys_of_its_own(tenant):
    try:
        validate_tenant(tenant)
    except ContractError:
        assert tenant.startswith("_")  # refused outright
        return
    prefix = TenantKeys(tenant).prefix("passages")
    assert hash_tag(prefix) == tenant and tenant not in INTERNAL_NAMESPACES
    assert all(hash_tag(k) != tenant for k in (llm_cache_key("m", "h"), embedding_cache_key("e", "h")))


@pytest.mark.parametrize("tenant", ["acme\n", "acme\r\n", "\nacme", "ac me", "acme\x00"])
def test_a_tenant_name_with_a_line_break_or_other_character_around_it_is_refused(tenant):
    """The tenant pattern must match the whole name: with `re.match` and `$`, "acme\\n" passed
    (a `$` matches before a final newline) and named keys of its own next to acme's."""
    with pytest.raises(ContractError):
        validate_tenant(tenant)
