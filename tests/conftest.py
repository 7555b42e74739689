from __future__ import annotations

import importlib.util
import os

import pytest
from records import DDP_PERF_TEST

from pytest_distperf.strategies import ds_ops  # noqa: E402

# pytester points HOME at a fresh folder for every inner run, so DeepSpeed would JIT-build its ops
# (cpu_adam: a minute or more) again in each one. One build cache for the whole session: the folder torch
# builds in by default, which `build-ops` fills. (This conftest loads in any session that collects tests/,
# README's main job too: another folder here made every DeepSpeed offload job there build its op again.)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", ds_ops.cache_dir())

# The plugin loads torch only when a distperf test runs. pytester's in-process runs restore sys.modules
# afterwards, which would drop a torch first imported inside an inner run, and a second import of torch's
# extension in one process crashes it. Load the heavy side once, here, for the whole session.
import torch  # noqa: E402,F401

import pytest_distperf.fixture  # noqa: E402,F401


# No test of the plugin's own suite waits forever: one that hangs fails with its stack after this many seconds
# (pytest-timeout, signal method: the suite goes on) instead of stopping CI at its wall-clock limit with no word.
# The longest test takes about 100 s on the 2-core box. An explicit @pytest.mark.timeout wins.
TEST_TIMEOUT_SECONDS = 900


def pytest_collection_modifyitems(config, items):
    from pytest_distperf.launch.devices import visible_gpu_count

    gpus, nvml = visible_gpu_count(), importlib.util.find_spec("pynvml") is not None
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS, method="signal"))
        gpu = item.get_closest_marker("gpu")  # @pytest.mark.gpu(reason=..., nvml=True): `-m gpu` is the GPU suite
        if gpu is not None and (gpus == 0 or (gpu.kwargs.get("nvml") and not nvml)):
            needs = "a GPU and nvidia-ml-py" if gpu.kwargs.get("nvml") else "a GPU"
            item.add_marker(pytest.mark.skip(reason=f"needs {needs}: {gpu.kwargs['reason']}"))


# -- one real saved baseline for the whole session -----------------------------------------------------------------
# Several end-to-end tests only need "a saved baseline of the 2-rank DDP job" before they do what they test (compare
# against it, re-save beside it). Saving one takes over a minute on the 2-core box (8 runs: the adaptive budget), so
# it is saved once per test session, by a real `--distperf-save` session, and each test gets its own copy of the
# files (never the shared folder: a test writes next to, or over, its baselines).
#
# The job is records.DDP_PERF_TEST, the one text test_regression also writes beside the copied baseline and
# compares against (a different text would be a different configuration and read "not comparable").
# Saving records each job up to the adaptive budget (--distperf-max-repeats): 8 runs, so a verdict against it can
# call the injected slowdown on a busy box (tests/test_regression.py).
SAVED_JOB_OPTS = ("--distperf", "-p", "no:cacheprovider", "--distperf-max-repeats", "8")
SAVED_JOB_STEPS, SAVED_JOB_WARMUP, SAVED_JOB_RUNS = 6, 2, 8


class SavedBaseline:
    """The session's saved baseline of the DDP job: `test_perf.py::test_ddp`, steps 6, warmup 2, 8 runs."""

    nodeid = "test_perf.py::test_ddp"
    source = DDP_PERF_TEST
    steps, warmup, runs = SAVED_JOB_STEPS, SAVED_JOB_WARMUP, SAVED_JOB_RUNS

    def __init__(self, folder):
        self.folder = folder  # the saved baselines folder (read only: copy from it)

    def copy_to(self, root, test: str | None = None, runs: int | None = None):
        """Copy the saved file into `root`/baselines/<machine class>/, the path a save in `root` writes for `test`
        (default: the saved test). runs: keep the first this many runs of each metric, the file a save recording
        only that many runs would have written. Returns the copy's path."""
        import dataclasses
        from pathlib import Path

        from pytest_distperf.store.baselines import MetricSeries, Store

        [machine] = [p for p in self.folder.iterdir() if p.is_dir()]
        [path] = machine.glob("*.json")
        doc = Store(str(self.folder)).load(str(path), self.nodeid)
        assert doc is not None
        if runs is not None:
            assert runs <= self.runs
            for job in doc.jobs.values():
                job.metrics = {name: MetricSeries(m.unit, m.direction, m.kind, m.runs[:runs],
                                                  None if m.samples is None else m.samples[:runs])
                               for name, m in job.metrics.items()}
        doc = dataclasses.replace(doc, test=test or self.nodeid)
        return Path(Store(str(Path(root) / "baselines")).save(doc))


@pytest.fixture(scope="session")
def saved_ddp_baseline(tmp_path_factory) -> SavedBaseline:
    """A real `--distperf-save` session of the DDP job, run once per test session (in a subprocess: a fresh
    process, as a user's save runs)."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("saved")
    (root / "test_perf.py").write_text(DDP_PERF_TEST)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DP_", "GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "PYTEST_XDIST"))}
    out = subprocess.run([sys.executable, "-m", "pytest", *SAVED_JOB_OPTS, "--distperf-save", "test_perf.py",
                          f"--basetemp={root / 'basetemp'}"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    saved = SavedBaseline(root / "baselines")
    [machine] = [p for p in saved.folder.iterdir() if p.is_dir()]
    assert [p.name for p in machine.glob("*.json")] == ["test_perf--test_ddp.json"], out.stdout
    return saved
