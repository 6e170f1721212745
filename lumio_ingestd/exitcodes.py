"""Process exit codes (sysexits), so systemd can tell a bad config from an outage."""

OK = 0
USAGE = 64  # EX_USAGE: the command line is wrong
UNAVAILABLE = 69  # EX_UNAVAILABLE: a required service is unavailable at start
SOFTWARE = 70  # EX_SOFTWARE: an internal error
CONFIG = 78  # EX_CONFIG: the configuration is wrong (names file, section, key)
