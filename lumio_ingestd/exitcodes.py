"""Process exit codes (sysexits), so systemd can tell a bad config from an outage."""

OK = 0
USAGE = 64  # EX_USAGE: the command line is wrong
DATAERR = 65  # EX_DATAERR: the data in Redis is not what it must be (nothing was changed)
NOINPUT = 66  # EX_NOINPUT: nothing matched what the command was asked to act on
UNAVAILABLE = 69  # EX_UNAVAILABLE: a required service is unavailable at start
SOFTWARE = 70  # EX_SOFTWARE: an internal error
TEMPFAIL = 75  # EX_TEMPFAIL: try again later (the running daemon holds the spool)
CONFIG = 78  # EX_CONFIG: the configuration is wrong (names file, section, key)
