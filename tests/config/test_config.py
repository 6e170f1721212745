"""The configuration loader: defaults, the example file, every kind of error, secrets.

No servers: everything here is files in tmp_path and a dict for the environment.
If the example file test fails after a schema change, regenerate the file:

    .venv/bin/python -c "import sys; from lumio_ingestd.config import example_ini; \\
        sys.stdout.write(example_ini())" > etc/lumio/ingestd.ini
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import pickle
import re
import socket
from pathlib import Path

import pytest

import support
from lumio_ingestd import config as config_module
from lumio_ingestd.config import (
    ACCOUNT_SECTION,
    DEFAULT_PATH,
    SCHEMA,
    AccountConfig,
    ChatConfig,
    Config,
    ConfigError,
    ConfigProblem,
    DaemonConfig,
    EventsConfig,
    HttpConfig,
    JetstreamConfig,
    KickConfig,
    MetricsConfig,
    RedisConfig,
    Secret,
    SevenTvConfig,
    StreamElementsConfig,
    StreamStatusConfig,
    SyntheticConfig,
    TimescaleConfig,
    TwitchConfig,
    example_ini,
    load,
    redacted_lines,
    resolve_path,
)

EXAMPLE = support.ROOT / "etc/lumio/ingestd.ini"
FIXED_SECTIONS = ("daemon", "redis", "timescale", "chat", "events", "metrics", "http", "twitch", "jetstream",
                  "kick", "streamelements", "seventv", "streamstatus", "synthetic")
SENTINEL = "Sentinel-Secret-4711"


# --------------------------------------------------------------------------- helpers


def write(tmp_path: Path, text: str, name: str = "ingestd.ini") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path, environ or {})
    return info.value


def one_problem(tmp_path: Path, text: str, section: str, key: str,
                environ: dict[str, str] | None = None) -> str:
    """Load `text`, expect exactly one problem at [section] key; return it as str, naming all three."""
    err = problems(tmp_path, text, environ)
    assert len(err.problems) == 1, str(err)
    problem = err.problems[0]
    assert (problem.section, problem.key) == (section, key), str(err)
    line = str(err)
    path = str(tmp_path / "ingestd.ini")
    assert line.startswith(f"{path}: [{section}]" + (f" {key}:" if key else ":")), line
    return line


# --------------------------------------------------------------------------- defaults and the example


EXPECTED_DEFAULTS: dict[str, dict[str, object]] = {
    # Written out by hand, not derived from SCHEMA: changing a default must break this.
    "daemon": {
        "state_dir": Path("/var/lib/lumio-ingestd"), "log_level": "info", "shard_index": 0, "shard_count": 1,
        "accounts_dir": Path("/etc/lumio/accounts.d"), "shard_auto": False,
        "spool_max_bytes": 1073741824, "shutdown_timeout_secs": 8.0,
        "heal_max_hours": 72.0, "seen_interval_secs": 5.0,
    },
    "redis": {
        "url": "redis://127.0.0.1:6379/0", "password": None, "socket_timeout_secs": 2.0,
        "connect_timeout_secs": 2.0, "cluster": False, "sentinels": (),
        "sentinel_service": "mymaster", "min_replicas_acked": 0, "replica_ack_timeout_ms": 500,
    },
    "timescale": {
        "dsn": "postgresql://lumio@127.0.0.1:5432/lumio", "password": None, "pool_size": 5,
        "statement_timeout_secs": 30.0, "acquire_timeout_secs": 30.0, "connect_timeout_secs": 5,
        "tcp_user_timeout_secs": 10.0, "keepalive_idle_secs": 10, "migration_lock_timeout_secs": 5.0,
        "migration_retries": 12, "migration_retry_interval_secs": 5.0, "compress_after_hours": 0.0,
    },
    "chat": {
        "flush_interval_secs": 5.0, "flush_batch_size": 1000, "flush_workers": 2, "max_flush_failures": 5,
        "deadletter_ttl_hours": 72.0, "deadletter_drain_interval_secs": 60.0, "retention_days": 30,
    },
    "events": {"insert_timeout_secs": 3.0, "retry_interval_secs": 30.0, "retention_days": 365},
    "metrics": {"listen_host": "127.0.0.1", "listen_port": 9464},
    "http": {"listen_host": "127.0.0.1", "listen_port": 8780, "emit_token": None,
             "trusted_proxy_header": None, "max_connections_per_client": 16},
    "twitch": {
        "eventsub_ws_url": "wss://eventsub.wss.twitch.tv/ws", "helix_url": "https://api.twitch.tv/helix",
        "oauth_url": "https://id.twitch.tv/oauth2", "client_id": "", "client_secret": None,
        "webhook_secret": None, "keepalive_timeout_secs": 30, "heal_follows": True,
    },
    "jetstream": {
        "url": "wss://jetstream2.us-east.bsky.network/subscribe", "collections": (), "rewind_secs": 5.0,
    },
}


def test_an_empty_file_gives_every_default(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ""), {})
    assert cfg.path == str(tmp_path / "ingestd.ini")
    assert cfg.accounts == ()
    for section, expected in EXPECTED_DEFAULTS.items():
        obj = getattr(cfg, section)
        actual = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name != "instance_id"}
        assert actual == expected, section
        for name, value in expected.items():
            assert type(getattr(obj, name)) is type(value), (section, name)
    assert cfg.daemon.instance_id == f"{socket.gethostname()}:{os.getpid()}"


def test_dataclass_defaults_are_the_loaded_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, ""), {}) == Config(path=str(tmp_path / "ingestd.ini"))


def test_the_example_file_is_generated_from_the_schema() -> None:
    assert EXAMPLE.read_text() == example_ini(), "regenerate etc/lumio/ingestd.ini (see the docstring)"


def test_the_example_file_loads_and_equals_the_defaults(tmp_path: Path) -> None:
    cfg = load(str(EXAMPLE), {})
    defaults = load(write(tmp_path, ""), {})
    assert dataclasses.replace(cfg, path="x", accounts=()) == dataclasses.replace(defaults, path="x")
    assert cfg.accounts == (
        AccountConfig(account_id=1, twitch_user_id="123456", twitch_token_file=None,
                      bluesky_did="did:plc:abcdefghijklmnopqrstuvwx",
                      streamelements_channel_id="5b2e2007760aeb7729487dab",
                      seventv_user_id="01F74BZYAR00069YQS4JB48G14",
                      seventv_emote_set_id="01FE3WJ4PR0009RT43H1DH4XQX"),
    )


def test_the_example_file_shows_every_key_with_comments_on_their_own_lines() -> None:
    text = EXAMPLE.read_text()
    parser = configparser.ConfigParser(interpolation=None, default_section="__no_default__")
    parser.read_string(text)
    assert parser.sections() == [*FIXED_SECTIONS, "account.1"]
    lines = text.splitlines()
    for setting in SCHEMA:
        section = "account.1" if setting.section == ACCOUNT_SECTION else setting.section
        start = lines.index(f"[{section}]")
        pattern = re.compile(("# " if setting.commented else "") + re.escape(setting.key) + r" =( |$)")
        index = next(i for i, line in enumerate(lines[start:], start) if pattern.match(line))
        assert lines[index - 1].startswith("# "), f"{setting.key} has no comment above it"
        if not setting.commented and setting.section != ACCOUNT_SECTION:
            assert parser.get(section, setting.key) == setting.default
    # The secret files and the token file are present but commented out.
    for key in ("password_file", "emit_token_file", "client_secret_file", "webhook_secret_file",
                "twitch_token_file"):
        assert re.search(rf"^# {key} = \S", text, re.MULTILINE), key
        assert not re.search(rf"^{key}\b", text, re.MULTILINE), key
    assert not any(re.search(r"\s[#;]", line) for line in lines if not line.startswith("#"))


def test_schema_covers_every_dataclass_field_exactly_once() -> None:
    classes = {
        "daemon": DaemonConfig, "redis": RedisConfig, "timescale": TimescaleConfig, "chat": ChatConfig,
        "events": EventsConfig, "metrics": MetricsConfig, "http": HttpConfig, "twitch": TwitchConfig,
        "jetstream": JetstreamConfig, "kick": KickConfig, "streamelements": StreamElementsConfig,
        "seventv": SevenTvConfig, "streamstatus": StreamStatusConfig, "synthetic": SyntheticConfig,
        ACCOUNT_SECTION: AccountConfig,
    }
    for section, cls in classes.items():
        covered = [name for s in SCHEMA if s.section == section for name in s.fields]
        expected = [f.name for f in dataclasses.fields(cls) if f.name != "account_id"]
        assert sorted(covered) == sorted(expected), section
    assert {s.section for s in SCHEMA} == set(classes)
    for setting in SCHEMA:
        assert setting.help and setting.help.endswith("."), setting.key
        # Files the daemon reads itself later (token files it rewrites, a public key).
        read_later = ("twitch_token_file", "streamelements_token_file", "webhook_public_key_file")
        is_secret_file = setting.key.endswith("_file") and setting.key not in read_later
        assert setting.secret == is_secret_file, setting.key


def test_a_full_valid_file_loads(tmp_path: Path) -> None:
    token = tmp_path / "tok.json"
    token.write_text("{}")
    cfg = load(write(tmp_path, f"""
