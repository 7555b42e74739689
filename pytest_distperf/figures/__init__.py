"""One definition of each reported quantity of a run and a job, statistics, units and the wording of intervals.
Pure Python, no torch."""
