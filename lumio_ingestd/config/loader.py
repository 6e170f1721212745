"""Reading `/etc/lumio/ingestd.ini`: `load()` checks every value and builds `Config`.

The only code that reads the configuration file, the secret files and the
environment (only through its `environ` argument). All problems are collected
into one `ConfigError`. Nothing durable here.
"""

from __future__ import annotations

import configparser
import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lumio_ingestd.config.kinds import (
    ACCOUNT_SECTION,
    DEFAULT_PATH,
    ENV_CONFIG,
    ConfigError,
    ConfigProblem,
    _Context,
    _Invalid,
    _url_has_password,
)
from lumio_ingestd.config.schema import _ACCOUNT_NAME, _BY_SECTION, _FIXED_SECTIONS, Setting
from lumio_ingestd.config.sections import (
    _SECTION_CLASSES,
    CHUNK_INTERVAL_HOURS,
    DEADLETTER_HORIZON_HOURS,
    AccountConfig,
    Config,
    min_compress_after_hours,
)

# ---------------------------------------------------------------------------
# Loading


def resolve_path(cli_path: str | None, environ: Mapping[str, str]) -> str:
    """The config file to read: `-c PATH`, else $LUMIO_INGESTD_CONFIG (if not empty), else DEFAULT_PATH."""
    if cli_path is not None:
        return cli_path
    return environ.get(ENV_CONFIG) or DEFAULT_PATH


def _read(path: str, problems: list[ConfigProblem]) -> configparser.ConfigParser | None:
    """Parse the file; on failure record why (with the line configparser gives) and return None."""
    parser = configparser.ConfigParser(
        interpolation=None,
        strict=True,
        empty_lines_in_values=False,
        default_section="__no_default__",
        inline_comment_prefixes=None,
    )

    def problem(message: str, section: str = "", key: str = "") -> None:
        problems.append(ConfigProblem(path, section, key, message))

    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        problem("file not found")
    except OSError as e:
        problem(f"cannot read the file: {e.strerror or type(e).__name__}")
    except UnicodeDecodeError as e:
        problem(f"not UTF-8 text (byte {e.start})")
    except configparser.DuplicateOptionError as e:
        problem(f"line {e.lineno}: set twice in this section", e.section, e.option)
    except configparser.DuplicateSectionError as e:
        problem(f"line {e.lineno}: section appears twice", e.section)
    except configparser.MissingSectionHeaderError as e:
        problem(f"line {e.lineno}: a key before the first [section] header")
    except configparser.ParsingError as e:
        for lineno, _line in e.errors:
            # The line itself is not shown: it may be a pasted secret.
            problem(f'line {lineno}: expected a "[section]" header, a "key = value" line or a comment')
    except configparser.Error as e:
        problem(f"cannot parse the file: {e.message}")
    else:
        return parser
    return None


def _check_raw(raw: str, setting: Setting) -> None:
    """Mistakes of form, before the value's own parser sees it."""
    shown = setting.kind.show(raw)
    if "\n" in raw:
        raise _Invalid(
            "a value must be on one line (an indented line continues the previous value), "
            f'got "{shown.replace(chr(10), chr(92) + "n")}"'
        )
    if raw[:1] in ("#", ";") or re.search(r"\s[#;]", raw):
        raise _Invalid(f'comments must be on their own line, got "{shown}"')
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        raise _Invalid(f'write values without quotes, got {shown}')


def _unknown_key(section: str, key: str, known: Mapping[str, Setting]) -> str:
    if f"{key}_file" in known:
        return f"unknown key; secrets are read from files: use {key}_file"
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f'did you mean "{close[0]}"?' if close else f"known keys: {', '.join(known)}"
    return f"unknown key ({hint})"


def _unknown_section(name: str) -> str:
    if name == "DEFAULT":
        return "a [DEFAULT] section is not supported; set each key in its own section"
    if name.lower().startswith("account"):
        return (
            "account sections are named [account.N] with N the account id, a positive "
            "whole number without leading zeros, like [account.1]"
        )
    close = difflib.get_close_matches(name, [*_FIXED_SECTIONS, "account.1"], n=1)
    hint = f"did you mean [{close[0]}]?" if close else "known sections: " + ", ".join(
        f"[{s}]" for s in (*_FIXED_SECTIONS, "account.N")
    )
    return f"unknown section ({hint})"


