"""Numbers about runs: the statistics core and units. Pure Python, no torch."""
