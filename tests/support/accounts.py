"""Helpers for the account tests: the stand-in Twitch's accounts, a chat pump, the oracles.

`Pump` sends chat to every listed account's current session from its own
thread the whole time a test runs, and records which session each message
went to (the stand-in is the platform: what it sent into a socket is what the
daemon was given).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg2

from lumio_ingestd.devkit.standins.twitch import StandinError, StandinSession, TwitchStandin
from lumio_ingestd.devkit.standins.twitch_events import chat_event

CHAT = "channel.chat.message"


def token_file(path: Path, fake: TwitchStandin) -> Path:
    path.write_text(json.dumps({"access_token": fake.access_token, "refresh_token": fake.refresh_token}))
    path.chmod(0o600)
    return path


def broadcaster(account: int) -> str:
    return str(1000 + account)


def account_section(tmp_path: Path, fake: TwitchStandin, account: int, token: str = "t") -> dict[str, object]:
    return {"twitch_user_id": broadcaster(account),
            "twitch_token_file": token_file(tmp_path / f"token-{account}-{token}.json", fake)}


class Pump:
    """Sends chat to every listed account's current session, recording what went out where."""

    def __init__(self, fake: TwitchStandin, accounts: list[int], *, period_secs: float = 0.01) -> None:
        self.fake = fake
        self.period_secs = period_secs
        self.accounts = list(accounts)
        self.sent: dict[str, tuple[int, float, str]] = {}  # message id -> (account, at, session id)
        self._stop = threading.Event()
        self._n = 0
        self._thread = threading.Thread(target=self._run, name="test-pump")

    def __enter__(self) -> Pump:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_secs):
            for account in list(self.accounts):
                self._n += 1
                message_id = f"m-{account}-{self._n}"
                session = self.fake.active_session(CHAT, broadcaster(account))
                if session is None:
                    continue
                try:
                    self.fake.notify(CHAT, chat_event(message_id, broadcaster=broadcaster(account)),
                                     session=session, message_id=message_id)
                except StandinError:
                    continue
                self.sent[message_id] = (account, time.monotonic(), session.id)

    def ids(self, account: int, before: float | None = None, after: float | None = None) -> set[str]:
        return {m for m, (a, at, _s) in list(self.sent.items()) if a == account
                and (before is None or at < before) and (after is None or at > after)}


def sessions_of(fake: TwitchStandin, account: int) -> list[StandinSession]:
    """Every session that subscribed to the account's chat, oldest first."""
    return [s for s in list(fake.sessions)
            if s.subscriptions.get(CHAT, {}).get("condition", {}).get("broadcaster_user_id")
            == broadcaster(account)]


def subscribed(fake: TwitchStandin, account: int) -> StandinSession | None:
    return fake.active_session(CHAT, broadcaster(account))


def stored_chat(pg_url: str) -> Counter[str]:
    conn = psycopg2.connect(pg_url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT message_id FROM chat_messages")
            return Counter(r[0] for r in cur.fetchall())
    finally:
        conn.close()
