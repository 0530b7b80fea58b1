"""What a serving process (bookie, broker) does once its start-up is done: the collector freezes what start-up made
and collects the young generation less often (cli/bookie_cmd.settle_collector). Run in a child interpreter, so
the test process's own collector is left as it is."""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
from bksim.cli import bookie_cmd
before = (gc.get_freeze_count(), gc.get_threshold())
bookie_cmd.settle_collector()
print(json.dumps([before, [gc.get_freeze_count(), gc.get_threshold()]]))
"""


def test_settling_freezes_the_start_up_objects_and_raises_the_young_threshold():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    (frozen_before, threshold_before), (frozen_after, threshold_after) = json.loads(out.stdout)
    assert frozen_before == 0 and threshold_before[0] == 700  # Python's defaults
    assert frozen_after > 10_000  # the modules bookie_cmd imports: their functions, classes, dicts
    from bksim.cli.bookie_cmd import GC_GEN0_THRESHOLD
    assert threshold_after == [GC_GEN0_THRESHOLD, 20, 20]