[daemon]
instance_id = replica-a
state_dir = /srv/lumio
log_level = DEBUG
shard = 2/3
spool_max_bytes = 1000
shutdown_timeout_secs = 7.5

[redis]
url = unix:///run/redis/redis.sock?db=2

[timescale]
dsn = postgres:///lumio?host=/run/postgresql
statement_timeout_secs = 0
connect_timeout_secs = 2
tcp_user_timeout_secs = 0
migration_retries = 0

[metrics]
listen = [::1]:0

[http]
listen = localhost:8080

[twitch]
eventsub_ws_url = ws://127.0.0.1:8081/ws
helix_url = http://127.0.0.1:8081/helix
client_id = abc123
keepalive_timeout_secs = 600

[jetstream]
collections = app.bsky.feed.post ,app.bsky.graph.*,  app.bsky.feed.like
rewind_secs = .5

[account.20]
bluesky_did = did:web:example.com

[account.3]
twitch_user_id = 42
twitch_token_file = {token}
"""), {})
    assert cfg.daemon.instance_id == "replica-a"
    assert cfg.daemon.state_dir == Path("/srv/lumio")
    assert cfg.daemon.log_level == "debug"
    assert (cfg.daemon.shard_index, cfg.daemon.shard_count) == (2, 3)
    assert cfg.daemon.shutdown_timeout_secs == 7.5
    assert cfg.timescale.statement_timeout_secs == 0.0
    assert cfg.timescale.migration_retries == 0
    assert (cfg.metrics.listen_host, cfg.metrics.listen_port) == ("::1", 0)
    assert (cfg.http.listen_host, cfg.http.listen_port) == ("localhost", 8080)
    assert cfg.twitch.keepalive_timeout_secs == 600
    assert cfg.jetstream.collections == ("app.bsky.feed.post", "app.bsky.graph.*", "app.bsky.feed.like")
    assert cfg.jetstream.rewind_secs == 0.5
    assert [a.account_id for a in cfg.accounts] == [3, 20]  # sorted by id
    assert cfg.accounts[0] == AccountConfig(3, "42", token, None)
    assert cfg.accounts[1] == AccountConfig(20, None, None, "did:web:example.com")
    lines = redacted_lines(cfg)
    assert "metrics.listen = [::1]:0" in lines
    assert "daemon.shard = 2/3" in lines
    assert "jetstream.collections = app.bsky.feed.post, app.bsky.graph.*, app.bsky.feed.like" in lines
    assert f"account.3.twitch_token_file = {token}" in lines


def test_config_objects_are_frozen(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ""), {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.redis.url = "redis://elsewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.accounts = ()  # type: ignore[misc]


# --------------------------------------------------------------------------- file-level errors


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.ini")
    with pytest.raises(ConfigError) as info:
        load(path, {})
    assert str(info.value) == f"{path}: file not found"


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "dir.ini").mkdir()
    with pytest.raises(ConfigError) as info:
        load(str(tmp_path / "dir.ini"), {})
    assert str(info.value).startswith(f"{tmp_path / 'dir.ini'}: cannot read the file")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.ini"
    path.write_bytes(b"[twitch]\nclient_id = caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load(str(path), {})
    assert str(info.value).startswith(f"{path}: not UTF-8")


def test_duplicate_key_names_section_key_and_line(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[redis]\nurl = redis://a/0\n\nurl = redis://b/0\n", "redis", "url")
    assert "line 4" in line


def test_duplicate_section_names_the_line(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[chat]\n[events]\n[chat]\n", "chat", "")
    assert "line 3" in line


def test_parse_error_names_the_line_not_its_content(tmp_path: Path) -> None:
    err = problems(tmp_path, f"[redis]\nurl = redis://a/0\n{SENTINEL}\n")
    assert len(err.problems) == 1
    assert str(err).startswith(f"{tmp_path / 'ingestd.ini'}: line 3:")
    assert SENTINEL not in str(err)


def test_key_before_any_section(tmp_path: Path) -> None:
    err = problems(tmp_path, "pool_size = 5\n[timescale]\n")
    assert "line 1" in str(err) and "section" in str(err)


# --------------------------------------------------------------------------- sections and keys


def test_unknown_section_suggests_the_right_one(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[timescal]\npool_size = 5\n", "timescal", "")
    assert "unknown section" in line and "[timescale]" in line


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[chat]\nflush_intervall_secs = 5\n", "chat", "flush_intervall_secs")
    assert "unknown key" in line and "flush_interval_secs" in line


def test_a_secret_written_inline_is_refused_without_echoing_it(tmp_path: Path) -> None:
    line = one_problem(tmp_path, f"[redis]\npassword = {SENTINEL}\n", "redis", "password")
    assert "password_file" in line
    assert SENTINEL not in line


@pytest.mark.parametrize("name", ["account.x", "acount.1", "account.0", "account.01", "account.-1",
                                  "Account.1", "account", "account.1.2", "account.99999999999999999999"])
def test_misnamed_account_sections(tmp_path: Path, name: str) -> None:
    line = one_problem(tmp_path, f"[{name}]\ntwitch_user_id = 1\n", name, "")
    assert "account" in line


def test_default_section_is_rejected(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[DEFAULT]\npool_size = 9\n[timescale]\n", "DEFAULT", "")
    assert "[DEFAULT]" in line


def test_configparsers_renamed_default_section_is_rejected_too(tmp_path: Path) -> None:
    err = problems(tmp_path, "[__no_default__]\npool_size = 9\n[timescale]\n")
    assert len(err.problems) == 1 and err.problems[0].section == "__no_default__"


def test_account_keys_are_checked(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[account.7]\ntwitch_user = 1\n", "account.7", "twitch_user")
    assert "twitch_user_id" in line


# --------------------------------------------------------------------------- values


BAD_VALUES = [
    # section, key, value, a fragment the message must contain
    ("timescale", "pool_size", "five", 'expected a whole number >= 1, got "five"'),
    ("timescale", "pool_size", "0", 'expected a whole number >= 1, got "0"'),
    ("timescale", "pool_size", "-3", 'got "-3"'),
    ("timescale", "pool_size", "2.5", 'got "2.5"'),
    ("timescale", "pool_size", "", "got an empty value"),
    ("timescale", "connect_timeout_secs", "1", "whole number of seconds >= 2"),
    ("timescale", "keepalive_idle_secs", "0", ">= 1"),
    ("timescale", "migration_retries", "-1", ">= 0"),
    ("timescale", "statement_timeout_secs", "-1", "number of seconds >= 0"),
    ("timescale", "dsn", "mysql://x/y", "postgresql://"),
    ("timescale", "dsn", "postgresql://h:99999/db", "postgresql://"),
    ("daemon", "spool_max_bytes", "1G", "whole number"),
    ("daemon", "shutdown_timeout_secs", "0", "number of seconds > 0"),
    ("daemon", "shutdown_timeout_secs", "inf", 'got "inf"'),
    ("daemon", "shutdown_timeout_secs", "nan", 'got "nan"'),
    ("daemon", "shutdown_timeout_secs", "1e3", 'got "1e3"'),
    ("daemon", "shard", "1/1", "INDEX/COUNT"),
    ("daemon", "shard", "0/0", "INDEX/COUNT"),
    ("daemon", "shard", "1", "INDEX/COUNT"),
    ("daemon", "shard", "a/b", "INDEX/COUNT"),
    ("daemon", "log_level", "verbose", "debug, info, warning, error"),
    ("daemon", "state_dir", "var/lib/x", "absolute path"),
    ("daemon", "instance_id", "has space", "without spaces"),
    ("daemon", "instance_id", "a{b}", "braces"),
    # The drain's and flush thread N's in-flight owners (chat/lists.py): taken for them.
    ("daemon", "instance_id", "web-1.dl",
     'expected an id not ending in ".dl" or ".f" and a number (they name this instance\'s worker '
     'lists), got "web-1.dl"'),
    ("daemon", "instance_id", "web-1.f3", 'worker lists), got "web-1.f3"'),
    ("chat", "flush_workers", "0", 'expected a whole number from 1 to 16, got "0"'),
    ("chat", "flush_workers", "17", 'expected a whole number from 1 to 16, got "17"'),
    ("redis", "url", "http://127.0.0.1:6379/0", "redis://, rediss:// or unix://"),
    ("redis", "url", "redis://127.0.0.1:port/0", "redis://"),
    ("redis", "url", "redis://127.0.0.1:6379/zero", "database number"),
    ("redis", "url", "redis:///0", "with a host"),
    ("redis", "url", "unix://relative.sock", "unix:///"),
    ("redis", "sentinels", "10.0.0.1", 'got "10.0.0.1" in "10.0.0.1"'),
    ("redis", "sentinels", "10.0.0.1:26379,", "an empty entry"),
    ("redis", "sentinels", "10.0.0.1:26379,10.0.0.2:99999", 'got "10.0.0.2:99999"'),
    ("redis", "sentinels", "::1:26379", 'got "::1:26379"'),
    ("redis", "sentinels", "a:1,a:1", "listed twice"),
    ("redis", "sentinel_service", "my master", "a Sentinel service name"),
    ("redis", "min_replicas_acked", "-1", "expected a whole number from 0 to 16"),
    ("redis", "replica_ack_timeout_ms", "0", "expected a whole number of milliseconds from 1"),
    ("redis", "socket_timeout_secs", "two", "number of seconds > 0"),
    ("chat", "deadletter_ttl_hours", "0", "number of hours > 0"),
    ("chat", "retention_days", "0", "whole number of days >= 1"),
    ("events", "insert_timeout_secs", "-0.5", "number of seconds > 0"),
    ("metrics", "listen", "9464", "HOST:PORT"),
    ("metrics", "listen", "127.0.0.1:65536", "HOST:PORT"),
    ("metrics", "listen", "127.0.0.1:", "HOST:PORT"),
    ("metrics", "listen", ":9464", "HOST:PORT"),
    ("metrics", "listen", "::1:9464", "brackets"),
    ("metrics", "listen", "[127.0.0.1]:9464", "HOST:PORT"),
    ("metrics", "listen", "bad_host!:1", "HOST:PORT"),
    ("http", "listen", "localhost:http", "HOST:PORT"),
    ("twitch", "eventsub_ws_url", "https://eventsub.wss.twitch.tv/ws", "ws:// or wss://"),
    ("twitch", "helix_url", "wss://api.twitch.tv/helix", "http:// or https://"),
    ("twitch", "oauth_url", "id.twitch.tv/oauth2", "http:// or https://"),
    ("twitch", "oauth_url", "https:///oauth2", "with a host"),
    ("twitch", "client_id", "has space", "without spaces"),
    ("twitch", "keepalive_timeout_secs", "9", "from 10 to 600"),
    ("twitch", "keepalive_timeout_secs", "601", "from 10 to 600"),
    ("jetstream", "url", "http://jetstream.example/subscribe", "ws:// or wss://"),
    ("jetstream", "collections", "app.bsky.feed.post, post", 'got "post"'),
    ("jetstream", "collections", "app.bsky.feed.post,", "empty entry"),
    ("jetstream", "collections", "app.bsky.feed.post, app.bsky.feed.post", "twice"),
    ("jetstream", "collections", "app.bsky.feed.po st", "NSID"),
    ("jetstream", "rewind_secs", "-1", ">= 0"),
    ("account.1", "twitch_user_id", "someone", "numeric Twitch user id"),
    ("account.1", "bluesky_did", "plc:abc", "did:"),
]


@pytest.mark.parametrize(("section", "key", "value", "fragment"), BAD_VALUES,
                         ids=[f"{s}.{k}={v}" for s, k, v, _ in BAD_VALUES])
def test_bad_values(tmp_path: Path, section: str, key: str, value: str, fragment: str) -> None:
    line = one_problem(tmp_path, f"[{section}]\n{key} = {value}\n", section, key)
    assert fragment in line, line
    assert ": expected" in line or "comments" in line or "twice" in line


def test_sentinels_are_read_as_addresses_and_exclude_a_cluster(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, "[redis]\nsentinels = 10.0.0.1:26379, [::1]:26380\n"
                               "min_replicas_acked = 1\n"), {})
    assert cfg.redis.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert cfg.redis.min_replicas_acked == 1 and cfg.redis.sentinel_service == "mymaster"
    line = one_problem(tmp_path, "[redis]\nsentinels = 10.0.0.1:26379\ncluster = true\n",
                       "redis", "sentinels")
    assert "cluster = true too" in line
    line = one_problem(tmp_path, "[redis]\nsentinels = 10.0.0.1:26379\n"
                                 "url = unix:///run/redis.sock\n", "redis", "sentinels")
    assert "redis:// or rediss://" in line


def test_the_message_quotes_what_was_got(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[timescale]\npool_size = five\n", "timescale", "pool_size")
    expected = 'expected a whole number >= 1, got "five"'
    assert line == f'{tmp_path / "ingestd.ini"}: [timescale] pool_size: {expected}'


@pytest.mark.parametrize("value", ["redis://127.0.0.1:6379/0 ; local", "redis://127.0.0.1:6379/0\t# local",
                                   "# redis://127.0.0.1:6379/0", "; nothing"])
def test_inline_comments_are_refused(tmp_path: Path, value: str) -> None:
    line = one_problem(tmp_path, f"[redis]\nurl = {value}\n", "redis", "url")
    assert "comments must be on their own line" in line


def test_a_hash_inside_a_value_is_not_a_comment(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, "[twitch]\nclient_id = abc#def\n"), {})
    assert cfg.twitch.client_id == "abc#def"


def test_continuation_lines_are_refused(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[jetstream]\ncollections = app.bsky.feed.post,\n  app.bsky.feed.like\n",
                       "jetstream", "collections")
    assert "one line" in line


def test_quoted_values_are_refused(tmp_path: Path) -> None:
    line = one_problem(tmp_path, '[daemon]\nlog_level = "info"\n', "daemon", "log_level")
    assert "without quotes" in line


def test_percent_signs_are_literal(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, "[daemon]\ninstance_id = a%(b)s\n"), {})
    assert cfg.daemon.instance_id == "a%(b)s"


def test_keys_are_case_insensitive_sections_are_not(tmp_path: Path) -> None:
    assert load(write(tmp_path, "[timescale]\nPool_Size = 7\n"), {}).timescale.pool_size == 7
    one_problem(tmp_path, "[Timescale]\npool_size = 7\n", "Timescale", "")


def test_every_problem_is_reported_together(tmp_path: Path) -> None:
    err = problems(tmp_path, """
