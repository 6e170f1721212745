"""Bluesky Jetstream: frame decoding (frames.py) and the record/cursor store (store.py).

The socket side is `lumio_ingestd.sources.jetstream.JetstreamSource`.
"""
