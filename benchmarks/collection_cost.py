"""What loading the plugin costs a pytest run that does not use it, printed as figures.

One unrelated test in a fresh folder, collected by a fresh `python -m pytest --collect-only -q` process with the
plugin loaded through its entry point (as an installed package is) and with `-p no:distperf`, in interleaved
rounds (ABBA, so drift on the machine cancels). Target: the plugin within 10 % of the run without it.

    python benchmarks/collection_cost.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def collect_seconds(folder: Path, extra: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
                   cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_unrelated.py").write_text("def test_unrelated():\n    assert 1 + 1 == 2\n")
        collect_seconds(folder, [])  # warm the file cache once
        plugin: list[float] = []
        without: list[float] = []
        for i in range(args.rounds):
            order = [(plugin, []), (without, ["-p", "no:distperf"])]
            for times, extra in (order if i % 2 == 0 else order[::-1]):
                times.append(collect_seconds(folder, extra))
    with_plugin, no_plugin = statistics.median(plugin), statistics.median(without)
    print(f"collecting one unrelated test, {args.rounds} interleaved rounds (median wall time of a fresh pytest):")
    print(f"  with the plugin      {with_plugin * 1e3:7.0f} ms  (range {min(plugin) * 1e3:.0f} - {max(plugin) * 1e3:.0f})")
    print(f"  -p no:distperf       {no_plugin * 1e3:7.0f} ms  (range {min(without) * 1e3:.0f} - {max(without) * 1e3:.0f})")
    print(f"  the plugin adds {with_plugin / no_plugin - 1:+.1%}  (target <= +10 %)")


if __name__ == "__main__":
    main()
