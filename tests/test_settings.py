"""Settings read from MEMSTREAM_* variables by their fields' types: an enumerated setting is one
of its Literal's values, a switch `on`/`off` into a bool; every field has a group and help text,
from which docs/configuration.md's table is generated (tests/test_gates.py checks the file)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from ops.cli import main
from workers.settings import GROUPS, TABLE_BEGIN, TABLE_END, Settings, settings_table, variable

SWITCHES = ("schema_filter", "conflicts", "sim_bridging", "type_bridging")


def test_the_switches_read_on_and_off_into_bools():
    defaults = Settings.from_env({})
    assert all(getattr(defaults, switch) is True for switch in SWITCHES)
    off = Settings.from_env({variable(switch): "off" for switch in SWITCHES})
    assert all(getattr(off, switch) is False for switch in SWITCHES)
    on = Settings.from_env({variable(switch): "on" for switch in SWITCHES})
    assert all(getattr(on, switch) is True for switch in SWITCHES)
    assert Settings.from_env({"MEMSTREAM_SCHEMA_FILTER": "off", "MEMSTREAM_TAU": "3"}).effective_tau == 1
    assert Settings.from_env({"MEMSTREAM_TAU": "3"}).effective_tau == 3


@pytest.mark.parametrize("raw", ["yes", "true", "1", "ON", "Off", " on"])
def test_a_bad_switch_value_names_the_variable_and_on_or_off(raw):
    with pytest.raises(ValueError) as raised:
        Settings.from_env({"MEMSTREAM_CONFLICTS": raw})
    assert str(raised.value) == f"MEMSTREAM_CONFLICTS={raw!r}: expected on or off"


@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("EXTRACTOR", "rule", "rules, replay or llm"),
        ("RESOLVER", "policy", "rules or llm"),
        ("EMBEDDER", "torch", "local or openai"),
        ("VECTOR_INDEX", "ivf", "flat or hnsw"),
        ("ROUTER", "oracle", "similarity or llm"),
        ("LOG_LEVEL", "verbose", "debug, info, warning, error or critical"),
    ],
)
def test_a_bad_enumerated_value_names_the_variable_and_its_values(name, raw, expected):
    with pytest.raises(ValueError) as raised:
        Settings.from_env({f"MEMSTREAM_{name}": raw})
    assert str(raised.value) == f"MEMSTREAM_{name}={raw!r}: expected {expected}"


def test_the_checks_hold_for_settings_made_in_python_too():
    """The same check, from the types, for Settings(...) and dataclasses.replace: a switch given
    as the string "off" (truthy) must not pass for on."""
    with pytest.raises(ValueError, match=r"MEMSTREAM_CONFLICTS='off': expected True or False"):
        Settings(conflicts="off")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"MEMSTREAM_ROUTER='oracle': expected similarity or llm"):
        dataclasses.replace(Settings(), router="oracle")  # type: ignore[arg-type]
    assert dataclasses.replace(Settings(), conflicts=False).conflicts is False
    assert Settings.from_env({}, sim_bridging=False).sim_bridging is False


def test_the_log_level_is_read_in_any_case():
    settings = Settings.from_env({"MEMSTREAM_LOG_LEVEL": "WARNING"})
    assert settings.log_level == "warning" and settings.log_level_name == "WARNING"
    assert Settings(log_level="Debug").log_level == "debug"  # type: ignore[arg-type]


def test_numbers_still_parse_by_type():
    settings = Settings.from_env({"MEMSTREAM_TOP_K": "7", "MEMSTREAM_DELTA": "0.5", "MEMSTREAM_HOME": "/tmp/m"})
    assert (settings.top_k, settings.delta, str(settings.home)) == (7, 0.5, "/tmp/m")
    with pytest.raises(ValueError, match=r"MEMSTREAM_TOP_K='many': expected int"):
        Settings.from_env({"MEMSTREAM_TOP_K": "many"})


def test_every_setting_has_a_group_and_help():
    for f in dataclasses.fields(Settings):
        assert f.metadata.get("group") in GROUPS, f.name
        assert f.metadata.get("help", "").strip(), f.name
    table = settings_table()
    assert all(f"| `{variable(f.name)}` |" in table for f in dataclasses.fields(Settings))
    assert "| `MEMSTREAM_CONFLICTS` | `on` | `on` or `off` — " in table
    assert "| `MEMSTREAM_EXTRACTOR` | `rules` | `rules`, `replay` or `llm` — " in table


def test_the_cli_prints_and_rewrites_the_table(tmp_path, capsys, monkeypatch):
    for name in list(os.environ):
        if name.startswith("MEMSTREAM_"):
            monkeypatch.delenv(name)
    assert main(["settings-table"]) == 0
    assert capsys.readouterr().out == settings_table()
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# prose\n\n{TABLE_BEGIN}\n| `MEMSTREAM_GONE` | | stale |\n{TABLE_END}\n\nmore prose\n")
    assert main(["settings-table", "--write", str(doc)]) == 0
    assert doc.read_text() == f"# prose\n\n{TABLE_BEGIN}\n\n{settings_table()}\n{TABLE_END}\n\nmore prose\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    assert main(["settings-table", "--write", str(tmp_path / "bare.md")]) == 2
    assert "no settings table to replace" in capsys.readouterr().err


def test_the_cli_says_bad_input_in_a_line_and_shows_a_bug_whole(monkeypatch, capsys):
    """topics.BadInput (a flag, a setting, a file) is one line and exit 2; any other exception —
    a ValueError of a broken invariant too — is a bug: it is not dressed as bad input."""
    from ops import cli
    from topics import BadInput

    def bad_input(settings, args):
        raise BadInput("--thing: expected a number")

    def broken(settings, args):
        raise ValueError("an invariant broke")

    monkeypatch.setitem(cli.COMMANDS, "status", bad_input)
    assert cli.main(["status"]) == 2
    assert capsys.readouterr().err == "memstream: --thing: expected a number\n"
    monkeypatch.setitem(cli.COMMANDS, "status", broken)
    with pytest.raises(ValueError, match="an invariant broke"):
        cli.main(["status"])
    monkeypatch.setenv("MEMSTREAM_CHUNK_TOKENS", "many")  # a setting: bad input
    assert cli.main(["status"]) == 2
    assert "MEMSTREAM_CHUNK_TOKENS='many': expected int" in capsys.readouterr().err


def test_a_local_stack_of_redis_shards_is_reached_as_a_cluster():
    """MEMSTREAM_REDIS_SHARDS=3 (`stack up --redis-cluster 3`) and no MEMSTREAM_REDIS_URL: the
    store's URL names the cluster (redis+cluster://, store.redis.topology), not its first shard
    as one server (which the store refuses: a cluster node)."""
    assert Settings.from_env({"MEMSTREAM_REDIS_SHARDS": "3", "MEMSTREAM_REDIS_PORT": "7000"}).redis_url == (
        "redis+cluster://127.0.0.1:7000/0"
    )
    assert Settings.from_env({"MEMSTREAM_REDIS_PORT": "7000"}).redis_url == "redis://127.0.0.1:7000/0"


def test_a_redis_url_that_is_not_one_is_bad_input_naming_the_setting(monkeypatch, capsys):
    """Before: MEMSTREAM_REDIS_URL=notaurl passed the settings and `memstream tenants` ended in
    redis-py's ValueError traceback. The URL is checked where settings are read (not repeated:
    it may hold a password)."""
    for url, found in (
        ("notaurl", "(no scheme)"),
        ("http://:secret@127.0.0.1:6379/0", "(scheme 'http')"),
        ("redis://[::1", "(Invalid IPv6 URL)"),
        ("redis://127.0.0.1:99999/0", "(Port out of range"),
    ):
        with pytest.raises(ValueError, match="MEMSTREAM_REDIS_URL is not a"):
            Settings.from_env({"MEMSTREAM_REDIS_URL": url})
        monkeypatch.setenv("MEMSTREAM_REDIS_URL", url)
        assert main(["tenants"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("memstream: MEMSTREAM_REDIS_URL is not a") and found in err and "secret" not in err
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///tmp/redis.sock", "redis+cluster://h:7000/0"):
        assert Settings.from_env({"MEMSTREAM_REDIS_URL": url}).redis_url == url


def test_the_settings_take_every_url_scheme_the_store_opens():
    """MEMSTREAM_REDIS_URL's schemes are checked where settings are read (workers.settings, which
    does not import the store); the cluster's are the store's (store.redis.topology): both agree."""
    from store.redis.topology import CLUSTER_SCHEMES
    from workers.settings import REDIS_SCHEMES

    assert set(CLUSTER_SCHEMES) | set(CLUSTER_SCHEMES.values()) <= set(REDIS_SCHEMES)
