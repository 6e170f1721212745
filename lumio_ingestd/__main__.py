"""`python -m lumio_ingestd`: the same program as the `lumio-ingestd` script."""

import sys

from lumio_ingestd.cli import main

if __name__ == "__main__":
    sys.exit(main())
