"""Code that runs inside a rank: the worker entry, the workload, the step timer, phases and host load."""
