"""The tests' names for the stand-in Kick (`lumio_ingestd.devkit.standins.kick`)."""

from __future__ import annotations

from lumio_ingestd.devkit.standins.kick import KickStandin as FakeKick
from lumio_ingestd.devkit.standins.kick import PusherConnection, now_text, pusher_chat, user, webhook_chat

__all__ = ["FakeKick", "PusherConnection", "now_text", "pusher_chat", "user", "webhook_chat"]
