"""API keys of the query worker: who may use which tenants, and how (pure: no I/O but reading
the keys file).

Keys are configured as a JSON list, in the file MEMSTREAM_API_KEYS_FILE or inline in
MEMSTREAM_API_KEYS, one object per key:

    {"name": "agents", "key_sha256": "<hex sha256 of the key>", "tenants": ["acme"], "scopes": ["read", "answer"]}

`tenants` lists tenant names, or is ["*"] for every tenant; `scopes` are of SCOPES. Only the
SHA-256 of a key is stored; a presented key is hashed and compared with every configured hash
in constant time (hmac.compare_digest, no early exit), so neither the comparison nor the number
of keys compared tells how close a guess came. `memstream keys new` makes a key and its entry.

Without keys configured the query worker serves everything to anyone who reaches it, and so
binds to loopback only (`check_listener`). The HTTP side of all this: the middleware
workers.query.http.authorization."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from topics import BadInput, ContractError, validate_tenant

SCOPES = ("read", "write", "answer", "admin")
SCOPE_MEANINGS = {  # for error messages and `memstream keys new --help`
    "read": "query a tenant's memory and read its facts and passages (POST /v1/query, GET /v1/facts, /v1/passages, MCP search tools)",
    "write": "publish into a tenant's memory, or take out of it (the MCP tools `remember`, `forget`, `retract_fact`; POST /v1/facts/{id}/retract)",
    "answer": 'have the query worker\'s LLM generate an answer ("answer": true)',
    "admin": "read /metrics on the API's address",
}
ALL_TENANTS = "*"
KEY_PREFIX = "ms_"  # a memstream key is recognisable in a leaked log or config
ENTRY_FIELDS = ("name", "key_sha256", "tenants", "scopes")


class KeyConfigError(BadInput):
    """The configured keys cannot be used; the worker refuses to start."""


@dataclass(frozen=True)
class ApiKey:
    """One configured key: its name (for logs and 403 messages; never the key), the SHA-256 of
    the key, the tenants it may use (ALL_TENANTS: every one) and its scopes."""

    name: str
    digest: bytes
    tenants: frozenset[str]
    scopes: frozenset[str]

    def may_use(self, tenant: str) -> bool:
        return ALL_TENANTS in self.tenants or tenant in self.tenants

    def entry(self) -> dict:
        """The key as it is configured (ENTRY_FIELDS)."""
        return {
            "name": self.name,
            "key_sha256": self.digest.hex(),
            "tenants": sorted(self.tenants),
            "scopes": [s for s in SCOPES if s in self.scopes],
        }


# A request's key when no keys are configured (loopback only): every tenant, every scope
OPEN_ACCESS = ApiKey("(no keys configured)", b"", frozenset([ALL_TENANTS]), frozenset(SCOPES))


def digest_of(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class KeyRing:
    """The configured keys, found by the presented key in constant time."""

    def __init__(self, keys: list[ApiKey], source: str):
        self.keys = tuple(keys)
        self.source = source  # where they were configured, for the start-up log

    def find(self, token: str) -> ApiKey | None:
        """The key whose hash is the presented token's, else None. Every configured hash is
        compared, whatever matched: the time depends only on the number of keys. A token that is
        not UTF-8 (aiohttp keeps a header's other bytes as lone surrogates) is no key: it was a
        500 UnicodeEncodeError (an audit)."""
        try:
            presented = digest_of(token)
        except UnicodeEncodeError:
            return None
        found = None
        for key in self.keys:
            if hmac.compare_digest(presented, key.digest):
                found = key
        return found

    def __len__(self) -> int:
        return len(self.keys)


def parse_keys(text: str, source: str) -> KeyRing:
    """The key ring of a JSON list of ENTRY_FIELDS objects; KeyConfigError naming `source`, the
    entry and what is wrong with it."""
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise KeyConfigError(f"{source}: not valid JSON ({exc})") from None
    if not isinstance(entries, list) or not entries:
        raise KeyConfigError(
            f"{source}: expected a non-empty JSON list of keys "
            f'({{"name", "key_sha256", "tenants", "scopes"}} each; `memstream keys new` makes one)'
        )
    keys: list[ApiKey] = []
    for index, entry in enumerate(entries):
        where = f"{source}: key {index}" + (
            f" ({entry['name']!r})" if isinstance(entry, dict) and isinstance(entry.get("name"), str) else ""
        )
        keys.append(_parse_entry(entry, where))
    for field, value_of in (("name", lambda k: k.name), ("key_sha256", lambda k: k.digest)):
        seen: set = set()
        for key in keys:
            if value_of(key) in seen:
                raise KeyConfigError(f"{source}: two keys have the same {field} ({key.name!r}): give each key its own")
            seen.add(value_of(key))
    return KeyRing(keys, source)


def _parse_entry(entry, where: str) -> ApiKey:
    if not isinstance(entry, dict):
        raise KeyConfigError(f"{where}: expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(ENTRY_FIELDS))
    if unknown:
        raise KeyConfigError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(ENTRY_FIELDS)}"
            + ("; store the key's sha256 as key_sha256, never the key" if "key" in unknown else "")
        )
    missing = [f for f in ENTRY_FIELDS if f not in entry]
    if missing:
        raise KeyConfigError(f"{where}: missing field(s) {', '.join(map(repr, missing))}")
    name, hexdigest, tenants, scopes = (entry[f] for f in ENTRY_FIELDS)
    if not isinstance(name, str) or not name.strip():
        raise KeyConfigError(f"{where}: 'name' must be a non-empty string")
    if (
        not isinstance(hexdigest, str)
        or len(hexdigest) != 64
        or any(c not in "0123456789abcdefABCDEF" for c in hexdigest)
    ):
        raise KeyConfigError(f"{where}: 'key_sha256' must be 64 hex digits (the SHA-256 of the key)")
    if not isinstance(tenants, list) or not tenants or not all(isinstance(t, str) for t in tenants):
        raise KeyConfigError(
            f"{where}: 'tenants' must be a non-empty list of tenant names, or [\"*\"] for every tenant"
        )
    for tenant in tenants:
        if tenant != ALL_TENANTS:
            try:
                validate_tenant(tenant)
            except ContractError as exc:
                raise KeyConfigError(f"{where}: {exc}") from None
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise KeyConfigError(f"{where}: 'scopes' must be a non-empty list of {', '.join(SCOPES)}")
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        raise KeyConfigError(f"{where}: unknown scope(s) {', '.join(map(repr, bad))}; expected of {', '.join(SCOPES)}")
    return ApiKey(name, bytes.fromhex(hexdigest), frozenset(tenants), frozenset(scopes))


def load_keys(keys_file: str, inline: str) -> KeyRing | None:
    """The keys of MEMSTREAM_API_KEYS_FILE or MEMSTREAM_API_KEYS (not both); None when neither
    is set. KeyConfigError for an unreadable file or a malformed list."""
    if keys_file and inline:
        raise KeyConfigError(
            "both MEMSTREAM_API_KEYS_FILE and MEMSTREAM_API_KEYS are set: configure the keys in one place"
        )
    if keys_file:
        try:
            text = Path(keys_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyConfigError(f"MEMSTREAM_API_KEYS_FILE={keys_file}: cannot be read ({exc})") from None
        return parse_keys(text, f"MEMSTREAM_API_KEYS_FILE={keys_file}")
    if inline:
        return parse_keys(inline, "MEMSTREAM_API_KEYS")
    return None


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only: 'localhost' or a loopback address
    (127.0.0.0/8, ::1). Any other name counts as reachable from elsewhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_listener(host: str, port: int, keys: KeyRing | None) -> str:
    """Refuse (KeyConfigError) to serve the API on a non-loopback address without keys; else the
    line the worker logs at start saying how it is protected."""
    if keys is not None:
        return f"query API on {host}:{port}: {len(keys)} API key(s) from {keys.source}; every endpoint but /healthz needs one"
    if not is_loopback(host):
        raise KeyConfigError(
            f"MEMSTREAM_HTTP_HOST={host} is not a loopback address and no API keys are configured: anyone reaching "
            f"{host}:{port} could read and query every tenant. Configure keys (MEMSTREAM_API_KEYS_FILE or MEMSTREAM_API_KEYS; "
            f"`memstream keys new --tenant T --scope read` makes one) or bind 127.0.0.1"
        )
    return (
        f"query API on {host}:{port}: no API keys configured (MEMSTREAM_API_KEYS_FILE, MEMSTREAM_API_KEYS), so it serves "
        f"every tenant without a key and listens on loopback only"
    )


def new_key(name: str | None, tenants: list[str], scopes: list[str]) -> tuple[str, dict]:
    """A fresh random key (256 bits) and its configuration entry, validated as a loaded one is;
    the name defaults to key-<the first 8 hex digits of its hash>."""
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    hexdigest = digest_of(token).hex()
    entry = {"name": name or f"key-{hexdigest[:8]}", "key_sha256": hexdigest, "tenants": tenants, "scopes": scopes}
    _parse_entry(entry, "the new key")
    return token, entry
