"""The tag filters the store writes into its searches (store.indexes: tags_filter, a tenant's
TenantIndex.filter) are the text redisvl's filter expressions give for the same fields, hostile
values included: the store writes them itself (a reconstruct walk's ~60 new filters a query cost
7 µs each as expressions, 1 µs as text), and what a filter matches must not change."""

from __future__ import annotations

from redisvl.query.filter import FilterExpression, Tag

from store.indexes import TENANT_FIELD, TenantIndex, tags_filter

VALUES = [
    "bergen_cathedral",
    "a-b c|d",
    "{x}",
    'o\'neil "quoted"',
    "50% @home: $5 & more!",
    "tromsø_北京_🙂",
    "back\\slash/slash",
    "*wild?",
    "",
]


def _redisvl(where: list[tuple[str, str]]) -> str:
    expression: FilterExpression | None = None
    for field, value in where:
        tag = Tag(field) == value
        expression = tag if expression is None else expression & tag
    return "*" if expression is None else str(expression)


def test_the_stores_tag_filters_are_redisvls_text_for_every_value():
    for value in VALUES:
        for where in ([("head_id", value)], [("head_id", value), ("status", "active")], [("status", value)]):
            assert tags_filter(dict(where)) == _redisvl(where), where
            index = TenantIndex(None, None, "tenant-1.b_c", "facts")  # type: ignore[arg-type]
            assert index.filter(dict(where)) == _redisvl([(TENANT_FIELD, "tenant-1.b_c"), *where]), where
    assert tags_filter(None) == tags_filter({}) == "*"
