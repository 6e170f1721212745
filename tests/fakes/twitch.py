"""The tests' names for the stand-in Twitch (`lumio_ingestd.devkit.standins.twitch`)."""

from __future__ import annotations

from lumio_ingestd.devkit.standins.twitch import CONDITIONS, StandinError
from lumio_ingestd.devkit.standins.twitch import StandinSession as FakeSession
from lumio_ingestd.devkit.standins.twitch import TwitchStandin as FakeTwitch
from lumio_ingestd.devkit.standins.twitch_events import now_text

__all__ = ["CONDITIONS", "FakeSession", "FakeTwitch", "StandinError", "now_text"]
