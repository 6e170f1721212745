"""Configuration of lumio-ingestd: `/etc/lumio/ingestd.ini` into frozen, typed objects.

This module is the only code that reads the configuration file, secret files
and the environment. `load()` reads them once at start-up, checks every value,
and builds frozen dataclasses (`Config` and one class per section). Those are
passed down to the parts that need them; nothing else looks at files or
`os.environ` for settings. Even here the environment is only the `environ`
argument (`LUMIO_INGESTD_CONFIG` in `resolve_path`, `CREDENTIALS_DIRECTORY`
in `load`), so tests can pass a dict.

The schema is one table, `SCHEMA`: for every key its section, its default as
written in the file, how it is parsed and what it means. The loader, the
dataclass defaults, the example file (`example_ini()`, shipped as
`etc/lumio/ingestd.ini`) and docs/configuration.rst are all made from it,
so they cannot drift apart. The package's modules: `kinds` (value kinds,
secrets, errors), `schema`, `sections` (the dataclasses), `loader`, `render`.

Rules the loader enforces, all problems collected into one `ConfigError`:
unknown sections and keys are errors (a typo must not be silently ignored),
comments go on their own line, every value is type-checked, and secrets are
read only from files, never from the INI file or the environment. A secret
is wrapped in `Secret`, which prints as `***`; no message ever contains one.
"""

from __future__ import annotations

from lumio_ingestd.config.kinds import ACCOUNT_SECTION, DEFAULT_PATH, ConfigError, ConfigProblem, Secret
from lumio_ingestd.config.loader import load, resolve_path
from lumio_ingestd.config.render import example_ini, redacted_lines
from lumio_ingestd.config.schema import SCHEMA, SECTION_HELP, Setting
from lumio_ingestd.config.sections import (
    AccountConfig,
    ChatConfig,
    Config,
    DaemonConfig,
    EventsConfig,
    HttpConfig,
    JetstreamConfig,
    KickConfig,
    MetricsConfig,
    RedisConfig,
    SevenTvConfig,
    StreamElementsConfig,
    StreamStatusConfig,
    SyntheticConfig,
    TimescaleConfig,
    TwitchConfig,
)

__all__ = [
    "ACCOUNT_SECTION",
    "DEFAULT_PATH",
    "SCHEMA",
    "SECTION_HELP",
    "AccountConfig",
    "ChatConfig",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "DaemonConfig",
    "EventsConfig",
    "HttpConfig",
    "JetstreamConfig",
    "KickConfig",
    "MetricsConfig",
    "RedisConfig",
    "Secret",
    "Setting",
    "SevenTvConfig",
    "StreamElementsConfig",
    "StreamStatusConfig",
    "SyntheticConfig",
    "TimescaleConfig",
    "TwitchConfig",
    "example_ini",
    "load",
    "redacted_lines",
    "resolve_path",
]