def _parse_section(
    path: str,
    section: str,
    schema_section: str,
    items: Iterable[tuple[str, str]],
    ctx: _Context,
    problems: list[ConfigProblem],
) -> dict[str, Any] | None:
    """Field values of one section, defaults filled in; None if any key had a problem."""
    known = _BY_SECTION[schema_section]
    given: dict[str, str] = {}
    ok = True
    for key, raw in items:
        if key not in known:
            problems.append(ConfigProblem(path, section, key, _unknown_key(section, key, known)))
            ok = False
        else:
            given[key] = raw
    values: dict[str, Any] = {}
    for key, setting in known.items():
        raw = given.get(key, setting.default)
        try:
            if key in given:
                _check_raw(raw, setting)
            value = setting.kind.parse(raw, ctx)
        except _Invalid as e:
            problems.append(ConfigProblem(path, section, key, str(e)))
            ok = False
            continue
        if len(setting.fields) == 1:
            values[setting.fields[0]] = value
        else:
            values.update(zip(setting.fields, value, strict=True))
    return values if ok else None


def load(path: str, environ: Mapping[str, str]) -> Config:
    """Read and check the config file at `path`; raise ConfigError listing every problem.

    `environ` is consulted only for $CREDENTIALS_DIRECTORY (bare names of secret files).
    """
    problems: list[ConfigProblem] = []
    parser = _read(path, problems)
    if parser is None:
        raise ConfigError(problems)
    ctx = _Context(environ=environ)

    # Anything in the renamed default section would feed every section: reject it.
    if parser.defaults():
        problems.append(ConfigProblem(path, parser.default_section, "", _unknown_section("DEFAULT")))
        for key in list(parser.defaults()):
            parser.remove_option(parser.default_section, key)

    sections: dict[str, dict[str, Any] | None] = {}
    accounts: list[AccountConfig] = []
    for name in parser.sections():
        items = parser.items(name, raw=True)
        account = _ACCOUNT_NAME.fullmatch(name)
        if name in _BY_SECTION and name != ACCOUNT_SECTION:
            sections[name] = _parse_section(path, name, name, items, ctx, problems)
        elif account and int(account.group(1)) < 2**63:
            values = _parse_section(path, name, ACCOUNT_SECTION, items, ctx, problems)
            if values is not None:
                accounts.append(AccountConfig(account_id=int(account.group(1)), **values))
        else:
            problems.append(ConfigProblem(path, name, "", _unknown_section(name)))
    for name in _FIXED_SECTIONS:
        if name not in sections:
            sections[name] = _parse_section(path, name, name, (), ctx, problems)

    origins = {a.account_id: path for a in accounts}
    daemon = sections.get("daemon")
    if daemon is not None:
        accounts += _load_accounts_dir(daemon["accounts_dir"], origins, ctx, problems)
    accounts.sort(key=lambda a: a.account_id)
    _check_across(path, sections, accounts, problems, origins)
    if problems:
        raise ConfigError(problems)
    built = {name: _SECTION_CLASSES[name](**values) for name, values in sections.items() if values}
    return Config(path=path, accounts=tuple(accounts), **built)


