"""Steady Twitch traffic with send times, and alert arrival times: for latency oracles.

`Traffic` writes chat notifications and every `cheer_every`-th also a
`channel.cheer` on one stand-in session from a thread of its own, at a
steady rate, and keeps each message id with the monotonic time just before
its frame was written (a chat message by its own id, a cheer by its delivery
id, which is its `external_id`). `AlertTimes` subscribes to an account's
alert channel on Redis and keeps when each alert arrived, by external id.
Both clocks are this process's CLOCK_MONOTONIC. `twitch_daemon_config` writes
the configuration of a daemon with one Twitch account on the stand-in. Used
by the black-hole tests and bench/bench_dbstall.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import redis

from lumio_ingestd.devkit.standins import twitch_events as te
from lumio_ingestd.devkit.standins.twitch import StandinError, StandinSession, TwitchStandin
from lumio_ingestd.events.alerts import alerts_channel
from support import write_ini
from support.twitch import write_token_file

#: The account `twitch_daemon_config` configures.
ACCOUNT = 42


def twitch_daemon_config(tmp: Path, name: str, twitch: TwitchStandin, *, redis_url: str, pg_url: str,
                         instance_id: str, with_account: bool = True,
                         sections: Mapping[str, Mapping[str, object]] | None = None) -> Path:
    """`tmp/name.ini`: a daemon on `redis_url` and `pg_url` with account `ACCOUNT` on the
    Twitch stand-in (none with `with_account=False`: a second run that only drains);
    `sections` adds or overrides keys per section (intervals, timeouts)."""
    secret = tmp / "client_secret"
    secret.write_text(twitch.client_secret + "\n")
    token = write_token_file(tmp / f"{name}-token.json", twitch.access_token, twitch.refresh_token)
    config: dict[str, dict[str, object]] = {
        "daemon": {"state_dir": tmp / "state", "instance_id": instance_id, "log_level": "info"},
        "redis": {"url": redis_url},
        "timescale": {"dsn": pg_url},
        "http": {"listen": "127.0.0.1:0"},
        "metrics": {"listen": "127.0.0.1:0"},
        "twitch": {"client_id": twitch.client_id, "client_secret_file": secret,
                   "eventsub_ws_url": twitch.ws_url, "helix_url": twitch.helix_url,
                   "oauth_url": twitch.oauth_url},
    }
    for section, keys in (sections or {}).items():
        config.setdefault(section, {}).update(keys)
    if with_account:
        config[f"account.{ACCOUNT}"] = {"twitch_user_id": twitch.user_id, "twitch_token_file": token}
    return write_ini(tmp / f"{name}.ini", config)


class Traffic:
    def __init__(self, twitch: TwitchStandin, session: StandinSession, *, chat_per_sec: float = 100.0,
                 cheer_every: int = 20) -> None:
        self._twitch, self._session = twitch, session
        self._rate = chat_per_sec
        self._cheer_every = cheer_every
        self._run = uuid.uuid4().hex[:6]
        self.chat: list[tuple[str, float]] = []
        self.cheers: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="test-traffic")

    def _main(self) -> None:
        started = time.monotonic()
        channel = self._twitch.user_id
        n = 0
        while not self._stop.wait(max(0.0, started + n / self._rate - time.monotonic())):
            n += 1
            try:
                if n % self._cheer_every == 0:
                    delivery = str(uuid.uuid4())
                    at = time.monotonic()
                    self._twitch.notify("channel.cheer", te.cheer_event(str(n), 100, broadcaster=channel),
                                        session=self._session, message_id=delivery)
                    self.cheers.append((delivery, at))
                mid = f"chat-{self._run}-{n}"
                at = time.monotonic()
                self._twitch.notify("channel.chat.message", te.chat_event(mid, broadcaster=channel),
                                    session=self._session, message_id=str(uuid.uuid4()))
                self.chat.append((mid, at))
            except StandinError:
                return  # the session closed: nothing more is written, nothing more is ours

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class AlertTimes:
    def __init__(self, redis_url: str, account_id: int) -> None:
        self._client = redis.Redis.from_url(redis_url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(alerts_channel(account_id))
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="test-alerts")
        self._thread.start()

    def _main(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.05)
            if message is not None:
                at = time.monotonic()
                with self._lock:
                    self._seen.setdefault(str(json.loads(message["data"])["external_id"]), at)

    def get(self, external_id: str) -> float | None:
        with self._lock:
            return self._seen.get(external_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()
        self._client.close()
