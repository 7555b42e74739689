import os

# pytester points HOME at a fresh folder for every inner run, so DeepSpeed would JIT-build its ops
# (cpu_adam: a minute or more) again in each one. One build cache for the whole session:
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions"))

# The plugin loads torch only when a distperf test runs. pytester's in-process runs restore sys.modules
# afterwards, which would drop a torch first imported inside an inner run, and a second import of torch's
# extension in one process crashes it. Load the heavy side once, here, for the whole session.
import torch  # noqa: E402,F401

import pytest_distperf.fixture  # noqa: E402,F401
