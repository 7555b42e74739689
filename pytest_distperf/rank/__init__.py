"""Code that runs inside a rank: the worker entry, the workload, the step timer, phases, host load, the probes,
and the results a rank hands back."""
