"""The spool directory is created 0700 whatever the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from lumio_ingestd.metrics import Metrics
from lumio_ingestd.stores.spool import Spool


def test_the_spool_directory_is_created_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        spool = Spool(tmp_path / "state" / "spool", 1 << 20, Metrics())
        spool.open()
        spool.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "state" / "spool").stat().st_mode) == 0o700
