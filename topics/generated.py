"""The docs' generated blocks: a table written from the code it describes (the settings'
fields, the stage graph) sits between two marker lines of a document, and tests/test_gates.py
fails while it differs from what the code generates."""

from __future__ import annotations

from topics.contract import BadInput


def spliced(document: str, begin: str, end: str, body: str, what: str) -> str:
    """`document` with `body` (the `what` table) between the line `begin` and the line `end` (a
    blank line either side), the prose around them as it was; BadInput when they are missing."""
    start, stop = document.find(begin), document.find(end)
    if start < 0 or stop < start:
        raise BadInput(f"no {what} to replace: it goes between a line {begin} and a line {end}")
    return f"{document[: start + len(begin)]}\n\n{body}\n{document[stop:]}"
