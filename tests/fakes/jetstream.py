"""The tests' names for the stand-in Jetstream (`lumio_ingestd.devkit.standins.jetstream`)."""

from __future__ import annotations

from lumio_ingestd.devkit.standins.jetstream import ConnectionLog, account, commit, identity, tid
from lumio_ingestd.devkit.standins.jetstream import JetstreamStandin as FakeJetstream
from lumio_ingestd.devkit.standins.jetstream import StandinEvent as FakeEvent

__all__ = ["ConnectionLog", "FakeEvent", "FakeJetstream", "account", "commit", "identity", "tid"]
