"""The configuration written back: the redacted effective settings and the example file.

Nothing durable here.
"""

from __future__ import annotations

import textwrap
from typing import Any

from lumio_ingestd.config.kinds import ACCOUNT_SECTION
from lumio_ingestd.config.schema import _BY_SECTION, SCHEMA, SECTION_HELP, Setting
from lumio_ingestd.config.sections import Config

# ---------------------------------------------------------------------------
# Output: the effective config, and the example file


def redacted_lines(cfg: Config) -> list[str]:
    """The effective configuration as `section.key = value` lines, safe to print or log.

    Secrets show as `***` (empty when unset), URL passwords as `***`. Every key
    of every fixed section is listed, then every key of each account.
    """
    lines = []
    for setting in SCHEMA:
        if setting.section == ACCOUNT_SECTION:
            continue
        obj = getattr(cfg, setting.section)
        lines.append(f"{setting.section}.{setting.key} = {_render(setting, obj)}".rstrip())
    for account in cfg.accounts:
        for setting in _BY_SECTION[ACCOUNT_SECTION].values():
            lines.append(f"account.{account.account_id}.{setting.key} = {_render(setting, account)}".rstrip())
    return lines


def _render(setting: Setting, obj: Any) -> str:
    values = tuple(getattr(obj, name) for name in setting.fields)
    text = setting.kind.render(values[0] if len(values) == 1 else values)
    return setting.kind.show(text)


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=78, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


def example_ini() -> str:
    """The example configuration (etc/lumio/ingestd.ini), made from SCHEMA.

    Every key of every fixed section with its default, the secret files
    commented out, and one [account.1]. It loads with load() as it is.
    """
    out = [
        "# lumio-ingestd configuration: /etc/lumio/ingestd.ini (or -c PATH, or $LUMIO_INGESTD_CONFIG).",
        "#",
        *_comment(
            "Every key is shown with its default; a key left out has that default. Unknown "
            "sections and keys are errors. Durations are in seconds unless the key says otherwise."
        ),
        *_comment(
            'Comments go on their own line: "key = value  # note" is an error, because the '
            "note would become part of the value. Values are written without quotes."
        ),
        *_comment(
            "Secrets are never written here. A *_file key names a file holding the secret: an "
            "absolute path, or a bare name looked up in $CREDENTIALS_DIRECTORY, for example "
            "with LoadCredential=redis_password:/etc/lumio/credentials/redis_password in the unit."
        ),
        "#",
        "# Check a changed file with: lumio-ingestd -c PATH check-config",
        "# (Generated from lumio_ingestd.config.SCHEMA by example_ini(); edit that instead.)",
    ]
    for section, settings in _BY_SECTION.items():
        header = "account.1" if section == ACCOUNT_SECTION else section
        out += ["", "", *_comment(SECTION_HELP[section]), f"[{header}]"]
        for i, setting in enumerate(settings.values()):
            if i:
                out.append("")
            out += _comment(setting.help)
            line = f"{setting.key} = {setting.example}".rstrip()
            out.append(f"# {line}" if setting.commented else line)
    return "\n".join(out) + "\n"
