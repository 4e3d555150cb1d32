"""Memory of a real run: weights are mapped from the file, never copied, so the peak resident size
is the file's tensors + KV cache + arena (what `ember info --memory` plans) + the interpreter."""

import json
import subprocess
import sys

import pytest

from ember.hub import resolve_model

pytestmark = pytest.mark.model

RUN = """
import json, sys
import numpy

def high_water_mark():
    # VmHWM starts afresh at exec (ru_maxrss would include the parent's peak).
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

baseline = high_water_mark()
from ember.engine.runtime import Model
model = Model(sys.argv[1], n_ctx=512, n_threads=1)
for start in range(0, 480, 96):
    model.eval(list(range(start + 10, start + 106)))
print(json.dumps({"baseline": baseline, "peak": high_water_mark(),
                  **model.memory()}))
"""


def test_peak_rss_of_a_real_run_is_weights_plus_kv_plus_arena():
    path = resolve_model("smollm2-135m")
    result = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True, text=True, check=True)
    m = json.loads(result.stdout)
    planned = m["weights"] + m["kv_cache"] + m["arena"]
    assert m["total"] == planned
    # Every weight byte was read (the whole model ran), so the mapping is resident...
    assert m["peak"] >= m["baseline"] + m["weights"]
    # ...but nothing was copied: beyond the plan only the interpreter's imports and small buffers.
    assert m["peak"] <= m["baseline"] + planned + 32 * 2**20
