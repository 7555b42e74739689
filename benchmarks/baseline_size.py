"""How long the gate takes to check a large baseline, and that the size limit refuses one quickly.

Writes a valid baseline of about SIZE MB (one job, 12 runs, long step-sample lists), then times
  before: reading and validating it as before the limit (jsonio.read_json without a limit, store.parse),
  after:  Store.load, which refuses a file over MAX_BASELINE_BYTES from its size, before reading it.

    python -m benchmarks.baseline_size [SIZE_MB]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from pytest_distperf.fs import jsonio
from pytest_distperf.store.baselines import MAX_BASELINE_BYTES, BaselineReplaceable, Store, parse


def write_baseline(path: str, size_mb: float, key: str) -> None:
    per_run = int(size_mb * 1e6 / 12 / 16)  # about 16 bytes per sample in JSON ("0.100000123, ")
    samples = [[0.1 + i * 1e-9 for i in range(per_run)] for _ in range(12)]
    doc = {"format_version": 1, "test": key, "machine_class": "cpu-x", "machine": {}, "environment": {},
           "saved_at": "2026-01-01T00:00:00+00:00",
           "jobs": {"ddp tiny x2 cpu": {"config_hash": "h", "config": {}, "metrics": {"step_time": {
               "unit": "s", "direction": "lower", "kind": "time", "runs": [0.1] * 12, "samples": samples}}}}}
    with open(path, "w") as f:
        json.dump(doc, f)


def main(size_mb: float = 35.0) -> None:
    key = "t.py::test_big"
    with tempfile.TemporaryDirectory() as root:
        store = Store(root)
        path = store.path_for("cpu-x", key)
        os.makedirs(os.path.dirname(path))
        write_baseline(path, size_mb, key)
        print(f"baseline of {os.path.getsize(path) / 2**20:.1f} MiB (limit {MAX_BASELINE_BYTES / 2**20:g} MiB)")
        start = time.perf_counter()
        parse(jsonio.read_json(path), path)
        print(f"before (read + validate, no limit): {time.perf_counter() - start:.2f} s")
        start = time.perf_counter()
        try:
            store.load(path, key)
            print("after: loaded (under the limit)")
        except BaselineReplaceable as e:
            print(f"after (Store.load, refused): {(time.perf_counter() - start) * 1e3:.2f} ms: {e}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 35.0)
