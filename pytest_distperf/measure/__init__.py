"""Numbers about runs: a job's figures, statistics, units and the wording of intervals. Pure Python, no torch."""