def _check_across(
    path: str,
    sections: Mapping[str, Mapping[str, Any] | None],
    accounts: list[AccountConfig],
    problems: list[ConfigProblem],
    origins: Mapping[int, str] | None = None,
) -> None:
    """Rules that involve more than one key (an account's problem names its own file)."""
    for section, url_key in (("redis", "url"), ("timescale", "dsn")):
        values = sections.get(section)
        if values and values["password"] is not None and _url_has_password(values[url_key]):
            problems.append(
                ConfigProblem(path, section, url_key,
                              "has a password and password_file is set too; keep only password_file")
            )
    redis_values = sections.get("redis")
    if redis_values and redis_values["sentinels"] and redis_values["cluster"]:
        problems.append(ConfigProblem(path, "redis", "sentinels",
                                      "is set and cluster = true too; a Redis Cluster fails over "
                                      "by itself: keep only one of them"))
    if redis_values and redis_values["sentinels"] and redis_values["url"].startswith("unix:"):
        problems.append(ConfigProblem(path, "redis", "sentinels",
                                      "is set but url is a unix:// socket; with Sentinels url must "
                                      "be redis:// or rediss:// (its host and port are not used)"))
    _check_compression(path, sections, problems)
    owners: dict[tuple[str, str], int] = {}
    for account in accounts:
        section = f"account.{account.account_id}"
        where = (origins or {}).get(account.account_id, path)
        for needs, key in (("twitch_token_file", "twitch_user_id"),
                           ("streamelements_token_file", "streamelements_channel_id")):
            if getattr(account, needs) is not None and getattr(account, key) is None:
                problems.append(ConfigProblem(where, section, needs, f"is set but {key} is not"))
        for key in ("twitch_user_id", "bluesky_did", "kick_broadcaster_user_id", "kick_chatroom_id",
                    "kick_channel_id", "streamelements_channel_id", "seventv_emote_set_id"):
            value = getattr(account, key)
            if value is None:
                continue
            first = owners.setdefault((key, value), account.account_id)
            if first != account.account_id:
                problems.append(
                    ConfigProblem(where, section, key, f'"{value}" is also the {key} of [account.{first}]'
                                  + _in_file(origins, first, where))
                )


def _check_compression(path: str, sections: Mapping[str, Mapping[str, Any] | None],
                       problems: list[ConfigProblem]) -> None:
    """A compressed chunk must be out of reach of every late replay (docs/operating.rst,
    "Compression")."""
    timescale, chat = sections.get("timescale"), sections.get("chat")
    if not timescale or not chat:
        return
    hours = timescale["compress_after_hours"]
    floor = min_compress_after_hours(chat["deadletter_ttl_hours"])
    if 0 < hours <= floor:
        horizon = max(DEADLETTER_HORIZON_HOURS, chat["deadletter_ttl_hours"])
        problems.append(ConfigProblem(
            path, "timescale", "compress_after_hours",
            f"{hours:g} h would compress chunks a late replay can still reach: dead letters and "
            f"parked events are replayed up to {horizon:g} h late, and a chunk of events spans "
            f"{CHUNK_INTERVAL_HOURS['events'] / 24:g} days; use 0 (off) or more than {floor:g}"))


def _in_file(origins: Mapping[int, str] | None, account_id: int, here: str) -> str:
    there = (origins or {}).get(account_id)
    return f" in {there}" if there is not None and there != here else ""


def _load_accounts_dir(directory: Path, origins: dict[int, str], ctx: _Context,
                       problems: list[ConfigProblem]) -> list[AccountConfig]:
    """The [account.N] sections of every *.ini in `directory` (missing: none).

    `origins` (account id -> file) gains each account read; an id already there
    is a problem naming both files.
    """
    try:
        files = sorted(p for p in directory.iterdir() if p.name.endswith(".ini") and p.is_file())
    except FileNotFoundError:
        return []
    except OSError as e:
        why = e.strerror or type(e).__name__
        problems.append(ConfigProblem(str(directory), "", "", f"[daemon] accounts_dir: cannot list: {why}"))
        return []
    accounts: list[AccountConfig] = []
    for file in files:
        name = str(file)
        parser = _read(name, problems)
        if parser is None:
            continue
        if parser.defaults():
            problems.append(ConfigProblem(name, parser.default_section, "", _unknown_section("DEFAULT")))
        for section in parser.sections():
            match = _ACCOUNT_NAME.fullmatch(section)
            if match is None or int(match.group(1)) >= 2**63:
                hint = ("only [account.N] sections belong in accounts_dir" if section in _BY_SECTION
                        else _unknown_section(section))
                problems.append(ConfigProblem(name, section, "", hint))
                continue
            account_id = int(match.group(1))
            values = _parse_section(name, section, ACCOUNT_SECTION, parser.items(section, raw=True), ctx,
                                    problems)
            first = origins.setdefault(account_id, name)
            if first != name:
                problems.append(ConfigProblem(name, section, "", f"[account.{account_id}] is also in {first}"
                                              " (an account is configured once)"))
            elif values is not None:
                accounts.append(AccountConfig(account_id=account_id, **values))
    return accounts
