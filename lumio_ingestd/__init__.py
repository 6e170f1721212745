"""lumio-ingestd: the ingest daemon of Lumio. Holds only the version."""

__version__ = "0.1.0"
