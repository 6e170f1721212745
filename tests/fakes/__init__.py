"""The tests' names for the platform stand-ins, which live in `lumio_ingestd.devkit.standins`."""