[timescale]
pool_size = five
statement_timeout_secs = soon

[chat]
flush_intervall_secs = 5

[metrics]
listen = nowhere

[acount.1]

[account.2]
twitch_user_id = abc
bluesky_did = nope

[jetstream]
url = wss://x/subscribe ; eu
""")
    where = [(p.section, p.key) for p in err.problems]
    assert where == [
        ("timescale", "pool_size"), ("timescale", "statement_timeout_secs"),
        ("chat", "flush_intervall_secs"),
        ("metrics", "listen"),
        ("acount.1", ""),
        ("account.2", "twitch_user_id"), ("account.2", "bluesky_did"),
        ("jetstream", "url"),
    ]
    lines = str(err).splitlines()
    assert len(lines) == len(where)
    assert all(line.startswith(str(tmp_path / "ingestd.ini") + ": [") for line in lines)


def test_problems_across_keys(tmp_path: Path) -> None:
    token = tmp_path / "token.json"
    token.write_text("{}")
    line = one_problem(tmp_path, f"[account.4]\ntwitch_token_file = {token}\n",
                       "account.4", "twitch_token_file")
    assert "twitch_user_id" in line
    line = one_problem(tmp_path, "[account.1]\ntwitch_user_id = 5\n[account.2]\ntwitch_user_id = 5\n",
                       "account.2", "twitch_user_id")
    assert "[account.1]" in line


def test_compression_out_of_reach_of_late_replays(tmp_path: Path) -> None:
    """A chunk a 72 h replay can still reach is never compressed: the floor is the
    dead-letter horizon plus one (events') chunk interval, 72 + 168 h."""
    for hours in ("1", "72", "100", "240"):
        line = one_problem(tmp_path, f"[timescale]\ncompress_after_hours = {hours}\n",
                           "timescale", "compress_after_hours")
        assert "late replay" in line and "72 h late" in line and "more than 240" in line, line
    # a longer chat dead-letter TTL raises the floor with it
    line = one_problem(tmp_path, "[timescale]\ncompress_after_hours = 250\n"
                                 "[chat]\ndeadletter_ttl_hours = 96\n", "timescale", "compress_after_hours")
    assert "96 h late" in line and "more than 264" in line, line
    assert load(write(tmp_path, "[timescale]\ncompress_after_hours = 0\n"), {}).timescale \
        .compress_after_hours == 0
    assert load(write(tmp_path, "[timescale]\ncompress_after_hours = 240.5\n"), {}).timescale \
        .compress_after_hours == 240.5


# --------------------------------------------------------------------------- secrets


def test_secret_never_shows_itself() -> None:
    secret = Secret(SENTINEL)
    assert repr(secret) == str(secret) == f"{secret}" == "***"
    assert secret.reveal() == SENTINEL
    assert secret == Secret(SENTINEL)
    assert secret != Secret("other")
    assert secret != SENTINEL
    assert hash(secret) == hash(Secret(SENTINEL))


def test_secret_from_an_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "emit").write_text(SENTINEL + "\n")
    (tmp_path / "redis").write_text(SENTINEL + "-r\r\n\n")
    cfg = load(write(tmp_path, f"[http]\nemit_token_file = {tmp_path / 'emit'}\n"
                               f"[redis]\npassword_file = {tmp_path / 'redis'}\n"), {})
    assert cfg.http.emit_token == Secret(SENTINEL)
    assert cfg.redis.password is not None and cfg.redis.password.reveal() == SENTINEL + "-r"


