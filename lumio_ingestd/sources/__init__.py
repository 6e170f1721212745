"""Platform sources: one thread per socket (see base.py)."""
