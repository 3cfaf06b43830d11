"""The `memstream` command (pyproject's entry point `ops.cli:main`; `python -m ops.cli`): the
parser and the dispatch. Each group of commands, its flags and its code, is a module of its own:
`stack` (stack, topics, worker, demo), `documents` (publish, delete, retract, rebuild), `status`
(status, tail, tenants, export), `query` (query, alias, fact, facts, passage, mcp), `admin`
(tenant, migrate, keys, settings-table, stage-table) and `bench` (one subcommand per benchmark)."""

from __future__ import annotations

import argparse
import sys

from ops.cli import admin, bench, documents, query, stack, status
from store.errors import RedisClusterNode
from topics import BadInput
from workers.settings import Settings

GROUPS = (stack, documents, status, query, admin, bench)
COMMANDS = {name: command for group in GROUPS for name, command in group.COMMANDS.items()}


def build_parser() -> argparse.ArgumentParser:
    """`memstream`'s parser: every group's commands, each with its own flags."""
    parser = argparse.ArgumentParser(prog="memstream", description="Streaming graph memory on Kafka and Redis.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings: Settings | None = None
    try:
        settings = Settings.from_env()
        return COMMANDS[args.command](settings, args)
    # bad input (topics.BadInput: a flag, a setting, a file, a message) is said in one line, exit 2;
    # any other exception — a ValueError raised for a broken invariant too — is a bug: its traceback
    except (BadInput, FileNotFoundError, NotImplementedError) as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    # the stack or a worker failed to come up; a Redis the store refuses
    except (RuntimeError, RedisClusterNode) as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # Kafka or Redis away: said in one line, exit 1 (`status` printed a traceback)
        away = _service_away(exc, settings)
        if away is None:
            raise
        print(f"memstream: {away}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _service_away(exc: BaseException, settings: Settings | None) -> str | None:
    """What to tell a user whose command met Kafka or Redis away (a kafka-python error: the broker
    unreachable at the start, or silent past a request's timeout; a Redis connection or reply
    timeout), None for anything else (a bug: its traceback)."""
    from store.errors import redis_unavailable

    if type(exc).__module__.startswith("kafka."):
        where = f" at {settings.kafka_bootstrap}" if settings is not None else ""
        if not getattr(exc, "retriable", False):  # it answered: an authorization or a broker's refusal
            return f"Kafka{where} refused the command ({type(exc).__name__}: {exc})"
        return (
            f"Kafka{where} did not answer ({type(exc).__name__}: {exc}); is it running? "
            "(`memstream stack up`, MEMSTREAM_KAFKA_BOOTSTRAP)"
        )
    if redis_unavailable(exc) is not None:
        where = f" at {settings.redis_address}" if settings is not None else ""
        return f"Redis{where} did not answer ({type(exc).__name__}: {exc}); is it running? (MEMSTREAM_REDIS_URL)"
    return None
