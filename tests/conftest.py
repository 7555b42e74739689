import os

# pytester points HOME at a fresh folder for every inner run, so DeepSpeed would JIT-build its ops
# (cpu_adam: a minute or more) again in each one. One build cache for the whole session:
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions"))

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
    import pytest

    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS, method="signal"))
