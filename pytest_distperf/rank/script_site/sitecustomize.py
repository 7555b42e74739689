"""distperf's sitecustomize for a script job's processes (agents/script.py puts this folder first on PYTHONPATH).

In the process that runs the job's script (whichever launcher started it: torchrun, deepspeed, accelerate, or
Lightning re-running the script for its other ranks), it installs the step watch (rank/script_steps.py) before the
script's first line; every other process (the launcher, its helpers) is left alone. Then the sitecustomize this
one hides, where the environment has one, runs as it would have.
"""

import os
import sys


def _watch_this_script() -> None:
    script = os.environ.get("DISTPERF_SCRIPT")
    argv0 = sys.argv[0] if getattr(sys, "argv", None) else ""
    if not script or not argv0 or os.path.realpath(argv0) != script:
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if root not in sys.path:
        sys.path.append(root)
    from pytest_distperf.rank import script_steps

    script_steps.install(os.environ["DISTPERF_SCRIPT_JOB"])


def _run_hidden_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_watch_this_script()
_run_hidden_sitecustomize()
