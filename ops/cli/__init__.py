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
    except KeyboardInterrupt:
        return 130
