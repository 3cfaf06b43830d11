"""Time in the input contract: a document's `ts`, ISO times as callers write them, and a
document's own TTLs (`metadata.ttl_seconds`). One parser for each, shared by the contract
(topics.records.Document, topics.conversations) and the workers (workers.algorithms.expiry): what
a publisher is told is refused is exactly what a worker would fail on.

Event-time dates of facts ('1998', '1998-05') are compared in two ways on purpose:
workers.algorithms.expiry.world_time reads them as moments on the system clock (as_of), built
on `iso_moment` below; workers.algorithms.policy.parse_time compares them as calendar tuples
(y, m, d) at day granularity for the resolver's overlap checks, reading any prefix that looks
like a date, negative years included (a fact "from -500"). Moving the resolver onto moments
would change which facts conflict (years before 1 or after 9999 have no datetime), so it keeps
its own reading."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from topics.contract import FACT_CATEGORIES, ContractError

# the seconds since the epoch a datetime can represent: years 1 to 9999
EARLIEST_TS = datetime(1, 1, 1, tzinfo=timezone.utc).timestamp()
LATEST_TS = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp()
# The months' English names, and a regex of any of them or its abbreviation: what the
# conversation loader, the time cue and reconstruct's tags all read dates with.
MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
MONTH_PATTERN = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"

TTL_METADATA = "ttl_seconds"  # the document metadata field


def epoch_seconds(value, where: str = "ts") -> float:
    """A time in seconds since the epoch, finite and within years 1–9999; ContractError naming
    `where` otherwise (a time in milliseconds is the usual mistake: said so)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ContractError(f"'{where}' must be seconds since the epoch, got {value!r}")
    if not EARLIEST_TS <= value <= LATEST_TS:
        hint = ": milliseconds?" if EARLIEST_TS <= value / 1000 <= LATEST_TS else ""
        raise ContractError(f"'{where}' must be seconds since the epoch within years 1-9999 (got {value:.6g}{hint})")
    return float(value)


def iso_moment(text) -> float | None:
    """An ISO 8601 time ('2023-05-08', '2023-05-08T13:56:00Z', '…+02:00'; a trailing 'Z' is UTC,
    no zone is UTC) → seconds since the epoch; None when it is none."""
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        return None
    try:
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    except (OverflowError, ValueError):  # '0001-01-01T00:00+01:00' is before year 1 in UTC
        return None


def _ttl(value, where: str) -> int:
    """A TTL: whole seconds, 0 = never lapses."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(f"{where} must be a whole number of seconds >= 0 (0: never expires), not {value!r}")
    return value


def fact_category(name, where: str) -> str:
    if name not in FACT_CATEGORIES:
        raise ContractError(f"{where}: unknown fact category {name!r}; expected one of {', '.join(FACT_CATEGORIES)}")
    return name


def document_ttls(metadata: dict) -> dict[str, int]:
    """A document's own TTLs, from `metadata.ttl_seconds`: an integer for every category, or an
    object {CATEGORY: seconds}; {} when absent. ContractError naming the field."""
    raw = (metadata or {}).get(TTL_METADATA)
    where = f"metadata.{TTL_METADATA}"
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {fact_category(name, where): _ttl(value, f"{where}.{name}") for name, value in raw.items()}
    seconds = _ttl(raw, where)
    return {name: seconds for name in FACT_CATEGORIES}
