"""What a job is and what a user hands in: the job spec, settings, user jobs, the workload interface."""
