"""A worker process sets its garbage collector once it is set up (``settle_gc``): what
exists by then is frozen out of later collections and the young generation is collected
less often. In a fresh process, so the test run's own collector is left alone."""

from __future__ import annotations

import json
import subprocess
import sys

from printery.base._util import GC_YOUNG_THRESHOLD

PROBE = """
import gc, json
from printery.base._util import settle_gc
before = gc.get_freeze_count()
settle_gc()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                  "threshold": gc.get_threshold(), "enabled": gc.isenabled()}))
"""


def test_settle_gc_freezes_what_exists_and_raises_the_young_threshold() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    seen = json.loads(out)
    assert seen["before"] == 0 and seen["frozen"] > 1000
    assert seen["threshold"][0] == GC_YOUNG_THRESHOLD and seen["enabled"]
