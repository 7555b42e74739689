# The plugin loads through its pytest11 entry point (pip install -e .); nothing to add here.
# This file marks the repository root as pytest's rootdir for perf_tests/ and tests/.
