"""The StreamElements part of `lumio-ingestd demo`: a stand-in Astro gateway and tips.

- `start_astro` starts the stand-in gateway (stopped through the demo's ExitStack);
- `config_text` writes each demo account's token file and returns the
  `[streamelements]` section and the per-account lines for the daemon's config;
- `DemoTips.play` is called by the traffic timeline: every cycle one account
  gets a tip, sent as StreamElements does on both `channel.tips` and
  `channel.activities` (one `tip` row expected), and the other a follow
  activity. An item counts as sent only when the gateway had a subscribed
  socket for it, or while the daemon is away on purpose (the stand-in's REST
  history keeps it, and the daemon heals it from there).

Nothing durable here.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from lumio_ingestd.devkit.standins.streamelements import AstroStandin, activity_doc, tip_activity_doc, tip_doc

TIPS = "channel.tips"
ACTIVITIES = "channel.activities"
TOKEN = "lumio-demo-streamelements-jwt"
_DONORS = ("kind_donor", "big_fan", "night_owl", "lurker42")


def room_of(account_id: int) -> str:
    """The account's StreamElements channel id (a 24-hex document id, like the real ones)."""
    return f"5f{account_id:022x}"


def start_astro(cleanup: ExitStack) -> AstroStandin:
    astro = AstroStandin(token=TOKEN)
    astro.record_sent = False
    cleanup.callback(astro.close)
    astro.start()
    return astro


def config_text(astro: AstroStandin, secrets: Path, account_ids: Sequence[int]) -> tuple[str, dict[int, str]]:
    """The `[streamelements]` section, and each account's lines (channel id and token file)."""
    lines: dict[int, str] = {}
    for account_id in account_ids:
        path = secrets / f"streamelements-token-{account_id}.json"
        path.write_text(json.dumps({"token": TOKEN, "token_type": "jwt"}) + "\n")
        path.chmod(0o600)
        lines[account_id] = (f"streamelements_channel_id = {room_of(account_id)}\n"
                             f"streamelements_token_file = {path}\n")
    return f"[streamelements]\nastro_url = {astro.url}\napi_url = {astro.api_url}\n", lines


def ready(astro: AstroStandin, account_ids: Sequence[int]) -> bool:
    """Every account's socket holds both topics."""
    rooms = {room_of(a) for a in account_ids}
    return all(any(c.open and c.subscriptions.get(TIPS) == room and c.subscriptions.get(ACTIVITIES) == room
                   for c in astro.live()) for room in rooms)


class DemoTips:
    def __init__(self, astro: AstroStandin, account_ids: Sequence[int], rng: random.Random) -> None:
        self._astro = astro
        self._accounts = tuple(account_ids)
        self._rng = rng

    def play(self, cycle: int, count: Callable[[str], None], notice: Callable[[str], None], *,
             healed: bool = False) -> None:
        """One cycle's StreamElements items; `count(type)` for every row the daemon should store
        (`healed`: the daemon is away, and heals what no socket took from the history)."""
        a = self._accounts[cycle % len(self._accounts)]
        b = self._accounts[(cycle + 1) % len(self._accounts)]
        tip_id = uuid.uuid4().hex[:24]
        donor = self._rng.choice(_DONORS)
        amount = float(self._rng.choice((2, 5, 10, 25)))
        _, by_tips = self._astro.publish_counted(TIPS, room_of(a), tip_doc(
            tip_id, room_of(a), amount=amount, username=donor))
        _, by_activity = self._astro.publish_counted(ACTIVITIES, room_of(a), tip_activity_doc(
            uuid.uuid4().hex[:24], tip_id, room_of(a), amount=amount, username=donor))
        if by_tips or by_activity or healed:
            count("tip")
            notice(f"tip: {donor} tips {amount:g} EUR to account {a} (on both StreamElements topics)")
        _, reached = self._astro.publish_counted(ACTIVITIES, room_of(b), activity_doc(
            uuid.uuid4().hex[:24], room_of(b), "follow"))
        if reached or healed:
            count("activity.follow")