def test_secret_from_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "db_password").write_text(SENTINEL)
    (creds / "hook").write_text("0123456789abcdef\n")
    token = creds / "acct1.json"
    token.write_text("{}")
    cfg = load(write(tmp_path, "[timescale]\npassword_file = db_password\n"
                               "[twitch]\nwebhook_secret_file = hook\n"
                               "[account.1]\ntwitch_user_id = 1\ntwitch_token_file = acct1.json\n"),
               {"CREDENTIALS_DIRECTORY": str(creds)})
    assert cfg.timescale.password == Secret(SENTINEL)
    assert cfg.twitch.webhook_secret == Secret("0123456789abcdef")
    assert cfg.accounts[0].twitch_token_file == token


def test_relative_secret_without_credentials_directory(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Set in the process environment, but load() must only look at its argument.
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    (tmp_path / "emit").write_text(SENTINEL)
    line = one_problem(tmp_path, "[http]\nemit_token_file = emit\n", "http", "emit_token_file")
    assert "CREDENTIALS_DIRECTORY" in line and "emit" in line


def test_relative_path_with_a_slash_is_refused(tmp_path: Path) -> None:
    line = one_problem(tmp_path, "[http]\nemit_token_file = creds/emit\n", "http", "emit_token_file",
                       {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert "absolute path" in line


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "newline-only", "binary", "huge"])
def test_unreadable_secret_files(tmp_path: Path, case: str) -> None:
    path = tmp_path / "secret"
    if case == "directory":
        path.mkdir()
    elif case == "empty":
        path.write_text("")
    elif case == "newline-only":
        path.write_text("\n")
    elif case == "binary":
        path.write_bytes(SENTINEL.encode() + b"\xff\xfe")
    elif case == "huge":
        path.write_text(SENTINEL * 10000)
    line = one_problem(tmp_path, f"[twitch]\nclient_secret_file = {path}\n", "twitch", "client_secret_file")
    assert str(path) in line
    assert SENTINEL not in line


def test_unreadable_token_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    line = one_problem(tmp_path, f"[account.1]\ntwitch_user_id = 1\ntwitch_token_file = {path}\n",
                       "account.1", "twitch_token_file")
    assert str(path) in line and "cannot read" in line


def test_webhook_secret_length_is_checked_without_showing_it(tmp_path: Path) -> None:
    (tmp_path / "hook").write_text("short")
    line = one_problem(tmp_path, f"[twitch]\nwebhook_secret_file = {tmp_path / 'hook'}\n",
                       "twitch", "webhook_secret_file")
    assert "10 to 100" in line and "short" not in line


def test_secrets_and_url_passwords_stay_out_of_repr_and_redacted_lines(tmp_path: Path) -> None:
    for name in ("emit", "client", "hook", "db"):
        (tmp_path / name).write_text(f"{SENTINEL}-{name}-0123456789\n")
    cfg = load(write(tmp_path, f"""
[redis]
url = rediss://user:{SENTINEL}@redis.example:6380/1
[timescale]
dsn = postgresql://lumio@db.example/lumio?password={SENTINEL}
[http]
emit_token_file = {tmp_path / 'emit'}
[twitch]
client_secret_file = {tmp_path / 'client'}
webhook_secret_file = {tmp_path / 'hook'}
"""), {})
    assert cfg.redis.url.startswith(f"rediss://user:{SENTINEL}@")  # the real value is kept
    assert SENTINEL not in repr(cfg)
    assert SENTINEL not in str(cfg)
    lines = redacted_lines(cfg)
    assert SENTINEL not in "\n".join(lines)
    assert "redis.url = rediss://user:***@redis.example:6380/1" in lines
    assert "timescale.dsn = postgresql://lumio@db.example/lumio?password=***" in lines
    for key in ("http.emit_token_file", "twitch.client_secret_file", "twitch.webhook_secret_file"):
        assert f"{key} = ***" in lines
    assert "redis.password_file =" in lines  # unset


def test_url_passwords_stay_out_of_error_messages(tmp_path: Path) -> None:
    line = one_problem(tmp_path, f"[redis]\nurl = http://u:{SENTINEL}@h/0\n", "redis", "url")
    assert SENTINEL not in line and "***" in line
    line = one_problem(tmp_path, f"[timescale]\ndsn = postgresql://u:{SENTINEL}@h/db # x\n",
                       "timescale", "dsn")
    assert SENTINEL not in line


def test_password_in_url_and_in_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("x")
    line = one_problem(tmp_path, f"[redis]\nurl = redis://:p@h/0\npassword_file = {tmp_path / 'pw'}\n",
                       "redis", "url")
    assert "password_file" in line


# --------------------------------------------------------------------------- output, errors, path


def test_redacted_lines_list_every_key(tmp_path: Path) -> None:
    lines = redacted_lines(load(str(EXAMPLE), {}))
    keys = [line.split(" = ")[0].split(" =")[0] for line in lines]
    expected = [f"{s.section}.{s.key}" for s in SCHEMA if s.section != ACCOUNT_SECTION]
    expected += [f"account.1.{s.key}" for s in SCHEMA if s.section == ACCOUNT_SECTION]
    assert keys == expected
    assert "chat.flush_interval_secs = 5" in lines
    assert "timescale.statement_timeout_secs = 30" in lines


def test_problem_and_error_formatting() -> None:
    assert str(ConfigProblem("/f.ini", "redis", "url", "bad")) == "/f.ini: [redis] url: bad"
    assert str(ConfigProblem("/f.ini", "s.1", "", "unknown section")) == "/f.ini: [s.1]: unknown section"
    assert str(ConfigProblem("/f.ini", "", "", "file not found")) == "/f.ini: file not found"
    err = ConfigError([ConfigProblem("/f", "a", "b", "one"), ConfigProblem("/f", "c", "d", "two")])
    assert str(err) == "/f: [a] b: one\n/f: [c] d: two"
    assert isinstance(err.problems, tuple)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.problems == err.problems


def test_resolve_path_precedence() -> None:
    env = {"LUMIO_INGESTD_CONFIG": "/from/env.ini"}
    assert resolve_path("/from/cli.ini", env) == "/from/cli.ini"
    assert resolve_path(None, env) == "/from/env.ini"
    assert resolve_path(None, {}) == DEFAULT_PATH == "/etc/lumio/ingestd.ini"
    assert resolve_path(None, {"LUMIO_INGESTD_CONFIG": ""}) == DEFAULT_PATH


def test_resolve_path_ignores_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUMIO_INGESTD_CONFIG", "/from/process.ini")
    assert resolve_path(None, {}) == DEFAULT_PATH


def test_only_the_loader_reads_the_environment() -> None:
    source = "".join(p.read_text() for p in Path(config_module.__file__).parent.glob("*.py"))
    assert "os.environ" not in source.replace("`os.environ`", "")
    assert "getenv" not in source


def test_the_example_file_connects_to_no_platform() -> None:
    """Shipped as is, the example must not ingest anybody's channel: every platform that needs no
    credential to connect (Kick's Pusher socket, 7TV, Jetstream) is off, and the others lack
    their secrets (Twitch: client_id; StreamElements: the token file)."""
    cfg = load(str(EXAMPLE), {})
    assert cfg.accounts, "the example shows an account"
    assert not cfg.twitch.client_id and not cfg.jetstream.collections and not cfg.seventv.enabled
    for account in cfg.accounts:
        assert account.kick_chatroom_id is None and account.kick_channel_id is None
        assert account.streamelements_token_file is None and account.twitch_token_file is None
